"""attnspec build end to end: build directory, reload, exported programs, generation, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.compiler.archive import load_program
from attnspec.compiler.build import build_directory
from attnspec.compiler.tracing import example_input
from attnspec.errors import BuildError, SpecError
from tests.conftest import ROOT, SPECS

pytestmark = pytest.mark.slow


def test_every_spec_builds_compiles_verifies_and_exports_in_one_process(built_specs):
    assert len(built_specs) == len(SPECS) >= 12
    for name, result in built_specs.items():
        manifest = result.manifest
        assert manifest["compile"] is not None and manifest["compile"]["lengths"], name
        assert manifest["compile"]["backend"] == "inductor", name  # the fixture asks for Inductor's code
        assert manifest["verification"]["ok"], name
        assert manifest["export"]["model.pt2"]["max_abs_diff_vs_eager"] < 1e-4, name
        files = set(os.listdir(result.directory))
        assert {"spec.yaml", "model.safetensors", "model.pt2", "manifest.json"} <= files, name
        assert ("step.pt2" in files) == manifest["has_step"] == ("prefill.pt2" in files), name
        if manifest["has_step"]:  # the prompt's logits and every state tensor
            assert manifest["export"]["prefill.pt2"]["max_abs_diff_vs_eager"] < 1e-4, name


def test_reloaded_model_equals_the_built_one(built_specs):
    for name in ("gateloop", "scatterbrain", "ffn-aoglu", "rank-collapse-san"):
        directory = built_specs[name].directory
        model = attnspec.load(directory)
        spec_again = attnspec.load_spec(directory / "spec.yaml")
        assert spec_again == model.spec
        program = load_program(directory / "model.pt2")
        inputs = example_input(model, 2, 45)
        with torch.no_grad():
            assert torch.allclose(program.module()(inputs), model(inputs), atol=1e-5, rtol=1e-5)


def test_exported_programs_run_without_attnspec_at_unseen_lengths(built_specs, tmp_path):
    """Every spec's model.pt2 and prefill.pt2 equal eager at lengths they were not traced at (17), one
    within a chunk and one across several, and call none of attnspec's operators; a process without
    attnspec runs the hybrid's (softmax and linear attention) with plain ``torch.export.load`` (the same
    loading code for every program, seconds for each: the operator check above stands for the rest)."""
    plain_cases = []
    for name, result in built_specs.items():
        model = attnspec.load(result.directory)
        programs = {}
        lengths = [n for n in (37, 300) if n <= model.spec.max_len]  # 300 spans several chunks
        for length in lengths:
            inputs = example_input(model, 2, length, torch.Generator().manual_seed(length))
            with torch.no_grad():
                cases = [("model.pt2", (inputs,), (model(inputs),))]
                if model.has_step and length == lengths[0]:  # the prompt's logits and state (written into a
                    capacity = min(length + 3, model.spec.max_len)  # state of a generation's capacity), at one length
                    cases.append(("prefill.pt2", (inputs, *model.init_state(2, capacity)),
                                  model.prefill(inputs, last_only=True, capacity=capacity)))
                for program_name, program_inputs, expected in cases:
                    if program_name not in programs:  # each program loaded once, run at every length
                        program = load_program(result.directory / program_name)
                        targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
                        assert not any("attnspec" in target for target in targets), (name, program_name)
                        programs[program_name] = program.module()
                    outputs = programs[program_name](*program_inputs)
                    for got, want in zip(outputs if isinstance(outputs, tuple) else (outputs,), expected, strict=True):
                        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (name, program_name, length)
                    if name == "hybrid":
                        plain_cases.append((str(result.directory / program_name), program_inputs, expected))
    assert {Path(path).parent.name for path, _, _ in plain_cases} == {"hybrid"}
    torch.save(plain_cases, tmp_path / "cases.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        programs = {{}}
        for program_path, inputs, expected in torch.load({str(tmp_path / 'cases.pt')!r}, weights_only=False):
            if program_path not in programs:  # each program loaded once, run at every length
                programs[program_path] = torch.export.load(program_path).module()
            got = programs[program_path](*inputs)
            for got, expected in zip(got if isinstance(got, tuple) else (got,), expected, strict=True):
                assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), (program_path, inputs[0].shape)
        assert not any(name.startswith("attnspec") for name in sys.modules), "attnspec was imported"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


def test_generation_with_the_state_cache_equals_greedy_full_model(built_specs):
    directory = built_specs["gateloop"].directory
    result = subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", "run", str(directory),
                             "--tokens", "3 1 4 1 5", "--generate", "12"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    generated = [int(t) for t in result.stdout.split("generated:")[1].split()]
    program = load_program(directory / "model.pt2").module()
    sequence = [3, 1, 4, 1, 5]
    with torch.no_grad():
        for _ in range(12):
            sequence.append(int(program(torch.tensor([sequence]))[0, -1].argmax()))
    assert generated == sequence[5:]


def test_decode_step_state_size_is_constant(built_specs):
    manifest = built_specs["retnet"].manifest
    state = manifest["export"]["step.pt2"]["state"]
    assert state[0] == {"shape": [], "dtype": "int64"} and all(entry["shape"] for entry in state[1:])


def test_tampered_directory_is_refused(built_specs, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built_specs["linear-elu"].directory, copy)
    with open(copy / "model.safetensors", "r+b") as handle:
        handle.seek(200)
        handle.write(b"\x00\x01\x02")
    with pytest.raises(BuildError, match="does not match the sha256"):
        attnspec.load(copy)


def test_a_structure_checked_before_reuses_its_compile_check(tmp_path, monkeypatch):
    """Same spec but for name and seed: the second build reuses the first one's passed compile check
    (no compile process starts); another structure is checked afresh."""
    from attnspec.compiler import build as build_module

    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    # the mode pinned: a plan chosen by timings could pick another mode for the second build on a busy
    # machine, and a plan of other modes is another structure to check
    small = ["d_model=16", "layers[0].repeat=1", "max_len=64", "input.vocab_size=32",
             "layers[0].layers[0].mixer.mode=chunk"]
    first = build_directory(SPECS[0].parent / "linear-elu.yaml", tmp_path / "a", overrides=small)
    assert first.manifest["compile"]["graphs"] == 1 and not first.manifest["compile"].get("reused")

    def no_process(*args, **kwargs):
        raise AssertionError("a compile check ran for a structure that passed before")

    monkeypatch.setattr(build_module, "BackgroundCheck", no_process)
    second = build_directory(SPECS[0].parent / "linear-elu.yaml", tmp_path / "b", overrides=[*small, "seed=7",
                                                                                              "name=other"])
    assert second.manifest["compile"]["reused"] is True and "compile" not in second.stage_seconds
    with pytest.raises(BuildError, match="compile check ran"):  # a build wraps unexpected errors
        build_directory(SPECS[0].parent / "linear-elu.yaml", tmp_path / "c", overrides=[*small, "d_model=24"])


def test_a_traced_check_is_not_taken_for_an_inductor_one_and_half_precision_checks_are_remembered(tmp_path,
                                                                                                   monkeypatch):
    """An import's check (``trace``: Dynamo and AOTAutograd, no Inductor code) is reused by another trace
    check of the structure but never by a build, which asks for Inductor's; an Inductor pass serves both.
    A bfloat16 model's difference is in the output's units (over 1 for logits): its pass is remembered too."""
    from attnspec.compiler import build as build_module

    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    levels = []

    class Recorded:
        def __init__(self, spec, modes, device, level):
            levels.append(level)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def result(self):
            return {"lengths": [45], "max_abs_diff": 4.0, "max_rel_diff": 0.02, "graphs": 1, "dynamic": False,
                    "backend": {"trace": "aot_eager", "inductor": "inductor"}[levels[-1]]}, 0.1

    monkeypatch.setattr(build_module, "BackgroundCheck", Recorded)
    small = ["d_model=16", "layers[0].repeat=1", "max_len=64", "input.vocab_size=32", "dtype=bfloat16",
             "layers[0].layers[0].mixer.mode=chunk"]
    spec = SPECS[0].parent / "linear-elu.yaml"

    def build(name, level, seed):
        return build_directory(spec, tmp_path / name, overrides=[*small, f"seed={seed}"], compile_check=level,
                               programs=()).manifest["compile"]

    assert not build("traced", "trace", 1).get("reused") and levels == ["trace"]
    assert build("traced-again", "trace", 2)["reused"] and levels == ["trace"]
    assert not build("built", True, 3).get("reused") and levels == ["trace", "inductor"]
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "other-cache"))
    assert not build("built-first", "inductor", 4).get("reused") and levels[-1] == "inductor"
    reused = build("traced-after", "trace", 5)
    assert reused["reused"] and reused["backend"] == "inductor" and len(levels) == 3
    with pytest.raises(BuildError, match="compile_check"):
        build("nonsense", "deep", 6)


def test_a_traced_check_still_refuses_a_graph_break(monkeypatch):
    """The trace level compiles with ``fullgraph=True`` as Inductor's does: a graph break is an error, and a
    model that traces whole reports Dynamo + AOTAutograd's graph equal to eager."""
    from attnspec.compiler.compile import check_model
    from attnspec.nn.model import build_model_from_spec
    from attnspec.spec import load_spec

    spec = load_spec(SPECS[0].parent / "linear-elu.yaml", ["d_model=16", "layers[0].repeat=2", "max_len=64",
                                                          "input.vocab_size=32"])
    model = build_model_from_spec(spec).eval()
    report = check_model(model, "trace")
    assert report["backend"] == "aot_eager" and report["graphs"] == 1 and report["max_rel_diff"] < 1e-5
    forward = type(model.blocks[0]).forward

    def breaking(self, *args, **kwargs):
        torch._dynamo.graph_break()
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model.blocks[0]), "forward", breaking)
    with pytest.raises(Exception, match="graph_break|graph break"):
        check_model(model, "trace")


def test_the_compile_check_builds_one_copy_of_each_block_from_the_seed(tmp_path, monkeypatch):
    """The check's process needs nothing the build writes and holds none of its weights: it builds each
    distinct block once (every repeat group at one copy: regional compilation gives identical blocks
    one graph) with the plan's modes of those blocks, from the spec's seed, and its check passes."""
    from attnspec.compiler.compile import BackgroundCheck
    from attnspec.spec import load_spec
    from attnspec.spec.walk import iter_blocks

    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(SPECS[0].parent / "linear-elu.yaml", ["d_model=16", "layers[0].repeat=5", "max_len=64",
                                                          "input.vocab_size=32"])
    modes = ["chunk", "recurrent", "recurrent", "recurrent", "recurrent"]  # the first copy's is the one kept
    with BackgroundCheck(spec, modes) as check:
        child_spec = load_spec(Path(check.folder.name) / "spec.yaml")
        assert len(iter_blocks(child_spec, expand=True)) == 1
        assert json.loads(check.process.args[-3]) == ["chunk"] and check.process.args[-1] == "inductor"
        report, _ = check.result()
    assert report["graphs"] == 1 and report["lengths"] == [45]
    assert not Path(check.folder.name).exists()


def test_the_compile_check_process_imports_nothing_from_the_working_directory(tmp_path, monkeypatch):
    """The check's child runs ``python -m attnspec.compiler.compile``; an ``attnspec`` folder in the
    working directory (a received directory, say) must not be what it imports."""
    marker = tmp_path / "PWNED"
    (tmp_path / "attnspec").mkdir()
    (tmp_path / "attnspec" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))  # no reused check: the child must run
    small = ["d_model=16", "layers[0].repeat=1", "max_len=64", "input.vocab_size=32"]
    result = build_directory(SPECS[0].parent / "softmax-transformer.yaml", tmp_path / "out", overrides=small)
    assert result.manifest["compile"]["lengths"] == [45] and not result.manifest["compile"].get("reused")
    assert not marker.exists()


def test_failing_build_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(BuildError, match="dynamic sequence length"):
        build_directory(SPECS[0].parent / "gateloop.yaml", target, overrides=["layers[0].layers[0].mixer.mode=recurrent"])
    with pytest.raises(SpecError):
        build_directory(SPECS[0].parent / "gateloop.yaml", target, overrides=["d_model=-1"])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("override, words", [
    ("layers[0].layers[0].mixer.scale=1e308", ["blocks[0] (layers[0]#0.layers[0])", "NaN or infinite",
                                               "float32", "scale"]),
    ("layers[0].layers[0].mixer.transition={kind: mamba, per: head, a_init: [1e-308, 1e-308]}",
     ["transition.A_log of blocks[0] (layers[0]#0.layers[0])", "NaN or infinite"]),
])
def test_a_model_that_is_not_finite_at_its_dtype_does_not_build(tmp_path, override, words):
    """Both built "successfully" (the float64 verification compares NaN with NaN, or is finite where
    float32 overflows) into a directory every `run` refused."""
    with pytest.raises(BuildError) as caught:
        build_directory(SPECS[0].parent / "gateloop.yaml", tmp_path / "out", overrides=[override, "max_len=32"],
                        compile_check=False, calibrate=False)
    assert all(word in str(caught.value) for word in words), str(caught.value)
    assert os.listdir(tmp_path) == []


def test_existing_directory_needs_force_and_force_replaces_only_builds(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    spec = SPECS[0].parent / "rank-collapse-san.yaml"
    with pytest.raises(BuildError, match="did not write it.*choose another -o") as refused:  # no --force advised:
        build_directory(spec, target, compile_check=False)  # it would not replace a folder of the user's
    assert "--force" not in str(refused.value)
    with pytest.raises(BuildError, match="did not write it"):  # a user's directory: never replaced
        build_directory(spec, target, compile_check=False, force=True)
    assert os.listdir(target) == ["keep.txt"]
    (target / "keep.txt").unlink()
    target.rmdir()
    build_directory(spec, target, compile_check=False, overrides=["layers[0].repeat=1"])
    build_directory(spec, target, compile_check=False, force=True, overrides=["layers[0].repeat=2"])
    assert json.loads((target / "manifest.json").read_text())["compile"] is None
    assert len(attnspec.load(target).blocks) == 2
    (target / "notes.md").write_text("my notes")  # a build holding the user's files is not replaced either
    with pytest.raises(BuildError, match="notes.md"):
        build_directory(spec, target, compile_check=False, force=True)
    assert (target / "notes.md").read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_cli_build_prints_summary_and_next_steps(tmp_path):
    result = subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", "build",
                             "specs/linear-elu.yaml", "-o", str(tmp_path / "elu"), "--no-compile", "--set", "d_model=16",
                             "--set", "layers[0].repeat=1"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "attnspec run" in result.stdout and "model.pt2" in result.stdout and "Traceback" not in result.stderr


def test_hybrids_generate_alike_from_weights_and_from_the_exported_step(built_specs):
    """Every shipped causal token spec decodes from its build directory: the prefill.pt2 and step.pt2
    programs (caches as fixed-shape state) generate what the model rebuilt from the weights generates."""
    from attnspec.compiler.runner import run_directory

    for name in ("hybrid", "qwen3-next-style", "sliding-window-hybrid", "softmax-transformer", "scatterbrain"):
        directory = built_specs[name].directory
        assert built_specs[name].manifest["has_step"], name
        eager = run_directory(directory, "3 1 4 1 5", 6)
        assert eager == run_directory(directory, "3 1 4 1 5", 6, programs=True), name
    # sampling draws the same tokens from either (one spec: the sampler is the same code for all)
    directory = built_specs["qwen3-next-style"].directory
    sampled = run_directory(directory, "3 1 4", 5, temperature=0.9, top_k=8, seed=3)
    assert sampled == run_directory(directory, "3 1 4", 5, temperature=0.9, top_k=8, seed=3, programs=True)


def test_a_build_whose_programs_take_max_len_states_still_generates_from_its_programs(built_specs, tmp_path):
    """Builds before the programs took a state of any capacity: ``prefill(tokens)`` returning a state of
    ``max_len`` positions and a step of fixed cache shapes, a manifest without capacity axes. Made here as
    those builds were (the hybrid's programs exported with only the batch and length dynamic, the new
    fields dropped from its manifest): ``attnspec run --programs`` generates what the eager model does."""
    import shutil

    from torch.export import Dim

    from attnspec.compiler.export import DecodeStep
    from attnspec.compiler.manifest import sha256
    from attnspec.compiler.runner import run_directory
    from attnspec.compiler.tracing import size_oblivious

    directory = tmp_path / "hybrid"
    shutil.copytree(built_specs["hybrid"].directory, directory)
    model = attnspec.load(directory)

    class OldPrefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, inputs):
            return self.model.prefill(inputs, last_only=True)

    batch, state = Dim("batch", min=1, max=4096), model.init_state(3)
    with size_oblivious():
        prefill = torch.export.export(OldPrefill(), (example_input(model, 3, 17),), strict=False,
                                      dynamic_shapes=({0: batch, 1: Dim("length", min=2, max=1024)},))
        step = torch.export.export(DecodeStep(model), (torch.zeros(3, dtype=torch.long), *state), strict=False,
                                   dynamic_shapes=({0: batch}, tuple({0: batch} for _ in state)))
    manifest = json.loads((directory / "manifest.json").read_text())
    for name, program in (("prefill.pt2", prefill), ("step.pt2", step)):
        torch.export.save(program, str(directory / name))
        manifest["files"][name] = {"sha256": sha256(directory / name), "bytes": (directory / name).stat().st_size}
    del manifest["export"]["prefill.pt2"]["takes_state"]
    for entry in manifest["export"]["step.pt2"]["state"]:
        entry.pop("capacity_axis", None)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert run_directory(directory, "3 1 4 1 5", 6, programs=True) == run_directory(directory, "3 1 4 1 5", 6)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@pytest.mark.parametrize("device, message", [("cuda", "no CUDA device on this machine"), ("cuda:7", "CUDA"),
                                             ("tpu", "not a device name"), ("meta", "not 'meta'")])
def test_a_device_this_machine_cannot_build_for_is_a_located_error(tmp_path, device, message):
    """``--device`` names a device type attnspec builds for and that exists here: else exit 2, the reason,
    no traceback and nothing written."""
    if torch.cuda.is_available() and device.startswith("cuda") and device != "cuda:7":
        pytest.skip("this machine has a CUDA device")
    result = subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", "build",
                             "specs/linear-elu.yaml", "-o", str(tmp_path / "out"), "--device", device],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert os.listdir(tmp_path) == []
    with pytest.raises(BuildError, match=message):
        attnspec.build(SPECS[0].parent / "linear-elu.yaml", device=device)


def test_a_cpu_build_records_its_device_and_loads_on_the_asked_device(tmp_path):
    result = build_directory(SPECS[0].parent / "gateloop.yaml", tmp_path / "cpu", compile_check=False,
                             device="cpu", overrides=["d_model=16", "layers[0].repeat=1", "max_len=128"])
    assert result.manifest["device"] == "cpu"
    model = attnspec.load(result.directory, device=torch.device("cpu"))
    assert model.embed.weight.device.type == "cpu"
    if torch.cuda.is_available():
        return
    # A directory built on a GPU (as its manifest says) runs rebuilt on the CPU; its programs need the GPU.
    manifest = json.loads((result.directory / "manifest.json").read_text())
    (result.directory / "manifest.json").write_text(json.dumps({**manifest, "device": "cuda"}))
    run = [sys.executable, "-c", "from attnspec.cli import main; main()", "run", str(result.directory), "--tokens", "1 2"]
    rebuilt = subprocess.run(run, capture_output=True, text=True, timeout=600)
    assert rebuilt.returncode == 0 and "next token" in rebuilt.stdout, rebuilt.stderr
    programs = subprocess.run(run + ["--programs"], capture_output=True, text=True, timeout=600)
    assert programs.returncode == 2 and "was built for cuda" in programs.stderr and "without --programs" in \
        programs.stderr and "Traceback" not in programs.stderr, programs.stderr


@CUDA
@pytest.mark.parametrize("name", ["retnet", "gateloop", "lru", "linear-elu", "scatterbrain", "softmax-transformer"])
def test_a_cuda_build_verifies_exports_and_decodes_on_the_gpu(tmp_path, name):
    """``attnspec build --device cuda``: every stage on the GPU (the chunk mode through the Triton kernels
    where they apply); the exported programs run there and equal eager; the weights load on the CPU too."""
    result = build_directory(SPECS[0].parent / f"{name}.yaml", tmp_path / name, device="cuda",
                             overrides=["d_model=64", "layers[0].repeat=2", "max_len=1024"])
    assert result.manifest["device"] == "cuda" and result.manifest["verification"]["ok"]
    model = attnspec.load(result.directory, device="cuda")
    inputs = example_input(model, 2, 300)
    program = torch.export.load(str(result.directory / "model.pt2")).module()
    with torch.no_grad():
        torch.testing.assert_close(program(inputs), model(inputs), atol=1e-4, rtol=1e-4)
        on_cpu = attnspec.load(result.directory, device="cpu")
        torch.testing.assert_close(on_cpu(inputs.cpu()), model(inputs).cpu(), atol=1e-4, rtol=1e-4)
    if model.has_step:
        state = model.init_state(2)
        with torch.no_grad():
            logits, *state = model.step(inputs[:, 0], *state)
        assert logits.device.type == "cuda" and torch.isfinite(logits).all()

