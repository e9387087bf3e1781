"""Executing one run of a sweep, in whatever process a runner gives it (a local worker, a Ray task).

:func:`execute` trains the run into ``RUNS_DIR/runs/KEY``: it skips a finished run, resumes one with
a checkpoint, restarts one killed before its first checkpoint, and holds ``locks/KEY.lock`` while it
trains so that two sweeps never train the same run. Errors the user can fix (``AttnSpecError``) come
back as a failed outcome; anything else propagates, and the runner records it.

``python -m attnspec.ablation.execute`` is the local runner's worker: it reads one job as JSON on
stdin, writes progress as JSON lines on stdout and ends with the outcome line.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from pathlib import Path
from typing import Callable

from attnspec.ablation import runsdir
from attnspec.errors import AttnSpecError, TrainingDiverged
from attnspec.io import open_lock
from attnspec.training import rundir

PROGRESS_INTERVAL = 0.5
"""Seconds between two step events sent to the parent (evaluations are always sent)."""


def execute(runs_dir: str | Path, job: dict, threads: int,
            on_progress: Callable[[dict], None] = lambda event: None) -> dict:
    """Train (or resume, or skip) the run ``job`` (``key``, ``spec``, ``config``) with ``threads``
    intra-op threads; returns ``{"key", "status": done|diverged|failed|busy, "metrics"?, "error"?, "from_step"}``."""
    import torch

    from attnspec.training.loop import train

    runs_dir = Path(runs_dir)
    key = job["key"]
    torch.set_num_threads(max(1, threads))
    try:
        lock = open_lock(runs_dir / "locks" / f"{key}.lock")  # never truncates, never follows a link
    except AttnSpecError as error:
        return {"key": key, "status": "failed", "error": str(error), "from_step": None}
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {"key": key, "status": "busy", "error": "another process is training this run"}
        where = runsdir.run_directory(runs_dir, key)
        current = runsdir.state(runs_dir, key)
        if current == "done":
            return {"key": key, "status": "done", "metrics": runsdir.result(runs_dir, key), "from_step": None}
        if current == "diverged":  # a run is a pure function of (spec, configuration): it would diverge again
            return {"key": key, "status": "diverged", "error": runsdir.divergence(runs_dir, key), "from_step": None}
        if current == "unstarted" and not rundir.discard_unstarted(where):
            return {"key": key, "status": "failed", "error": f"{where} holds files attnspec did not write; move "
                                                             "them away to let the run start again"}
        resume = current == "resumable"
        throttle = _Throttle(on_progress)
        try:
            run = train(None if resume else job["spec"], None if resume else job["config"], output=where,
                                 resume=resume, on_progress=throttle)
        except TrainingDiverged as error:
            return {"key": key, "status": "diverged", "error": str(error), "from_step": throttle.start}
        except AttnSpecError as error:
            return {"key": key, "status": "failed", "error": str(error), "from_step": throttle.start}
        return {"key": key, "status": "done", "metrics": {"step": run.step, **run.metrics}, "from_step": throttle.start}
    finally:
        lock.close()


class _Throttle:
    """Forwards the trainer's records as run events, at most one step every PROGRESS_INTERVAL."""

    def __init__(self, send: Callable[[dict], None]):
        self.send, self.last, self.start = send, 0.0, None

    def __call__(self, record: dict) -> None:
        event = record.get("event")
        if event == "start":
            self.start = record["step"]
        now = time.monotonic()
        if event == "step" and now - self.last < PROGRESS_INTERVAL and record["step"] != record.get("steps"):
            return
        self.last = now
        keep = ("event", "step", "steps", "loss", "accuracy", "perplexity", "split", "parameters", "tokens_per_s")
        self.send({k: v for k, v in record.items() if k in keep})


def log_line(event: dict) -> str:
    """One progress event (as :class:`_Throttle` sends it) or outcome as a line of the run's log."""
    if "status" in event:  # the outcome
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in (event.get("metrics") or {}).items()
                            if isinstance(v, (int, float)))
        return f"{event['status']}" + (f": {metrics}" if metrics else "") + (f": {event['error']}"
                                                                             if event.get("error") else "")
    kind = event.get("event")
    if kind == "start":
        return f"training {event.get('parameters', 0):,} parameters from step {event.get('step')}"
    if kind == "step":
        return (f"step {event.get('step')}/{event.get('steps')}: loss {event.get('loss', float('nan')):.4f}, "
                f"{event.get('tokens_per_s', 0):,.0f} tokens/s")
    if kind == "eval":
        return (f"{event.get('split', 'test')} at step {event.get('step')}: accuracy {event.get('accuracy', 0):.4f}, "
                f"perplexity {event.get('perplexity', float('nan')):.4g}")
    return json.dumps(event)


def main() -> None:
    """The local worker: one job from stdin, events and the outcome on stdout (the runner's), and each as a
    readable line on stderr, which the runner writes to the run's ``logs/KEY.log`` as it goes."""
    request = json.loads(sys.stdin.read())
    out = sys.stdout

    def send(event: dict) -> None:
        out.write(json.dumps({"progress": event}) + "\n")
        out.flush()
        print(log_line(event), file=sys.stderr, flush=True)

    outcome = execute(request["runs_dir"], request["job"], request["threads"], send)
    print(log_line(outcome), file=sys.stderr, flush=True)
    out.write(json.dumps({"outcome": outcome}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
