"""The runs directory of a sweep: what ``attnspec ablate`` writes and ``attnspec report`` reads.

Layout (JSON written atomically; nothing pickled)::

    RUNS_DIR/
      sweep.json          format, versions, machine, the sweep as data and its runs (key, variant,
                          task, task parameters, seed, learning rate), rewritten at each `ablate`
      sweep.yaml          the sweep file as given
      runs/KEY/           one `attnspec train` run directory per run (see attnspec.training.rundir)
      failures/KEY.json   the error of a run that failed (removed when it later succeeds)
      logs/KEY.log        what a run's process printed (local runner)
      locks/KEY.lock      held (flock) by the process training KEY, so two sweeps never train one run
      events.jsonl        one line per run started, resumed, finished or failed, with times
      report/             results.csv, results.md, report.html, plots/ (attnspec.ablation.report)

A directory is a runs directory when its sweep.json says so; ``ablate`` refuses any other
non-empty directory, and removes nothing but the scratch of runs that never reached a checkpoint.
A runs directory may come from someone else: every write and delete refuses links and entries
attnspec did not write (:mod:`attnspec.io`), and every file read is bounded and checked.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from attnspec.errors import RunError
from attnspec.io import VERSION, check_directory, ensure_directory, json_lines, open_append, read_json, write_atomic
from attnspec.training import rundir

FORMAT = 1
SWEEP_FILE = "sweep.json"
SUBDIRECTORIES = ("runs", "failures", "logs", "locks")


def machine() -> dict:
    """What the numbers were measured on."""
    import torch

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "attnspec": VERSION,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def prepare(directory: Path, sweep_data: dict, sweep_text: str, runs: list[dict]) -> None:
    """Create (or take up again) the runs directory and record the sweep and its runs."""
    if directory.exists() or directory.is_symlink():
        if not directory.is_dir():
            raise RunError(f"{directory}: exists and is not a directory")
        if any(directory.iterdir()) and not (directory / SWEEP_FILE).is_file():
            raise RunError(f"{directory}: exists, is not empty and is not a runs directory; choose a new one")
        if (directory / SWEEP_FILE).is_file():
            read(directory)  # refuses a sweep.json of another format
    ensure_directory(directory)
    for sub in SUBDIRECTORIES:
        ensure_directory(directory / sub)  # a link in their place is refused: nothing is written through it
    record = {"format": FORMAT, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
              "sweep": sweep_data, "runs": runs}
    write_atomic(directory / SWEEP_FILE, json.dumps(record, indent=1) + "\n")
    if sweep_text:
        write_atomic(directory / "sweep.yaml", sweep_text)


def read(directory: Path) -> dict:
    """The sweep.json of a runs directory."""
    if not directory.is_dir():
        raise RunError(f"{directory}: no such runs directory")
    record = read_json(directory / SWEEP_FILE)
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("runs"), list) \
            or not isinstance(record.get("sweep"), dict):
        raise RunError(f"{directory}/{SWEEP_FILE}: not a runs file of format {FORMAT} written by attnspec ablate")
    for run in record["runs"]:
        if not (isinstance(run, dict) and _is_key(run.get("key")) and isinstance(run.get("variant"), str)
                and isinstance(run.get("task"), str) and isinstance(run.get("task_params"), dict)
                and isinstance(run.get("seed"), int) and isinstance(run.get("lr"), (int, float))
                and isinstance(run.get("estimate", {}), dict)):
            raise RunError(f"{directory}/{SWEEP_FILE}: a run entry is malformed (each needs key, variant, task, "
                           "task_params, seed, lr)")
    return record


def run_directory(directory: Path, key: str) -> Path:
    if not _is_key(key):
        raise RunError(f"not a run key: {key!r}")
    return directory / "runs" / key


def state(directory: Path, key: str) -> str:
    """``done`` (finished), ``diverged`` (stopped at a non-finite loss or gradient: a result, never
    retrained), ``resumable`` (has a checkpoint), ``unstarted`` (killed before its first checkpoint)
    or ``new``."""
    where = run_directory(directory, key)
    status = None
    if (where / rundir.RUN_FILE).is_file():
        try:
            status = rundir.read_run(where).get("status")
        except RunError:
            pass
    if status == "done" and (where / "result.json").is_file():
        return "done"
    if status == "diverged":
        return "diverged"
    if (where / rundir.CHECKPOINT_POINTER).is_file():
        return "resumable"
    return "unstarted" if where.exists() or where.is_symlink() else "new"


def divergence(directory: Path, key: str) -> str:
    """What a diverged run's run.json says of it, as one line."""
    try:
        run = rundir.read_run(run_directory(directory, key))
    except RunError as error:
        return str(error)
    diverged = run.get("diverged") if isinstance(run.get("diverged"), dict) else {}
    return f"diverged at step {diverged.get('step', '?')} ({diverged.get('reason', 'a non-finite value')})"


def result(directory: Path, key: str) -> dict | None:
    """The final evaluation of a finished run (``result.json``), or None."""
    try:
        data = read_json(run_directory(directory, key) / "result.json")
    except RunError:
        return None
    return data if isinstance(data, dict) else None


def failure(directory: Path, key: str) -> dict | None:
    """The recorded error of a failed run, or None."""
    path = directory / "failures" / f"{key}.json"
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except RunError:
        return None
    return data if isinstance(data, dict) else None


def record_failure(directory: Path, key: str, message: str, log_tail: str = "") -> None:
    write_atomic(directory / "failures" / f"{key}.json",
                 json.dumps({"key": key, "error": message, "log": log_tail, "time": time.time()}, indent=1))


def clear_failure(directory: Path, key: str) -> None:
    path = directory / "failures" / f"{key}.json"
    check_directory(path.parent)
    path.unlink(missing_ok=True)  # a link here is removed as a link: what it points to is untouched


def log_event(directory: Path, record: dict) -> None:
    """Append one line to events.jsonl (never through a link)."""
    with open_append(directory / "events.jsonl") as handle:
        handle.write(json.dumps({"time": time.time(), **record}) + "\n")


def events(directory: Path) -> list[dict]:
    """Every complete line of events.jsonl."""
    path = directory / "events.jsonl"
    if path.is_symlink() or not path.is_file():
        return []
    return json_lines(path.read_text(errors="replace"))


def params_text(params: dict) -> str:
    """A run's task point as text (``num_kv_pairs=4 seq_len=64``): how reports and diagnostics label runs."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def _is_key(key: Any) -> bool:
    return isinstance(key, str) and len(key) == 16 and all(c in "0123456789abcdef" for c in key)
