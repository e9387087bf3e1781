"""The layers stay apart (DESIGN sec. 3).

* Direction: every import of every module (read from its source, so lazy imports inside functions
  count too) goes down the layers, never up or sideways, but for the commented ALLOWED pairs;
* ``attnspec.ops`` and ``attnspec.nn`` (kernels, modules) import no pydantic, PyYAML or lark;
* loading a build directory imports neither the spec front-ends (PyYAML, lark) nor rich;
* ``attnspec check`` imports no torch;
* the compiler draws nothing: rich is imported by the CLI only.

The run-time checks run in a fresh interpreter and inspect sys.modules.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SPECS

LAYERS = {
    # bottom up: a module may import its own package and the layers below it (DESIGN's numbers; inside
    # layer 0, errors < io < tokenizer_worker < figures, tokenizer)
    "attnspec.errors": 0, "attnspec.io": 0.1, "attnspec.tokenizer_worker": 0.15, "attnspec.figures": 0.2,
    "attnspec.tokenizer": 0.2,
    "attnspec.spec": 1, "attnspec.grammars": 1,
    "attnspec.ops": 2,
    "attnspec.nn": 3,
    "attnspec.compiler": 4,
    "attnspec.training": 5,
    "attnspec.ablation": 6, "attnspec.diagnostics": 6, "attnspec.interop": 6,
    "attnspec.hf": 6.5,  # the `attnspec` model type for transformers' Auto classes: reads interop's file checks
    "attnspec.cli": 7, "attnspec.__main__": 7,
    "attnspec": 7,  # the facade (attnspec.build, .load, .train, ...): the top, for users
}
SAME_PACKAGE = {"attnspec.__main__": "attnspec.cli"}
"""Modules that are parts of another entry: ``python -m attnspec``."""
ALLOWED = {
    # `attnspec diagnose RUNS_DIR` labels a sweep's finished runs: the runs directory's format is the
    # ablation package's, read here, never written
    ("attnspec.diagnostics.subject", "attnspec.ablation.runsdir"),
}


def _package(module: str) -> str:
    """The entry of LAYERS that ``module`` belongs to (the longest prefix)."""
    name = max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len)
    return SAME_PACKAGE.get(name, name)


def _module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path, module: str):
    """(imported attnspec module, line) for every import statement in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names]
        else:
            continue
        for name in names:
            if name == "attnspec" or name.startswith("attnspec."):
                yield name, node.lineno


def test_imports_go_down_the_layers():
    wrong = []
    for path in sorted((ROOT / "attnspec").rglob("*.py")):
        module = _module_name(path)
        source = _package(module)
        for target, line in _imports(path, module):
            destination = _package(target)
            upward = LAYERS[destination] > LAYERS[source]
            sideways = LAYERS[destination] == LAYERS[source] and destination != source
            if (upward or sideways) and (module, target) not in ALLOWED:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} (layer {LAYERS[source]}) imports {target} "
                             f"(layer {LAYERS[destination]})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_module_imports_itself_through_others():
    """No import cycles between attnspec's modules (lazy imports count): one job per module, each
    readable on its own. Tarjan's strongly connected components of the import graph."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "attnspec").rglob("*.py")):
        module = _module_name(path)
        graph[module] = {target for target, _ in _imports(path, module) if target != module}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)


def test_every_allowed_exception_is_still_needed():
    found = {(module, target) for path in (ROOT / "attnspec").rglob("*.py")
             for module in [_module_name(path)] for target, _ in _imports(path, module)}
    assert ALLOWED <= found, ALLOWED - found


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from attnspec.cli import main\n    import attnspec.training.loop\n")
    assert [name for name, _ in _imports(source, "attnspec.spec.probe")] == ["attnspec.cli", "attnspec.training.loop"]


FRONT_END = ["yaml", "lark", "attnspec.spec.yaml_front", "attnspec.spec.attn_front", "attnspec.spec.load"]


def imported_after(code: str) -> set[str]:
    """The modules loaded after running ``code`` in a fresh interpreter (at exit, so lazy imports count)."""
    script = ("import atexit, json, sys\n"
              "atexit.register(lambda: print('MODULES=' + json.dumps(sorted(sys.modules))))\n" + code)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    line = next((line for line in result.stdout.splitlines() if line.startswith("MODULES=")), None)
    assert line is not None, result.stdout[-2000:] + result.stderr[-2000:]
    return set(json.loads(line[len("MODULES="):]))


@pytest.mark.parametrize("package", ["attnspec.ops", "attnspec.nn"])
def test_kernels_and_modules_import_no_spec_layer(package):
    modules = imported_after(f"import {package}")
    assert not {"pydantic", "yaml", "lark"} & modules, sorted({"pydantic", "yaml", "lark"} & modules)


def test_check_imports_no_torch():
    modules = imported_after("import sys\nfrom attnspec.cli import main\n"
                             "sys.argv = ['attnspec', 'check', 'specs/gateloop.yaml', 'specs/hybrid.yaml']\n"
                             "try:\n    main()\nexcept SystemExit:\n    pass\n")
    assert "torch" not in modules
    assert "attnspec.spec.yaml_front" in modules  # the check did run


@pytest.mark.slow
def test_loading_a_build_directory_imports_no_front_end_and_no_rich(tmp_path):
    from attnspec.compiler.build import build_directory

    directory = tmp_path / "build"
    build_directory(ROOT / "specs" / "linear-elu.yaml", directory, compile_check=False,
                    overrides=["d_model=16", "layers[0].repeat=1", "max_len=64"])
    modules = imported_after(f"import attnspec\nmodel = attnspec.load({str(directory)!r})\nprint(len(model.blocks))")
    assert "torch" in modules and "attnspec.compiler.load" in modules
    assert not (set(FRONT_END) | {"rich"}) & modules, sorted((set(FRONT_END) | {"rich"}) & modules)


@pytest.mark.slow
def test_the_run_path_imports_no_compiler(tmp_path):
    """``attnspec run DIR`` (the size check on the meta device, the load, a greedy generation) and the size check
    of every shipped spec import no ``torch._dynamo``: 2-4 s of a command that compiles nothing. GateLoop's
    initialisers do meta arithmetic that torch runs through its Python reference kernels."""
    from attnspec.compiler.build import build_directory

    directory = tmp_path / "build"
    build_directory(ROOT / "specs" / "gateloop.yaml", directory, compile_check=False, calibrate=False, programs=(),
                    overrides=["d_model=16", "layers[0].repeat=1", "max_len=64"])
    modules = imported_after("from attnspec.cli import main\nimport sys\n"
                             f"sys.argv = ['attnspec', 'run', {str(directory)!r}, '--tokens', '1 2 3', '--generate', '3']\n"
                             "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n")
    assert "attnspec.compiler.runner" in modules and "torch._dynamo" not in modules
    modules = imported_after("from attnspec.spec import load_spec\nfrom attnspec.compiler.sizes import check_model_size\n"
                             f"for path in {[str(path) for path in SPECS]!r}:\n    check_model_size(load_spec(path, ()))\n"
                             "import torch._refs\n"
                             "assert not hasattr(torch._refs.sub.__wrapped__.__wrapped__, '__dynamo_disable')\n")
    assert "attnspec.compiler.sizes" in modules and "torch._dynamo" not in modules


def test_the_compiler_stand_in_gives_way_to_the_real_one():
    """Inside ``meta_values_skipped`` anything of ``torch._dynamo`` but ``disable`` imports the real module; after it,
    ``torch.compile`` traces torch's reference kernels as torch does (their cached answers taken back)."""
    code = ("import sys, torch\nfrom attnspec.nn.model import meta_values_skipped\n"
            "with torch.device('meta'), meta_values_skipped():\n    1 - torch.empty(3)\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "with torch.device('meta'), meta_values_skipped():\n    import torch._dynamo\n    torch._dynamo.config\n"
            "assert type(sys.modules['torch._dynamo']).__name__ == 'module'\n"
            "assert torch.compile(lambda x: 1 - x, fullgraph=True)(torch.ones(2)).tolist() == [0.0, 0.0]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # a submodule imported inside (a plugin's constructor might): the real one, under the real package
    code = ("import sys, torch\nfrom attnspec.nn.model import meta_values_skipped\n"
            "with torch.device('meta'), meta_values_skipped():\n    import torch._dynamo.utils as utils\n"
            "assert utils is sys.modules['torch._dynamo.utils'] and type(sys.modules['torch._dynamo']).__name__ == 'module'\n"
            "assert not any(type(finder).__name__ == '_DynamoStandIn' for finder in sys.meta_path)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_compiler_does_not_draw():
    for path in (ROOT / "attnspec" / "compiler").glob("*.py"):
        text = path.read_text()
        assert "import rich" not in text and "from rich" not in text, path


def test_a_sweep_s_results_are_data_without_matplotlib():
    """The report's aggregation (attnspec.ablation.results) is testable without the renderer."""
    modules = imported_after("from attnspec.ablation.results import collect, summary_rows")
    assert "matplotlib" not in modules and "attnspec.ablation.report" not in modules
