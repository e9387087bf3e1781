"""Where a sweep's runs execute: local worker processes (the default) or tasks on a Ray cluster.

A runner takes jobs (``{"key", "label", "spec", "config", "steps"}``) and calls ``on_event`` with
``run_start``, ``run_progress`` (``record``: the trainer's start, step or evaluation record) and
``run_end`` (the outcome) events as they happen; both runners execute a job
with the same function (:func:`attnspec.ablation.execute.execute`), so they give the same results.

- :class:`LocalRunner`: one worker process per running run (``python -m attnspec.ablation.execute``),
  ``workers`` at a time, each with ``threads`` intra-op threads (workers x threads = cores by
  default). A process per run means a crash, a kill or an out-of-memory in one run fails that run
  only, and a killed sweep takes its workers with it.
- :class:`RayRunner`: each job is a Ray task (``num_cpus = threads``) on the cluster at
  ``address`` (or a local Ray instance); progress comes back through a small Ray actor. The runs
  directory must be reachable from every node (a shared file system).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import tempfile
from collections import deque
from pathlib import Path
from typing import Callable

from attnspec.errors import AttnSpecError, check_whole
from attnspec.io import open_append_binary, start_python

EventCallback = Callable[[dict], None]
LOG_TAIL = 4000


def cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


MAX_WORKERS = 256
"""The most local worker processes a sweep starts (each a Python process with torch: ~0.5 GB)."""
MAX_THREADS = 1024
"""The most intra-op threads a run is given."""


def sizing(runs: int, workers: int | None, threads: int | None) -> tuple[int, int]:
    """(workers, threads per run): by default as many workers as runs allow and cores / workers threads each.
    Given ones are checked first (an AttnSpecError naming the option)."""
    if workers is not None:
        check_whole("--workers", workers, 1, MAX_WORKERS)
    if threads is not None:
        check_whole("--threads", threads, 1, MAX_THREADS)
    total = cores()
    if workers is None:
        workers = max(1, min(runs, total // threads if threads else total))
    if threads is None:
        threads = max(1, total // workers)
    return workers, threads


class LocalRunner:
    """Runs jobs in worker processes on this machine."""

    name = "local"

    def __init__(self, workers: int, threads: int):
        self.workers, self.threads = workers, threads

    def run(self, runs_dir: Path, jobs: list[dict], on_event: EventCallback) -> None:
        pending = deque(jobs)
        running: dict[int, _Worker] = {}
        selector = selectors.DefaultSelector()
        try:
            while pending or running:
                while pending and len(running) < self.workers:
                    worker = _Worker(runs_dir, pending.popleft(), self.threads)
                    running[worker.fd] = worker
                    selector.register(worker.fd, selectors.EVENT_READ)
                    on_event({"event": "run_start", "key": worker.job["key"]})
                for selected, _ in selector.select(timeout=1.0):
                    worker = running[selected.fd]
                    for message in worker.read():
                        if "progress" in message:
                            on_event({"event": "run_progress", "key": worker.job["key"], "record": message["progress"]})
                    if worker.finished:
                        selector.unregister(worker.fd)
                        del running[worker.fd]
                        worker.process.stdout.close()  # thousands of runs must not leak a pipe each
                        on_event({"event": "run_end", **worker.outcome()})
        finally:
            for worker in running.values():
                worker.process.kill()
                worker.process.wait()
            selector.close()


class _Worker:
    """One run's worker process and what it printed."""

    def __init__(self, runs_dir: Path, job: dict, threads: int):
        self.job = job
        self.log_path = runs_dir / "logs" / f"{job['key']}.log"
        self.log = open_append_binary(self.log_path)
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        self.process = start_python("attnspec.ablation.execute", env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=self.log)
        request = {"runs_dir": str(runs_dir), "threads": threads,
                   "job": {k: job[k] for k in ("key", "spec", "config")}}
        try:
            self.process.stdin.write(json.dumps(request).encode())
            self.process.stdin.close()
        except BrokenPipeError:  # the worker died at start: its log says why, and the run fails alone
            pass
        self.fd = self.process.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = b""
        self.final: dict | None = None
        self.finished = False

    def read(self) -> list[dict]:
        """The complete messages available now (sets ``finished`` at end of output)."""
        messages = []
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return messages
        if not chunk:
            self.finished = True
            self.process.wait()
            self.log.close()
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                if "outcome" in message:
                    self.final = message["outcome"]
                messages.append(message)
        return messages

    def outcome(self) -> dict:
        if self.final is not None:
            return self.final
        tail = self.log_path.read_bytes()[-LOG_TAIL:].decode(errors="replace")
        reason = f"the worker exited with status {self.process.returncode}"
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        return {"key": self.job["key"], "status": "failed", "error": f"{reason}: {last}" if last else reason,
                "log": tail}


class RayRunner:
    """Runs jobs as Ray tasks (``pip install 'attnspec[ray]'``)."""

    name = "ray"

    def __init__(self, threads: int, address: str | None = None):
        try:
            import ray  # noqa: F401 - only to say how to install it
        except ImportError:
            raise AttnSpecError("--runner ray needs Ray: pip install 'attnspec[ray]'") from None
        self.threads, self.address = threads, address

    def run(self, runs_dir: Path, jobs: list[dict], on_event: EventCallback) -> None:
        import ray

        started_here = not ray.is_initialized()
        if started_here:
            local = self.address is None and "RAY_ADDRESS" not in os.environ
            # Ray puts the driver's working directory on every worker's sys.path unless the job has a
            # working_dir: an empty one keeps a received folder's `yaml.py` out of the workers
            # (PYTHONSAFEPATH does the same for the worker processes' own start-up).
            isolation = tempfile.mkdtemp(prefix="attnspec-ray-")
            try:  # a local instance gets this machine's cores; a cluster says what it has
                ray.init(address=self.address, num_cpus=cores() if local else None, include_dashboard=False,
                         log_to_driver=False, configure_logging=False,
                         runtime_env={"working_dir": isolation, "env_vars": {"PYTHONSAFEPATH": "1"}})
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise AttnSpecError(f"cannot reach a Ray cluster at {self.address or 'this machine'}: {error}") from None
            finally:
                shutil.rmtree(isolation, ignore_errors=True)  # Ray has packaged it
        runs_dir = runs_dir.resolve()  # tasks run in the job's working_dir, not here
        try:
            mailbox = ray.remote(num_cpus=0)(_Mailbox).remote()
            task = ray.remote(num_cpus=self.threads)(_ray_execute)
            refs = {task.remote(str(runs_dir), {k: job[k] for k in ("key", "spec", "config")}, self.threads,
                                mailbox): job["key"] for job in jobs}
            started: set[str] = set()

            def start(key: str) -> None:  # a task runs when the cluster has room: its first event says so
                if key not in started:
                    started.add(key)
                    on_event({"event": "run_start", "key": key})

            while refs:
                done, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                for key, record in ray.get(mailbox.take.remote()):
                    start(key)
                    on_event({"event": "run_progress", "key": key, "record": record})
                for ref in done:
                    key = refs.pop(ref)
                    start(key)
                    try:
                        outcome = ray.get(ref)
                    except Exception as error:  # noqa: BLE001 - a task that crashed: record it, go on
                        outcome = {"key": key, "status": "failed", "error": f"{type(error).__name__}: {error}"}
                    on_event({"event": "run_end", **outcome})
        finally:
            if started_here:
                ray.shutdown()


class _Mailbox:
    """A Ray actor holding progress events until the driver takes them. Tasks send with a
    fire-and-forget ``put.remote`` (a task blocked in ``ray.get`` would hand its CPU to another
    task, and more runs than cores would share the machine)."""

    def __init__(self) -> None:
        self.events: list = []

    def put(self, key: str, record: dict) -> None:
        self.events.append((key, record))

    def take(self) -> list:
        events, self.events = self.events, []
        return events


def _ray_execute(runs_dir: str, job: dict, threads: int, mailbox) -> dict:
    """The Ray task: execute one job, sending its progress to ``mailbox``."""
    from attnspec.ablation.execute import execute

    return execute(runs_dir, job, threads, lambda record: mailbox.put.remote(job["key"], record))


def make_runner(name: str, jobs: int, workers: int | None, threads: int | None, address: str | None):
    """The runner ``name`` (``local`` or ``ray``) sized for ``jobs`` runs."""
    if name == "local":
        if address is not None:
            raise AttnSpecError("--address is for --runner ray")
        return LocalRunner(*sizing(jobs, workers, threads))
    if name == "ray":
        return RayRunner(threads or 1, address)
    raise AttnSpecError(f"unknown runner {name!r}; use local or ray")


__all__ = ["LocalRunner", "RayRunner", "make_runner", "sizing", "cores"]
