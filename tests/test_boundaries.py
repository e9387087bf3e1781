"""The layers stay apart (DESIGN sec. 2): each check runs in a fresh interpreter and inspects sys.modules.

* ``attnspec.ops`` and ``attnspec.nn`` (kernels, modules) import no pydantic, PyYAML or lark;
* loading a build directory imports neither the spec front-ends (PyYAML, lark) nor rich;
* ``attnspec check`` imports no torch;
* the compiler draws nothing: rich is imported by the CLI only.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

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


def test_the_compiler_does_not_draw():
    for path in (ROOT / "attnspec" / "compiler").glob("*.py"):
        text = path.read_text()
        assert "import rich" not in text and "from rich" not in text, path
