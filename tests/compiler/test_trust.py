"""Build directories received from someone else: every crafted one is refused, none runs anything.

Each case copies one real build, tampers with it as an attacker or an accident would and, where an
attacker would, recomputes the manifest's hashes (the manifest sits in the same directory, so the
hashes prove integrity, not authenticity). ``attnspec run`` (manifest, programs) and
``attnspec.load`` (manifest, spec, weights) must then raise BuildError, never another exception,
and no pickled payload may run: the payloads below would create a marker file.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnspec
from attnspec.compiler.build import build_directory
from attnspec.compiler.manifest import sha256
from attnspec.compiler.runner import run_directory
from attnspec.errors import BuildError
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: proof of code execution if the marker appears."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("trust") / "base"
    build_directory(ROOT / "specs" / "linear-elu.yaml", directory, compile_check=False,
                    overrides=["d_model=16", "layers[0].repeat=1", "max_len=64"])
    return directory


def fix_hashes(directory: Path) -> None:
    """Recompute size and sha256 of every listed regular file, as an attacker can."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    for name, entry in manifest.get("files", {}).items():
        target = directory / name
        if target.is_file() and not target.is_symlink():
            entry.update(sha256=sha256(target), bytes=target.stat().st_size)
    path.write_text(json.dumps(manifest))


def edit_manifest(change):
    def mutate(directory: Path) -> None:
        path = directory / "manifest.json"
        data = json.loads(path.read_text())
        path.write_text(json.dumps(change(data)))
    return mutate


def rewrite_zip(path: Path, replace: dict[str, bytes | None] | None = None, add: dict[str, bytes] | None = None):
    """Rewrite the zip at ``path``: entries ending with a key of ``replace`` get its bytes (None drops them)."""
    entries = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            data = archive.read(info)
            for suffix, new in (replace or {}).items():
                if info.filename.endswith(suffix):
                    data = new
            if data is not None:
                entries.append((info.filename, data))
    root = entries[0][0].split("/")[0]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries:
            archive.writestr(name, data)
        for name, data in (add or {}).items():
            archive.writestr(f"{root}/{name}", data)


def pickled(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker))


def weights_edit(change):
    def mutate(directory: Path) -> None:
        tensors = load_file(str(directory / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(directory / "model.safetensors"))
    return mutate


def use_pickle_weight(marker: Path):
    def mutate(directory: Path) -> None:
        path = directory / "model.pt2"
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("_weights_config.json"))
            config = json.loads(archive.read(name))
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        rewrite_zip(path, {name.split("/", 1)[1]: json.dumps(config).encode(),
                           f"weights/{first['path_name']}": pickled(marker)})
    return mutate


def legacy_format(marker: Path):
    def mutate(directory: Path) -> None:
        with zipfile.ZipFile(directory / "model.pt2", "w") as archive:
            archive.writestr("version", "8.0.0")
            archive.writestr("serialized_exported_program.json", "{}")
            archive.writestr("serialized_state_dict.pt", pickled(marker))
            archive.writestr("serialized_constants.pt", pickled(marker))
            archive.writestr("serialized_example_inputs.pt", pickled(marker))
    return mutate


def symlink_to_copy(name: str):
    def mutate(directory: Path) -> None:
        outside = directory.parent / f"outside-{name}"
        shutil.copy(directory / name, outside)
        (directory / name).unlink()
        (directory / name).symlink_to(outside)
    return mutate


def write(name: str, data: bytes):
    def mutate(directory: Path) -> None:
        (directory / name).write_bytes(data)
    return mutate


def truncate(name: str, keep: int):
    def mutate(directory: Path) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[:keep])
    return mutate


def remove(name: str):
    return lambda directory: (directory / name).unlink()


def swap(a: str, b: str):
    def mutate(directory: Path) -> None:
        first, second = (directory / a).read_bytes(), (directory / b).read_bytes()
        (directory / a).write_bytes(second)
        (directory / b).write_bytes(first)
    return mutate


def other_spec(directory: Path) -> None:
    """Another valid spec in the manifest (what load builds): the weights do not fit it."""
    from attnspec.spec import load_spec, spec_to_data

    edit_manifest(lambda m: {**m, "spec": spec_to_data(load_spec(ROOT / "specs" / "gateloop.yaml"), minimal=False)})(
        directory)


def fifo(name: str):
    def mutate(directory: Path) -> None:
        (directory / name).unlink()
        os.mkfifo(directory / name)
    return mutate


def edit_graph(change, program: str = "model.pt2"):
    """Rewrite the serialized graph (models/*.json) of ``program`` with ``change(graph)``."""
    def mutate(directory: Path) -> None:
        path = directory / program
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if "/models/" in n)
            graph = json.loads(archive.read(name))
        change(graph)
        rewrite_zip(path, {name.split("/", 1)[1]: json.dumps(graph).encode()})
    return mutate


def _shell(marker: Path) -> str:
    return f"__import__('os').system('touch {marker}')"


def first_expression(text: str):
    """A graph change: the first symbolic size (``expr_str``) becomes ``text``."""
    def change(graph: dict) -> None:
        stack = [graph]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                if "expr_str" in value:
                    value["expr_str"] = text
                    return
                stack.extend(value.values())
            elif isinstance(value, list):
                stack.extend(value)
    return change


def poison_expression(marker: Path):
    """The audit's finding: sympy.sympify evaluates every ``expr_str`` as Python."""
    return edit_graph(first_expression(_shell(marker)))


huge_power = first_expression("Pow(Integer(10), Integer(10000000000))")
"""Allowed tokens only, but sympy computes 10**(10**10): ``run --programs`` spun in sympify."""


def poison_target(target: str):
    def change(graph: dict) -> None:
        node = next(n for n in graph["graph_module"]["graph"]["nodes"] if n["target"].startswith("torch.ops.aten"))
        node["target"] = target
    return edit_graph(change)


def nan_weight(tensors):
    tensors["embed.weight"][0, 0] = float("nan")


def cases(marker: Path):
    """(id, mutation, recompute hashes, who must refuse it).

    "both": every reader; "run": the programs and the manifest's decoding fields, which only ``run
    --programs`` reads; "load": the weights and the plan's modes, which ``attnspec.load`` and a plain
    ``run`` read and ``run --programs`` never does (it runs the intact programs). ``spec.yaml`` is
    for people and rebuilds: nothing loads it, and a changed one
    fails its hash ("wrong-hash").
    """
    return [
        ("manifest-missing", remove("manifest.json"), False, "both"),
        ("manifest-list", write("manifest.json", b"[1, 2]"), False, "both"),
        ("manifest-garbage", write("manifest.json", b"\x89PNG\x00\xff"), False, "both"),
        ("manifest-nan", write("manifest.json", b'{"format": NaN}'), False, "both"),
        ("manifest-deep", write("manifest.json", b"[" * 100_000), False, "both"),
        ("manifest-huge", write("manifest.json", b" " * (2 << 20) + b"{}"), False, "both"),
        ("manifest-dir", lambda d: ((d / "manifest.json").unlink(), (d / "manifest.json").mkdir()), False, "both"),
        ("manifest-symlink", symlink_to_copy("manifest.json"), False, "both"),
        ("no-files-table", edit_manifest(lambda m: {k: v for k, v in m.items() if k != "files"}), False, "both"),
        ("empty-files-table", edit_manifest(lambda m: {**m, "files": {}}), False, "both"),
        ("files-without-model", edit_manifest(lambda m: {**m, "files": {k: v for k, v in m["files"].items()
                                                                        if k != "model.pt2"}}), False, "both"),
        ("file-outside", edit_manifest(lambda m: {**m, "files": {**m["files"], "../../etc/hostname":
                                                                 m["files"]["spec.yaml"]}}), False, "both"),
        ("file-absolute", edit_manifest(lambda m: {**m, "files": {**m["files"], "/etc/hostname":
                                                                  m["files"]["spec.yaml"]}}), False, "both"),
        ("format-1", edit_manifest(lambda m: {**m, "format": 1}), False, "both"),
        ("unknown-key", edit_manifest(lambda m: {**m, "run_this": "rm -rf /"}), False, "both"),
        ("wrong-type", edit_manifest(lambda m: {**m, "parameters": "many"}), False, "both"),
        ("plan-mode", edit_manifest(lambda m: {**m, "plan": {**m["plan"], "layers": [
            {**m["plan"]["layers"][0], "full_mode": "foo"}]}}), False, "both"),
        ("plan-length", edit_manifest(lambda m: {**m, "plan": {**m["plan"], "layers": m["plan"]["layers"] * 3}}),
         False, "load"),
        ("step-without-file", edit_manifest(lambda m: {**m, "files": {k: v for k, v in m["files"].items()
                                                                      if k != "step.pt2"}}), False, "both"),
        ("wrong-hash", write("spec.yaml", b"name: changed\n"), False, "both"),
        ("weights-missing", remove("model.safetensors"), False, "both"),
        ("weights-garbage", write("model.safetensors", b"\xff" * 64), True, "load"),
        ("weights-truncated", truncate("model.safetensors", 100), True, "load"),
        ("weights-wrong-shape", weights_edit(lambda t: t.update({"embed.weight": torch.zeros(3, 3)})), True, "load"),
        ("weights-float64", weights_edit(lambda t: t.update({"embed.weight": t["embed.weight"].double()})), True,
         "load"),
        ("weights-int64", weights_edit(lambda t: t.update({"embed.weight": t["embed.weight"].long()})), True, "load"),
        ("weights-nan", weights_edit(nan_weight), True, "load"),
        ("weights-extra", weights_edit(lambda t: t.update({"extra": torch.zeros(2)})), True, "load"),
        ("weights-missing-tensor", weights_edit(lambda t: t.pop("embed.weight")), True, "load"),
        ("weights-symlink", symlink_to_copy("model.safetensors"), False, "both"),
        # `run --programs` derives the decode limit and the step's state from the spec, never from the
        # manifest's own fields, so it reads the spec too
        ("spec-other", other_spec, True, "both"),
        ("spec-invalid", edit_manifest(lambda m: {**m, "spec": {**m["spec"], "layers": [{"mixer": "rleu"}]}}),
         False, "both"),
        ("decode-limit-edited", edit_manifest(lambda m: {**m, "decode_limit": 4}), False, "both"),
        ("state-signature-edited", edit_manifest(lambda m: {**m, "export": {**m["export"], "step.pt2": {
            "state": [{"shape": [1 << 20, 1 << 20], "dtype": "float32"}]}}}), False, "both"),
        ("spec-not-a-mapping", edit_manifest(lambda m: {**m, "spec": ["name", "t"]}), False, "both"),
        ("spec-fifo", fifo("spec.yaml"), False, "both"),
        ("program-garbage", write("model.pt2", b"PK\x03\x04 not a zip"), True, "run"),
        ("program-truncated", truncate("model.pt2", 3000), True, "run"),
        ("program-pickled-inputs", lambda d: rewrite_zip(d / "model.pt2", {"sample_inputs/model.pt":
                                                                           pickled(marker)}), True, "run"),
        ("program-pickled-weight", use_pickle_weight(marker), True, "run"),
        ("program-legacy-pickle", legacy_format(marker), True, "run"),
        ("program-native-code", lambda d: rewrite_zip(d / "model.pt2", add={"data/aotinductor/model/x.so": b"\x7fELF"}),
         True, "run"),
        ("program-opaque-constant", lambda d: rewrite_zip(d / "model.pt2", add={
            "data/constants/opaque_obj_0": pickled(marker)}), True, "run"),
        ("programs-swapped", swap("model.pt2", "step.pt2"), True, "run"),
        ("program-expression-runs-python", poison_expression(marker), True, "run"),
        ("program-expression-huge-power", edit_graph(huge_power), True, "run"),
        ("program-guard-code", edit_graph(lambda g: g.update(guards_code=[_shell(marker)])), True, "run"),
        ("step-guard-code", edit_graph(lambda g: g.update(guards_code=[_shell(marker)]), "step.pt2"), True, "run"),
        ("program-calls-torch-load", poison_target("torch.serialization.load"), True, "run"),
        ("program-calls-os", poison_target("torch.os.system"), True, "run"),
        ("program-graph-deep", lambda d: rewrite_zip(d / "model.pt2", {"models/model.json": b"[" * 100_000}), True,
         "run"),
    ]


CASE_IDS = [case[0] for case in cases(Path("marker"))]


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_crafted_build_directory_is_refused(base, tmp_path, case_id):
    marker = tmp_path / "PWNED"
    _, mutate, recompute, refused_by = next(c for c in cases(marker) if c[0] == case_id)
    directory = tmp_path / "crafted"
    shutil.copytree(base, directory, symlinks=True)
    mutate(directory)
    if recompute:
        fix_hashes(directory)
    # `run --programs` reads the programs; `attnspec.load` and a plain `run` the spec and weights only
    if refused_by in ("both", "run"):
        with pytest.raises(BuildError):
            run_directory(directory, "1 2 3", generate=2, programs=True)
    else:
        run_directory(directory, "1 2 3", generate=2, programs=True)
    for read_spec_and_weights in (lambda: attnspec.load(directory), lambda: run_directory(directory, "1 2 3", 2)):
        if refused_by in ("both", "load"):
            with pytest.raises(BuildError):
                read_spec_and_weights()
        else:
            read_spec_and_weights()
    assert not marker.exists(), "a pickled payload ran"


def test_there_are_at_least_30_crafted_directories():
    assert len(CASE_IDS) >= 45


def test_the_pickled_inputs_payload_would_run_under_plain_torch_export_load(base, tmp_path):
    # The control experiment: without attnspec's checks, torch.export.load runs the payload.
    marker = tmp_path / "PWNED"
    directory = tmp_path / "crafted"
    shutil.copytree(base, directory)
    rewrite_zip(directory / "model.pt2", {"sample_inputs/model.pt": pickled(marker)})
    code = f"import torch\ntry:\n    torch.export.load({str(directory / 'model.pt2')!r})\nexcept Exception:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert marker.exists()


def test_the_expression_payload_would_run_under_plain_torch_export_load(base, tmp_path):
    # The control experiment for `expr_str`: plain torch.export.load evaluates it as Python.
    marker = tmp_path / "PWNED"
    directory = tmp_path / "crafted"
    shutil.copytree(base, directory)
    poison_expression(marker)(directory)
    code = f"import torch\ntry:\n    torch.export.load({str(directory / 'model.pt2')!r})\nexcept Exception:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert marker.exists()


def test_the_expression_grammar_admits_what_torch_writes_and_nothing_else():
    from attnspec.compiler.archive import is_safe_expression, is_safe_guard

    for text in ["Symbol('s71', positive=True, integer=True)", "Mul(Integer(128), Symbol('s71', positive=True))",
                 "FloorDiv(Add(Symbol('s71', integer=True), Integer(127)), Integer(64))", "s0 + 128", "Max(1, s0*2)",
                 "Add(Mul(Integer(-1), Symbol('s71')), Integer(3))"]:
        assert is_safe_expression(text), text
    for text in ["Pow(Symbol('s71', positive=True, integer=True), Integer(2))", "s0**2", "(s0 + 1)**2",  # squares
                 "Pow(Max(Integer(1), FloorDiv(Add(Symbol('s71', positive=True, integer=True), Integer(-1)), "
                 "Integer(64))), Integer(2))"]:  # sliding-window-hybrid's model.pt2 holds this one
        assert is_safe_expression(text), text
    for text in ["LessThan(Symbol('u1', integer=True), Integer(1568))",  # a step's unbacked read lengths
                 "GreaterThan(Symbol('u0', integer=True), Integer(1))",
                 "Equality(Add(Symbol('u0', integer=True), Max(Integer(0), Add(Symbol('u1', integer=True), "
                 "Mul(Integer(-1), Min(Integer(1568), Symbol('u0', integer=True)))))), Symbol('u1', integer=True))"]:
        assert is_safe_expression(text), text
    for text in ["__import__('os')", "s0.__class__", "Symbol('x').subs", "eval('1')", "lambda: 0", "s0[0]",
                 "Symbol('s0'); 1", "(" * 100 + "s0" + ")" * 100, "Integer(1)(", 3, None, "open",
                 # allowed tokens, unbounded arithmetic: sympy would compute these numbers
                 "Pow(Integer(10), Integer(10000000000))", "10**10000000000", "s0**100", "(s0**2)**2",
                 "Pow(Pow(Symbol('s0'), Integer(16)), Integer(16))", "Pow(Symbol('s0'), Symbol('s1'))"]:
        assert not is_safe_expression(text), text
    assert is_safe_guard("L['token'].size()[0] == L['state'][0].size()[0]")
    assert is_safe_guard("(L['a'].size()[1] + 1) // 2 >= 3 and L['b'].stride()[0] == 1")
    for text in ["L['a'].__class__", "__import__('os').system('x')", "L['a'].size()[0] == open('x')", "L.x", "f()"]:
        assert not is_safe_guard(text), text


def test_cli_refuses_crafted_directories_with_exit_2(base, tmp_path):
    marker = tmp_path / "PWNED"
    directory = tmp_path / "crafted"
    shutil.copytree(base, directory)
    rewrite_zip(directory / "model.pt2", {"sample_inputs/model.pt": pickled(marker)})
    fix_hashes(directory)
    for command in (["run", str(directory), "--tokens", "1 2", "--programs"], ["verify", str(directory / "missing")]):
        result = subprocess.run([sys.executable, "-m", "attnspec", *command], capture_output=True, text=True,
                                timeout=300, cwd=ROOT)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and "error:" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("programs", [False, True])
def test_one_token_prompt_runs_as_one_token(base, programs):
    text = run_directory(base, "9", generate=1, programs=programs)
    lines = dict(line.split(": ", 1) for line in text.splitlines())
    assert lines["input"] == "9"
    assert lines["next token (argmax)"] == lines["generated"]  # the full sequence and the step agree
    model = attnspec.load(base)
    with torch.no_grad():
        expected = int(model(torch.tensor([[9]]))[0, -1].argmax())
    assert int(lines["next token (argmax)"]) == expected


def test_run_and_run_programs_print_the_same_tokens(base):
    assert run_directory(base, "3 1 4 1 5", generate=6) == run_directory(base, "3 1 4 1 5", generate=6, programs=True)


@pytest.mark.parametrize("tokens", ["99999999999999999999999", "-1", "1 x", "", "512", "1.5"])
def test_bad_tokens_are_attnspec_errors(base, tokens):
    from attnspec.errors import AttnSpecError

    with pytest.raises(AttnSpecError):
        run_directory(base, tokens)


def test_load_takes_the_manifest_plan_without_planning(base, monkeypatch):
    import attnspec.compiler.plan as plan

    monkeypatch.setattr(plan, "plan_spec", lambda *a, **k: pytest.fail("load planned again"))
    model = attnspec.load(base)
    manifest = json.loads((base / "manifest.json").read_text())
    assert [b.mixer.mode for b in model.blocks] == [layer["full_mode"] for layer in manifest["plan"]["layers"]]


def test_package_source_never_unpickles():
    # torch.load only with weights_only=True, no pickle module, no YAML loader that builds objects.
    import re

    sources = list((ROOT / "attnspec").rglob("*.py"))
    assert len(sources) > 20
    for path in sources:
        text = path.read_text()
        for line in text.splitlines():
            if "torch.load(" in line and not line.lstrip().startswith(("#", '"', "``")):
                assert "weights_only=True" in line, (path, line)
        assert not re.search(r"^\s*(import pickle|from pickle|import dill|import cloudpickle)", text, re.M), path
        assert not re.search(r"yaml\.(load|unsafe_load|full_load)\(|yaml\.(Unsafe|Full)?Loader\b", text), path


def test_a_checked_load_gives_the_program_a_plain_load_gives(base):
    """load_program memoizes two of torch's repeated computations while it deserializes (archive.py):
    the program is the one ``torch.export.load`` gives (graph, signature, ranges, outputs), and torch's
    own functions are back in place afterwards."""
    from torch._export.serde import serialize

    from attnspec.compiler.archive import load_program

    parse, typing_module = serialize.GraphModuleDeserializer._parse_sym_expr, serialize.typing
    model = attnspec.load(base)
    tokens = torch.randint(0, model.spec.input.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0))
    for name in ("model.pt2", "prefill.pt2", "step.pt2"):
        ours, plain = load_program(base / name), torch.export.load(str(base / name))
        assert ours.graph_module.code == plain.graph_module.code, name
        assert str(ours.graph_signature) == str(plain.graph_signature), name
        assert ours.range_constraints == plain.range_constraints, name
    inputs = (tokens,)
    with torch.no_grad():
        assert torch.equal(load_program(base / "model.pt2").module()(*inputs),
                           torch.export.load(str(base / "model.pt2")).module()(*inputs))
    assert serialize.GraphModuleDeserializer._parse_sym_expr is parse and serialize.typing is typing_module
