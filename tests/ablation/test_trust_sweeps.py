"""Sweeps and runs directories received from someone else (issue "Trust II").

A runs directory is data: its links and files are someone else's choosing. ``ablate`` and
``report`` never write through a link, a diverged run is listed as diverged and never chosen,
labels from a sweep are text (not TeX, not spreadsheet formulas), a grid written too wide is refused
before anything is resolved, two sweeps on one directory do not call each other's runs failures,
and no child process attnspec starts imports a module from the working directory.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnspec.ablation import runsdir
from attnspec.ablation.ablate import ablate, plan_sweep
from attnspec.ablation.report import write_report
from attnspec.ablation.results import collect
from attnspec.errors import RunError, SpecError
from tests.ablation.sweeps import sweep, write_sweep
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # sweeps run in worker processes, torchrun and Ray

ONE_RUN = {"variants": {"softmax": {}}}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """Two runs of the toy sweep at lr 3e-3 and one at lr 10 with weight decay 10, which diverges."""
    directory = tmp_path_factory.mktemp("trust-sweep") / "runs"
    outcome = ablate(sweep(**ONE_RUN, lr=[0.003, 10.0], train={"weight_decay": 10.0, "grad_clip": 0.0, "steps": 30,
                                                                "eval_every": 10}),
                     directory, workers=2, threads=1)
    assert outcome.ran == 2
    return directory


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- divergence


def test_a_diverged_run_is_listed_as_diverged_and_never_best(finished):
    """Finding 8: the report named the diverging lr "best" with perplexity nan and said "0 failed"."""
    report = collect(finished)
    statuses = {run.lr: run.status for run in report.runs}
    assert statuses == {0.003: "done", 10.0: "diverged"}
    assert report.results[0].lr == 0.003 and report.results[0].mean is not None
    markdown = (finished / "report" / "results.md").read_text()
    assert "1 diverged" in markdown and "## Diverged runs" in markdown and "diverged at step" in markdown
    assert "nan" not in (finished / "report" / "results.csv").read_text().lower()
    assert not list((finished / "failures").iterdir())
    again = ablate(sweep(**ONE_RUN, lr=[0.003, 10.0], train={"weight_decay": 10.0, "grad_clip": 0.0, "steps": 30,
                                                            "eval_every": 10}), finished, workers=1, threads=1)
    assert again.ran == 0 and again.skipped == 2, "a diverged run is a result: it is not trained again"


# ----------------------------------------------------------------------------- links in a runs directory


@pytest.mark.parametrize("where", ["report", "report/plots", "report/results.csv", "report/plots/mqar-training-curves.png",
                                   "report/report.html"])
def test_report_never_writes_through_a_link(finished, tmp_path, where):
    """Finding 4: `attnspec report DIR` overwrote a user's file linked under report/ with PNG data."""
    victim = tmp_path / "victim"
    if where in ("report", "report/plots"):
        victim.mkdir()
        (victim / "results.csv").write_text("mine")
        (victim / "mqar-training-curves.png").write_text("mine")
    else:
        victim.write_text("mine")
    target = finished / where
    if target.is_dir() and not target.is_symlink():
        import shutil

        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(victim)
    try:
        with pytest.raises(RunError, match="symbolic link"):
            write_report(finished)
        files = [victim] if victim.is_file() else sorted(victim.iterdir())
        assert all(path.read_text() == "mine" for path in files)
        assert len(files) == (1 if victim.is_file() else 2), "nothing was added to the user's folder"
    finally:
        target.unlink()
        write_report(finished)


def test_ablate_never_truncates_a_linked_lock_nor_appends_to_linked_events(tmp_path):
    """Finding 5: a symlinked locks/KEY.lock was truncated; a symlinked events.jsonl appended to."""
    directory = tmp_path / "runs"
    plan = plan_sweep(sweep(**ONE_RUN))
    runsdir.prepare(directory, {}, "", [run.to_json() for run in plan.runs])
    lock_victim, events_victim = tmp_path / "lock-victim", tmp_path / "events-victim"
    lock_victim.write_text("precious")
    events_victim.write_text("precious")
    (directory / "locks" / f"{plan.runs[0].key}.lock").symlink_to(lock_victim)
    (directory / "events.jsonl").symlink_to(events_victim)
    with pytest.raises(RunError, match="symbolic link"):
        ablate(sweep(**ONE_RUN), directory, workers=1, threads=1)
    (directory / "events.jsonl").unlink()
    outcome = ablate(sweep(**ONE_RUN), directory, workers=1, threads=1, report=False)
    assert outcome.failed and "symbolic link" in outcome.failed[0]["error"]
    assert lock_victim.read_text() == "precious" and events_victim.read_text() == "precious"


def test_linked_subdirectories_of_a_runs_directory_are_refused(tmp_path):
    for sub in runsdir.SUBDIRECTORIES:
        directory = tmp_path / sub / "runs"
        plan = plan_sweep(sweep(**ONE_RUN))
        runsdir.prepare(directory, {}, "", [run.to_json() for run in plan.runs])
        victim = tmp_path / sub / "victim"
        victim.mkdir()
        (directory / sub).rmdir()
        (directory / sub).symlink_to(victim)
        with pytest.raises(RunError, match="symbolic link"):
            ablate(sweep(**ONE_RUN), directory, workers=1, threads=1)
        assert not any(victim.iterdir())


# ----------------------------------------------------------------------------- text from the sweep


def test_a_tex_looking_grid_value_and_formula_cells_are_plain_text(tmp_path):
    """Findings 11 and 16: `$...$` crashed the plot legend (mathtext) after all training, and cells
    starting with = + - @ were written verbatim (formula injection)."""
    data = sweep(variants={"+1+1": {}, "-cmd": {}})
    data["grid"] = {"name": ["$\\frac{a}{$", "=cmd|' /C calc'!A0"]}
    data["train"] = {**data["train"], "steps": 2, "eval_every": 0}
    outcome = ablate(data, tmp_path / "runs", workers=2, threads=1)
    assert not outcome.failed
    for name in ("results.csv", "runs.csv"):
        with open(tmp_path / "runs" / "report" / name, newline="") as handle:
            cells = [cell for row in csv.reader(handle) for cell in row]
        assert not [cell for cell in cells if cell and (cell[0] in "=+@" or cell[0] == "-" and not _number(cell))], cells
        assert any(cell.startswith("'+1+1") for cell in cells) and any(cell.startswith("'-cmd") for cell in cells)
    assert (tmp_path / "runs" / "report" / "report.html").is_file()
    write_report(tmp_path / "runs")  # and again, as `attnspec report` would


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_a_grid_written_too_wide_is_refused_before_anything_is_resolved(tmp_path, monkeypatch):
    """Finding 7: a 1000 x 1000 grid resolved every point (670 MB and growing) before `max_runs`."""
    from attnspec.ablation import sweep as sweep_module

    resolved = []
    monkeypatch.setattr(sweep_module, "_patch", lambda *a, **k: resolved.append(1))
    data = sweep(**ONE_RUN, grid={"d_model": list(range(16, 1016)), "max_len": list(range(16, 1016))})
    with pytest.raises(SpecError, match="1,000,000 runs, over max_runs"):
        plan_sweep(data)
    assert resolved == []
    path = write_sweep(tmp_path / "wide.yaml", **ONE_RUN, grid={"d_model": list(range(16, 1016)),
                                                     "max_len": list(range(16, 1016))})
    result = subprocess.run([sys.executable, "-m", "attnspec", "ablate", str(path), "--dry-run"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "max_runs" in result.stderr and "wide.yaml:" in result.stderr


# ----------------------------------------------------------------------------- concurrency


def test_a_run_another_process_trains_is_not_a_failure(tmp_path):
    """Finding 17: two concurrent `ablate` on one directory both exited 1, reporting each other's runs failed."""
    directory = tmp_path / "runs"
    plan = plan_sweep(sweep())
    runsdir.prepare(directory, {}, "", [run.to_json() for run in plan.runs])
    held = plan.runs[0].key
    with open(directory / "locks" / f"{held}.lock", "a") as lock:  # the other sweep holds this run
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        outcome = ablate(sweep(), directory, workers=2, threads=1)
    assert not outcome.failed and [busy["key"] for busy in outcome.busy] == [held]
    assert not (directory / "failures" / f"{held}.json").exists()
    result = subprocess.run([sys.executable, "-m", "attnspec", "ablate", str(write_sweep(tmp_path / "s.yaml")), "-o",
                             str(directory)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- child processes


def _shadowing_modules(directory: Path, marker: Path) -> None:
    """Modules in the working directory that attnspec's children import if it is on their sys.path."""
    for name in ("yaml", "safetensors", "typer"):
        (directory / f"{name}.py").write_text(f"open({str(marker)!r} + '-{name}', 'w').close()\n"
                                              "raise ImportError('shadowed')\n")


def _child_env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")},
            "PYTHONPATH": str(ROOT)}


def test_sweep_workers_never_import_from_the_working_directory(tmp_path):
    """Finding 3: a `./yaml.py` in the working directory was imported by every sweep worker."""
    work, marker = tmp_path / "work", tmp_path / "IMPORTED"
    work.mkdir()
    path = write_sweep(tmp_path / "sweep.yaml", **ONE_RUN, train={"steps": 2, "eval_every": 0})
    code = ("import sys; sys.path.remove(''); from attnspec.ablation.ablate import ablate; "
            f"o = ablate({str(path)!r}, {str(tmp_path / 'runs')!r}, workers=1, threads=1, report=False); "
            "print(len(o.failed), o.ran)")
    _shadowing_modules(work, marker)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=work,
                            env=_child_env())
    assert result.stdout.split() == ["0", "1"], result.stdout + result.stderr
    assert not list(tmp_path.glob("IMPORTED*"))


@pytest.mark.slow
def test_torchrun_ranks_never_import_from_the_working_directory(tmp_path):
    work, marker = tmp_path / "work", tmp_path / "IMPORTED"
    work.mkdir()
    command = [sys.executable, "-P", "-m", "attnspec", "train", str(ROOT / "specs" / "softmax-transformer.yaml"),
               "--set", "d_model=16", "--set", "layers[0].repeat=1", "--set", "max_len=16", "--set",
               "input.vocab_size=32", "--set", "position=learned", "--task", "mqar", "--task-set", "seq_len=16",
               "--task-set", "vocab_size=32", "--task-set", "num_kv_pairs=2", "--steps", "2", "--batch", "8",
               "--nproc", "2", "-o", str(tmp_path / "run")]
    _shadowing_modules(work, marker)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=work, env=_child_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list(tmp_path.glob("IMPORTED*"))


@pytest.mark.slow
def test_ray_tasks_never_import_from_the_working_directory(tmp_path):
    pytest.importorskip("ray", reason="the Ray runner is the optional extra attnspec[ray]")
    work, marker = tmp_path / "work", tmp_path / "IMPORTED"
    work.mkdir()
    path = write_sweep(tmp_path / "sweep.yaml", **ONE_RUN, train={"steps": 2, "eval_every": 0})
    code = ("import sys; sys.path.remove(''); from attnspec.ablation.ablate import ablate; "
            f"o = ablate({str(path)!r}, {str(tmp_path / 'runs')!r}, runner='ray', threads=1, report=False); "
            "print(len(o.failed), o.ran)")
    (work / "safetensors.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('shadowed')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=work,
                            env=_child_env())
    assert result.stdout.split()[-2:] == ["0", "1"], result.stdout + result.stderr[-3000:]
    assert not marker.exists()


@pytest.mark.parametrize("content", ["[" * 100_000, '{"format": 1, "runs": NaN}', "\xff\xfe", '{"format": 1, "sweep": {}, "runs": [{"key": "../../etc"}]}'])
def test_a_tampered_sweep_json_is_a_located_error(finished, tmp_path, content):
    """Finding 12: sweep.json nested 100,000 deep crashed `attnspec report`."""
    import shutil

    directory = tmp_path / "runs"
    shutil.copytree(finished, directory)
    (directory / "sweep.json").write_bytes(content.encode("utf-8", "surrogateescape") if content != "\xff\xfe"
                                           else b"\xff\xfe")
    with pytest.raises(RunError, match="sweep.json"):
        write_report(directory)
