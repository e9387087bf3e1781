"""Running sweeps: local workers and Ray give the same results, a failing run is recorded and does not
stop the others, a second `ablate` skips finished runs and runs only new ones, and a killed sweep
resumes each run from its last checkpoint and ends bit for bit where an uninterrupted sweep ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnspec.ablation import runsdir
from attnspec.ablation.ablate import ablate, plan_sweep
from attnspec.training.rundir import RunError
from tests.ablation.sweeps import sweep, write_sweep

pytestmark = pytest.mark.slow  # sweeps run in worker processes


def _results(directory: Path) -> dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text()) for path in (directory / "runs").glob("*/result.json")}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The toy sweep, run once with the local runner (2 workers x 1 thread)."""
    directory = tmp_path_factory.mktemp("sweep") / "runs"
    outcome = ablate(sweep(), directory, workers=2, threads=1)
    assert outcome.ran == 2 and not outcome.failed
    return directory


def test_local_sweep_trains_every_run_into_its_keyed_directory(finished: Path):
    plan = plan_sweep(sweep(), finished)
    assert set(_results(finished)) == {run.key for run in plan.runs}
    assert all(state == "done" for state in plan.states.values())
    for run in plan.runs:  # each run directory is an ordinary `attnspec train` run of that spec and config
        record = json.loads((runsdir.run_directory(finished, run.key) / "run.json").read_text())
        assert record["config"] == run.config_data and record["status"] == "done"
        log = (finished / "logs" / f"{run.key}.log").read_text().strip().splitlines()  # the run's own words
        assert log[0].startswith("training ") and any(line.startswith("step ") for line in log)
        assert log[-1].startswith("done: ")
    record = runsdir.read(finished)
    assert [run["key"] for run in record["runs"]] == [run.key for run in plan.runs]
    assert record["machine"]["torch"] and record["runs"][0]["estimate"]["parameters"] > 0


def test_a_second_ablate_skips_finished_runs_and_adding_a_variant_runs_only_it(finished: Path):
    before = _results(finished)
    again = ablate(sweep(), finished, workers=2, threads=1)
    assert again.ran == 0 and again.skipped == 2 and _results(finished) == before
    wider = sweep(variants={**sweep()["variants"], "heads4": {"blocks[*].mixer.heads": 4}})
    added = ablate(wider, finished, workers=2, threads=1)
    assert added.ran == 1 and added.skipped == 2 and not added.failed
    assert {k: v for k, v in _results(finished).items() if k in before} == before


def test_a_failing_run_is_recorded_and_the_others_finish(tmp_path: Path):
    directory = tmp_path / "runs"
    plan = plan_sweep(sweep())
    blocked = plan.runs[1].key
    mine = runsdir.run_directory(directory, blocked) / "notes.txt"  # a file the user put where a run goes
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    (directory / runsdir.SWEEP_FILE).write_text(json.dumps({"format": 1, "sweep": {}, "runs": []}))
    outcome = ablate(plan, directory, workers=2, threads=1)
    assert [failure["key"] for failure in outcome.failed] == [blocked] and outcome.ran == 2
    assert mine.read_text() == "mine"  # untouched
    assert "did not write" in runsdir.failure(directory, blocked)["error"]
    assert runsdir.state(directory, plan.runs[0].key) == "done"
    report = (directory / "report" / "results.md").read_text()
    assert "1 failed" in report and blocked in report
    mine.unlink()  # the user moves the file away: the next ablate runs the failed run and clears its failure
    outcome = ablate(sweep(), directory, workers=2, threads=1)
    assert outcome.ran == 1 and not outcome.failed and runsdir.failure(directory, blocked) is None


def test_a_run_killed_before_its_first_checkpoint_starts_again(finished: Path, tmp_path: Path):
    directory = tmp_path / "runs"
    plan = plan_sweep(sweep())
    for run in plan.runs:  # what a run writes before its first checkpoint, as a kill leaves it
        source, target = runsdir.run_directory(finished, run.key), runsdir.run_directory(directory, run.key)
        (target / "checkpoints" / ".step-000000010.tmp-1").mkdir(parents=True)
        for name in ("run.json", "spec.yaml", "config.yaml", "metrics.jsonl"):
            (target / name).write_bytes((source / name).read_bytes())
    (directory / runsdir.SWEEP_FILE).write_text(json.dumps({"format": 1, "sweep": {}, "runs": []}))
    assert {runsdir.state(directory, run.key) for run in plan.runs} == {"unstarted"}
    outcome = ablate(plan, directory, workers=2, threads=1, report=False)
    assert outcome.ran == 2 and not outcome.failed
    assert _results(directory) == {key: value for key, value in _results(finished).items() if key in _results(directory)}


def test_a_directory_that_is_not_a_runs_directory_is_refused(tmp_path: Path):
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(RunError, match="not a runs directory"):
        ablate(sweep(), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["photo.jpg"]


def test_killing_the_sweep_loses_at_most_the_work_since_each_checkpoint(tmp_path: Path):
    slow = {"steps": 300, "eval_every": 20}
    path = write_sweep(tmp_path / "s.yaml", train=slow)
    reference = ablate(sweep(train=slow), tmp_path / "reference", workers=2, threads=1, report=False)
    assert not reference.failed
    directory = tmp_path / "runs"
    command = [sys.executable, "-m", "attnspec", "ablate", str(path), "-o", str(directory), "--workers", "2",
               "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    keys = [run.key for run in plan_sweep(sweep(train=slow)).runs]
    deadline = time.monotonic() + 240
    checkpoints = {}
    while time.monotonic() < deadline and process.poll() is None:
        checkpoints = {key: _checkpoint_step(directory, key) for key in keys}
        # kill once every run has a checkpoint, or as soon as one run is far along: on a busy machine
        # one worker can start late, and the other must not finish before the kill
        if all(step >= 40 for step in checkpoints.values()) or any(step >= 200 for step in checkpoints.values()):
            break
        time.sleep(0.05)
    assert process.poll() is None, "the sweep finished before it could be killed: " + process.stderr.read().decode()
    os.killpg(process.pid, signal.SIGKILL)  # the sweep and its workers, at once
    process.wait()
    killed_at = {key: _checkpoint_step(directory, key) for key in keys}
    for key, step in killed_at.items():  # each run's log was written as it trained, not at its end
        if step:
            assert "step " in (directory / "logs" / f"{key}.log").read_text()
    assert all(step < 300 for step in killed_at.values())
    outcome = ablate(sweep(train=slow), directory, workers=2, threads=1, report=False)
    assert outcome.ran == 2 and not outcome.failed
    resumed = {event["key"]: event["from_step"] for event in runsdir.events(directory) if event["event"] == "end"}
    assert resumed == killed_at  # each run took up at its last checkpoint, not at 0
    assert _results(directory) == _results(tmp_path / "reference")  # and ended where the uninterrupted run did


def _checkpoint_step(directory: Path, key: str) -> int:
    pointer = runsdir.run_directory(directory, key) / "checkpoint.json"
    try:
        return json.loads(pointer.read_text())["step"]
    except (OSError, ValueError):
        return 0


def test_ray_runner_gives_the_local_runner_s_results(finished: Path, tmp_path: Path):
    pytest.importorskip("ray", reason="the Ray runner is the optional extra attnspec[ray]")
    outcome = ablate(sweep(), tmp_path / "ray", runner="ray", threads=1)
    assert outcome.ran == 2 and not outcome.failed
    local = {key: value for key, value in _results(finished).items() if key in _results(tmp_path / "ray")}
    assert _results(tmp_path / "ray") == local and len(local) == 2


def test_a_worker_that_crashes_fails_its_run_with_the_reason_from_its_log(tmp_path: Path):
    from attnspec.ablation.runners import LocalRunner

    for sub in ("logs", "locks", "runs"):
        (tmp_path / sub).mkdir()
    job = {"key": "0123456789abcdef", "label": "broken", "spec": 5, "config": {}, "steps": 1}  # not a spec: a bug path
    events = []
    LocalRunner(1, 1).run(tmp_path, [job], events.append)
    (end,) = [event for event in events if event["event"] == "run_end"]
    assert end["status"] == "failed" and "exited with status" in end["error"] and end["log"]
