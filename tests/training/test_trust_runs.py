"""Run directories, task data and caches received from someone else (issue "Trust II").

Each test reproduces one finding of the audit: a file of the user's linked into a run directory is
never written or deleted, a tampered run directory is a located error that leaves it as it was, a
run that diverges is recorded as diverged (never as a result), a data error leaves nothing behind,
and a cache is a hint that cannot make attnspec skip work it did not do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnspec
from attnspec.errors import AttnSpecError, RunError, SpecError, TrainingDiverged
from attnspec.training import rundir
from tests.conftest import ROOT

SPEC = ROOT / "specs" / "softmax-transformer.yaml"
TINY = ["d_model=16", "layers[0].repeat=1", "max_len=16", "input.vocab_size=32", "position=learned"]
MQAR = ["seq_len=16", "vocab_size=32", "num_kv_pairs=2"]


def tiny_run(output: Path | None, **flags):
    settings = {"steps": 6, "batch_size": 8, "eval_every": 3, "test_examples": 16, "lr": 3e-3} | flags
    return attnspec.train(SPEC, overrides=TINY, task="mqar", task_overrides=MQAR, output=output, **settings)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run stopped at step 3 (checkpoint step-000000003), to resume from."""
    directory = tmp_path_factory.mktemp("runs") / "stopped"
    attnspec.train(SPEC, overrides=TINY, task="mqar", task_overrides=MQAR, output=directory, steps=6, batch_size=8,
                   eval_every=3, test_examples=16, lr=3e-3, stop_after=3)
    return directory


def copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target, symlinks=True)
    return target


def tree_digest(directory: Path) -> dict[str, str]:
    """Every entry under ``directory`` (links as their target text): proves a refused resume changed nothing."""
    out = {}
    for path in sorted(directory.rglob("*")):
        relative = str(path.relative_to(directory))
        out[relative] = ("link:" + os.readlink(path)) if path.is_symlink() else digest(path) if path.is_file() else "dir"
    return out


# ----------------------------------------------------------------------------- files of the user's


def test_resume_never_deletes_a_foreign_next_checkpoint(stopped, tmp_path):
    """Finding 6: --resume deleted whatever sat at the next checkpoints/step-N."""
    run = copy(stopped, tmp_path)
    foreign = run / "checkpoints" / "step-000000006"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    with pytest.raises(RunError, match="did not write"):
        attnspec.train(None, output=run, resume=True)
    assert (foreign / "thesis.tex").read_text() == "years of work"


def test_a_linked_checkpoints_directory_is_refused_and_the_user_s_files_survive(stopped, tmp_path):
    """Finding 6: through a symlinked `checkpoints`, old-checkpoint cleanup deleted a user's checkpoints."""
    run = copy(stopped, tmp_path)
    mine = tmp_path / "my-checkpoints"
    shutil.copytree(run / "checkpoints", mine)
    (mine / "step-000000001").mkdir()
    for name in rundir.CHECKPOINT_FILES:  # looks exactly like attnspec's own
        (mine / "step-000000001" / name).write_text("mine")
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(mine)
    before = tree_digest(mine)
    with pytest.raises(RunError, match="symbolic link"):
        attnspec.train(None, output=run, resume=True)
    assert tree_digest(mine) == before


def test_a_linked_metrics_file_is_never_appended_to(stopped, tmp_path):
    run = copy(stopped, tmp_path)
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(mine)
    with pytest.raises(RunError):
        attnspec.train(None, output=run, resume=True)
    assert mine.read_text() == "my notes\n"


# ----------------------------------------------------------------------------- divergence


def test_a_diverging_run_stops_is_recorded_and_keeps_finite_weights(tmp_path):
    """Finding 8: lr 10 with weight decay 10 exited 0 with NaN checkpoints and NaN in result.json."""
    with pytest.raises(TrainingDiverged) as caught:
        tiny_run(tmp_path / "run", lr=10.0, weight_decay=10.0, steps=40, eval_every=5, grad_clip=0.0)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "diverged" and record["diverged"]["step"] == caught.value.step
    assert not (tmp_path / "run" / "result.json").exists()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["diverged"] is True and lines[-1]["step"] == caught.value.step  # strict JSON: no NaN literal
    if (tmp_path / "run" / rundir.CHECKPOINT_POINTER).exists():
        step, weights, moments, _ = rundir.load_checkpoint(tmp_path / "run")
        assert all(torch.isfinite(t).all() for t in weights.values())
    with pytest.raises(RunError, match="diverged"):
        attnspec.train(None, output=tmp_path / "run", resume=True)


def test_the_cli_exits_non_zero_on_divergence(tmp_path):
    result = subprocess.run([sys.executable, "-m", "attnspec", "train", str(SPEC), *sum((["--set", s] for s in TINY),
                             []), "--task", "mqar", *sum((["--task-set", s] for s in MQAR), []), "--steps", "40",
                             "--lr", "10", "--batch", "8", "-o", str(tmp_path / "run"), "--config",
                             str(_config(tmp_path, weight_decay=10.0, grad_clip=0.0, eval_every=5, test_examples=16))],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "diverged at step" in result.stderr and "Traceback" not in result.stderr


def _config(tmp_path: Path, **fields) -> Path:
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"task": {"kind": "mqar"}, **fields}))
    return path


# ----------------------------------------------------------------------------- tampered run directories


def _edit_json(name: str, value):
    def mutate(run: Path) -> None:
        path = run / name if not name.startswith("@") else _checkpoint(run) / name[1:]
        path.write_text(value if isinstance(value, str) else json.dumps(value(json.loads(path.read_text()))))
    return mutate


def _checkpoint(run: Path) -> Path:
    return run / json.loads((run / rundir.CHECKPOINT_POINTER).read_text())["directory"]


def _moments(change):
    def mutate(run: Path) -> None:
        path = _checkpoint(run) / "optimizer.safetensors"
        tensors = load_file(str(path))
        change(tensors)
        save_file(tensors, str(path))
    return mutate


def _first_moment(tensors, key: str, value) -> None:
    name = next(n for n in tensors if n.endswith("." + key) and tensors[n].dim() >= 1)
    tensors[name] = value(tensors[name])


def _link_checkpoint(run: Path) -> None:
    where = _checkpoint(run)
    outside = run.parent / "elsewhere"
    shutil.move(str(where), outside)
    where.symlink_to(outside)


TAMPERED = {
    "run-json-deep": _edit_json("run.json", "[" * 100_000),
    "state-json-deep": _edit_json("@state.json", "[" * 100_000),
    "pointer-deep": _edit_json(rundir.CHECKPOINT_POINTER, "{\"a\":" * 50_000 + "1" + "}" * 50_000),
    "step-huge": _edit_json("@state.json", lambda s: {**s, "step": 10 ** 30}),
    "step-float": _edit_json("@state.json", lambda s: {**s, "step": 1e30}),
    "step-negative": _edit_json("@state.json", lambda s: {**s, "step": -5}),
    "step-4000-digits": _edit_json("@state.json", '{"step": ' + "9" * 4000 + "}"),
    "pointer-step-mismatch": _edit_json(rundir.CHECKPOINT_POINTER, lambda p: {**p, "step": 2}),
    "run-step-string": _edit_json("run.json", lambda r: {**r, "step": "x"}),
    "run-status-unknown": _edit_json("run.json", lambda r: {**r, "status": "pwned"}),
    "state-nan": _edit_json("@state.json", '{"step": NaN}'),
    "moment-nan": _moments(lambda t: _first_moment(t, "exp_avg", lambda m: torch.full_like(m, float("nan")))),
    "moment-negative": _moments(lambda t: _first_moment(t, "exp_avg_sq", lambda m: -torch.ones_like(m))),
    "moment-wrong-shape": _moments(lambda t: _first_moment(t, "exp_avg", lambda m: torch.zeros(3, 3))),
    "moment-int": _moments(lambda t: _first_moment(t, "exp_avg", lambda m: m.long())),
    "moment-step-nan": _moments(lambda t: t.update({next(n for n in t if n.endswith(".step")): torch.tensor(float("nan"))})),
    "checkpoint-linked": _link_checkpoint,
    "checkpoint-foreign-file": lambda run: (_checkpoint(run) / "evil.py").write_text("x"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_run_directory_is_a_located_error_and_stays_as_it_was(stopped, tmp_path, case):
    """Findings 10 and 12: crashes (exit 70), NaN weights, a run marked done at step 1e30."""
    run = copy(stopped, tmp_path)
    TAMPERED[case](run)
    before = tree_digest(run)
    with pytest.raises(RunError):
        attnspec.train(None, output=run, resume=True)
    assert tree_digest(run) == before


def test_a_metrics_line_with_a_string_step_is_dropped_on_resume(stopped, tmp_path):
    run = copy(stopped, tmp_path)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": "x"}\n{"step": 2, "split": [1]}\n')
    resumed = attnspec.train(None, output=run, resume=True)
    assert resumed.step == 6
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(step, int) for step in steps)


def test_unknown_optimiser_groups_are_located_errors():
    """Finding 10: `groups:` with an unknown slot name was silently ignored."""
    from attnspec.training.config import load_config

    with pytest.raises(SpecError, match="unknown group 'transiton' .did you mean 'transition'"):
        load_config({"task": {"kind": "mqar"}, "groups": {"transiton": {"lr_multiplier": 2}}})
    with pytest.raises(SpecError, match="unknown group 'transition.dta'"):
        load_config({"task": {"kind": "mqar"}, "groups": {"transition.dta": {"lr_multiplier": 2}}})
    assert load_config({"task": {"kind": "mqar"}, "groups": {"transition.data": {"lr_multiplier": 2}}}).groups


# ----------------------------------------------------------------------------- task data


def test_an_empty_token_file_is_a_located_error_and_leaves_no_run_directory(tmp_path):
    """Findings 13 and 15: an empty train.bin crashed; a data error left the directory `running`."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.bin").write_bytes(b"")
    (data / "val.bin").write_bytes(torch.arange(100, dtype=torch.int16).numpy().tobytes())
    overrides = [*TINY]
    with pytest.raises(AttnSpecError, match="empty"):
        attnspec.train(SPEC, overrides=overrides, task="tokens", task_overrides=[f"path={data}", "vocab_size=32",
                                                                                 "seq_len=8"],
                       output=tmp_path / "run", steps=2, batch_size=2, test_examples=2)
    assert not (tmp_path / "run").exists()
    (data / "train.bin").write_bytes(torch.arange(300, dtype=torch.int16).remainder(32).numpy().tobytes())
    (data / "val.bin").write_bytes(torch.arange(100, dtype=torch.int16).remainder(32).numpy().tobytes())
    run = attnspec.train(SPEC, overrides=overrides, task="tokens", task_overrides=[f"path={data}", "vocab_size=32",
                                                                                   "seq_len=8"],
                         output=tmp_path / "run", steps=2, batch_size=2, test_examples=2)
    assert run.step == 2, "the same command runs once the data are fixed"


def test_a_token_above_the_vocabulary_at_the_first_batch_leaves_nothing_behind(tmp_path):
    """Finding 15: an error caught at the first batch left the run directory `running` with no checkpoint."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.bin", "val.bin"):
        (data / name).write_bytes(torch.full((200,), 1000, dtype=torch.int16).numpy().tobytes())
    with pytest.raises(AttnSpecError, match="not below vocab_size"):
        attnspec.train(SPEC, overrides=TINY, task="tokens", task_overrides=[f"path={data}", "vocab_size=32",
                                                                            "seq_len=8"],
                       output=tmp_path / "run", steps=2, batch_size=2, test_examples=2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("failing, name", [("read_bytes", "b.txt"), ("lstat", "cwd")])
def test_an_unreadable_entry_of_a_bytes_corpus_is_a_located_error(tmp_path, monkeypatch, failing, name):
    """Finding 13: `--task bytes` on a directory with an unreadable entry crashed; and over /proc/1,
    `is_file` raised PermissionError on an entry whose very status a user may not read (/proc/1/cwd).
    (The tests run as root, whom permissions do not stop, so the call fails as it would for a user
    without access.)"""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world " * 50)
    secret = corpus / name
    secret.write_text("secret " * 50)
    real = getattr(Path, failing)

    def refuse(self):
        if self == secret:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, failing, refuse)
    with pytest.raises(AttnSpecError, match=f"{name}: cannot be read"):
        attnspec.train(SPEC, overrides=[*TINY[:3], "input.vocab_size=256", "position=learned"], task="bytes",
                       task_overrides=[f"path={corpus}", "seq_len=8"], output=tmp_path / "run", steps=2,
                       batch_size=2, test_examples=2)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- caches


def test_a_calibration_file_that_is_a_directory_or_an_unwritable_cache_does_not_crash(tmp_path, monkeypatch):
    """Finding 14: `calibration.json` a directory, or an unwritable ATTNSPEC_CACHE_DIR, crashed
    `explain --calibrate` and `train`."""
    cache = tmp_path / "cache"
    (cache / "calibration.json").mkdir(parents=True)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for where in (cache, blocker / "cache"):
        env = {**os.environ, "ATTNSPEC_CACHE_DIR": str(where)}
        result = subprocess.run([sys.executable, "-m", "attnspec", "explain", str(SPEC), *sum((["--set", s] for s in
                                 TINY), []), "--calibrate", "--length", "16"], capture_output=True, text=True,
                                timeout=300, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "not written" in result.stderr and "Traceback" not in result.stderr
        monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(where))
        with pytest.warns(RuntimeWarning, match="not written"):  # only measured planning writes the cache
            assert tiny_run(None, steps=2, planning="measured").step == 2


def test_a_long_skipped_reason_in_the_calibration_is_ignored(tmp_path, monkeypatch):
    """Finding 14: a reason over 4,096 characters made a manifest that failed its own schema on every load."""
    from attnspec.compiler.calibration import Calibration, calibration_path, machine_key, mixer_signature
    from attnspec.spec import load_spec
    from attnspec.spec.ir import iter_blocks

    from attnspec.compiler.build import build_directory

    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    linear, overrides = ROOT / "specs" / "linear-elu.yaml", ["d_model=16", "layers[0].repeat=1", "max_len=64"]
    spec = load_spec(linear, overrides)
    signature = mixer_signature(spec, iter_blocks(spec, expand=True)[0][1].mixer)
    calibration = Calibration(calibration_path(), {}, machine_key())
    calibration.store(signature, "inference", 1, 64, {"quadratic": 1e-3, "chunk": 2e-3}, {"scan": "x" * 5000})
    calibration.save()
    directory = tmp_path / "build"
    manifest = build_directory(linear, directory, compile_check=False, overrides=overrides).manifest
    assert all(len(why) < 4096 for layer in manifest["plan"]["layers"] for why in layer.get("skipped", {}).values())
    attnspec.load(directory)  # the manifest validates


def test_a_poisoned_compile_check_cache_is_not_reused(tmp_path, monkeypatch):
    """Finding 9: a crafted compile-checks.json made `build` report a compile check that never ran;
    a malformed entry crashed the build after publishing."""
    from attnspec.compiler import compile as compile_check, compile_cache
    from attnspec.compiler.build import build_directory
    from attnspec.spec import load_spec, spec_to_data

    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(SPEC, TINY)
    ran = []
    monkeypatch.setattr(compile_check.BackgroundCheck, "result",
                        lambda self: (ran.append(1), ({"lengths": [16], "max_abs_diff": 0.0, "max_rel_diff": 0.0,
                                                       "graphs": 1, "dynamic": False, "backend": "inductor"}, 0.1))[1])
    plan_modes = None

    def poison(entry):
        nonlocal plan_modes
        from attnspec.compiler.plan import plan_spec

        plan_modes = plan_modes or plan_spec(spec, for_build=True).full_modes  # softmax: one mode, quadratic
        key = compile_cache.check_key(spec_to_data(spec, minimal=False), plan_modes)
        path = tmp_path / "cache" / compile_cache.CHECKS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"format": 1, "checks": {key: entry}}))

    for index, entry in enumerate([{"lengths": [16], "max_abs_diff": 0.0, "graphs": 1, "dynamic": False},
                                   {"report": {"lengths": [16], "max_abs_diff": 0.0, "graphs": 1, "dynamic": False},
                                    "proof": "0" * 64},
                                   {"report": "x" * 10_000, "proof": None}, {"lengths": "many"}, ["garbage"]]):
        poison(entry)
        ran.clear()
        manifest = build_directory(SPEC, tmp_path / f"build-{index}", overrides=TINY).manifest
        assert ran == [1], f"entry {index} was trusted: the check did not run"
        assert not manifest["compile"].get("reused")
    # a check this user's attnspec recorded (signed with the user's key) is reused
    ran.clear()
    manifest = build_directory(SPEC, tmp_path / "build-again", overrides=TINY).manifest
    assert ran == [] and manifest["compile"]["reused"]


def test_a_run_directory_loads_where_a_model_is_read_or_is_refused_with_the_command_that_builds_it(stopped,
                                                                                                    tmp_path):
    """`attnspec.load` and `explain` take a run directory (its latest checkpoint; its resolved spec); `run` and
    `verify`, which read a build's manifest and programs, refuse it naming the exact `attnspec build` command."""
    from attnspec.training.rundir import load_trained

    model = attnspec.load(stopped)
    tokens = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(model(tokens), load_trained(stopped)(tokens))
    with pytest.raises(AttnSpecError, match="attnspec build"):
        attnspec.load(stopped, weights=tmp_path / "other.safetensors")
    explained = subprocess.run([sys.executable, "-m", "attnspec", "explain", str(stopped)], capture_output=True,
                               text=True, cwd=ROOT, timeout=300)
    assert explained.returncode == 0 and "plan at L = 16" in explained.stdout, explained.stderr
    for command in (["run", str(stopped), "--tokens", "1 2 3"], ["verify", str(stopped)]):
        result = subprocess.run([sys.executable, "-m", "attnspec", *command], capture_output=True, text=True,
                                cwd=ROOT, timeout=300)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"attnspec build {stopped} -o {stopped}-build" in " ".join(result.stderr.split()), result.stderr
