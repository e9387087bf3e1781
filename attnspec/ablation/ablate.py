"""``attnspec ablate``: validate a whole sweep, then run what is not done yet, then report.

:func:`plan_sweep` does everything that needs no training: it validates every variant and task point
(:mod:`attnspec.ablation.sweep`), estimates each run (:mod:`attnspec.ablation.estimate`) and, given a
runs directory, says which runs are done, resumable or new. ``--dry-run`` prints that plan.
:func:`ablate` then runs the runs that are not done on a runner (:mod:`attnspec.ablation.runners`),
records each outcome in the runs directory (:mod:`attnspec.ablation.runsdir`) and writes the report.
A failing run does not stop the sweep: its error is recorded and the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from attnspec.ablation import runsdir
from attnspec.ablation.runners import EventCallback, make_runner
from attnspec.ablation.estimate import Estimator, RunEstimate
from attnspec.ablation.sweep import LoadedSweep, PlannedRun, Variant, expand, load_sweep, resolve_variants


@dataclass
class SweepPlan:
    """A validated sweep: its variants, runs, estimates and (with a runs directory) the runs' states."""

    loaded: LoadedSweep
    variants: list[Variant]
    runs: list[PlannedRun]
    estimates: dict[str, RunEstimate]
    states: dict[str, str] = field(default_factory=dict)
    """key -> done | resumable | unstarted | new (all new without a runs directory)."""

    @property
    def unique_runs(self) -> list[PlannedRun]:
        """One run per key (two variants that resolve to the same model train once)."""
        return list({run.key: run for run in self.runs}.values())

    @property
    def todo(self) -> list[PlannedRun]:
        return [run for run in self.unique_runs if self.states.get(run.key, "new") not in ("done", "diverged")]

    def duplicates(self) -> list[tuple[str, str]]:
        """Pairs of variants that resolve to the same spec (so they are not an ablation of anything)."""
        first: dict[str, str] = {}
        pairs = []
        for variant in self.variants:
            key = repr(sorted(variant.differences))
            if key in first and (first[key], variant.name) not in pairs:
                pairs.append((first[key], variant.name))
            first.setdefault(key, variant.name)
        return pairs


@dataclass
class SweepOutcome:
    """What an `ablate` did."""

    directory: Path
    ran: int
    skipped: int
    failed: list[dict]
    seconds: float
    diverged: list[dict] = field(default_factory=list)
    """Runs that met a non-finite loss or gradient: recorded as results of their settings, never as the best."""
    busy: list[dict] = field(default_factory=list)
    """Runs another process (a concurrent ``ablate`` on the same directory) was training: not failures."""


def plan_sweep(source: str | Path | dict, output: str | Path | None = None) -> SweepPlan:
    """Validate and estimate every run of the sweep ``source``; with ``output``, read what is done.

    Raises:
        SpecError: any problem of the sweep, of any variant or task point, located in its file.
    """
    from attnspec.training.config import load_config

    loaded = load_sweep(source)
    variants = resolve_variants(loaded)
    runs = expand(loaded, variants)
    estimator = Estimator()
    estimates = {run.key: estimator(run.spec, load_config(run.config_data)) for run in runs}
    states = {}
    if output is not None and (Path(output) / runsdir.SWEEP_FILE).is_file():
        states = {run.key: runsdir.state(Path(output), run.key) for run in runs}
    return SweepPlan(loaded, variants, runs, estimates, states)


def ablate(source: str | Path | dict | SweepPlan, output: str | Path, *, runner: str = "local",
           workers: int | None = None, threads: int | None = None, address: str | None = None,
           on_event: EventCallback | None = None, report: bool = True) -> SweepOutcome:
    """Run every run of a sweep that is not done yet into the runs directory ``output``.

    Args:
        source: the sweep file, its data, or a :class:`SweepPlan` from :func:`plan_sweep`.
        output: the runs directory (created, or taken up again: finished runs are skipped and
            interrupted ones resume from their last checkpoint).
        runner: ``local`` (worker processes) or ``ray`` (tasks on the Ray cluster at ``address``).
        workers, threads: local worker processes and intra-op threads per run (default: workers x
            threads = this machine's cores).
        on_event: receives ``sweep_start``, ``run_start``, ``run_progress``, ``run_end`` and
            ``sweep_end`` events (the CLI draws its progress from them).
        report: write the report (:mod:`attnspec.ablation.report`) at the end.

    Raises:
        SpecError: the sweep is invalid (nothing is run or written).
        RunError: the runs directory cannot be used.
    """
    output = Path(output)
    plan = source if isinstance(source, SweepPlan) else plan_sweep(source)
    plan.states = {run.key: runsdir.state(output, run.key) for run in plan.runs} \
        if (output / runsdir.SWEEP_FILE).is_file() else {}  # what is done in *this* directory, now
    todo = plan.todo
    chosen = make_runner(runner, len(todo), workers, threads, address)  # a bad runner writes nothing
    sweep_data = plan.loaded.sweep.model_dump(mode="json", by_alias=True)
    runsdir.prepare(output, sweep_data, plan.loaded.text,
                    [{**run.to_json(), "estimate": plan.estimates[run.key].to_json()} for run in plan.runs])
    send = on_event or (lambda event: None)
    labels = {run.key: run.label for run in plan.runs}
    jobs = [{"key": run.key, "label": run.label, "spec": run.spec_data, "config": run.config_data,
             "steps": run.config_data["steps"]} for run in todo]
    send({"event": "sweep_start", "runs": len(plan.unique_runs), "todo": [job["key"] for job in jobs],
          "labels": labels, "steps": {job["key"]: job["steps"] for job in jobs}, "runner": chosen.name,
          "workers": getattr(chosen, "workers", None), "threads": chosen.threads,
          "estimates": {key: plan.estimates[key].seconds for key in labels}})
    ends: dict[str, list[dict]] = {"failed": [], "diverged": [], "busy": []}
    started = time.monotonic()

    def handle(event: dict) -> None:
        key = event.get("key")
        if event["event"] == "run_start":
            runsdir.log_event(output, {"event": "start", "key": key, "label": labels.get(key)})
        elif event["event"] == "run_end":
            _record_end(output, event, labels, ends)
        send({**event, "label": labels.get(key)})

    chosen.run(output, jobs, handle)
    seconds = time.monotonic() - started
    if report:
        from attnspec.ablation.report import write_report

        write_report(output)
    outcome = SweepOutcome(output, len(jobs), len(plan.unique_runs) - len(jobs), ends["failed"], seconds,
                           ends["diverged"], ends["busy"])
    send({"event": "sweep_end", "ran": outcome.ran, "skipped": outcome.skipped, "failed": len(outcome.failed),
          "diverged": len(outcome.diverged), "busy": len(outcome.busy), "seconds": seconds})
    return outcome


def _record_end(output: Path, event: dict, labels: dict, ends: dict[str, list[dict]]) -> None:
    """Write a finished run's outcome: clear or record its failure, and log it. A diverged run is a
    result (of its learning rate, say), and a run another process is training is that process's:
    neither is recorded as a failure."""
    key, status = event["key"], event.get("status")
    entry = {"key": key, "label": labels.get(key), "error": event.get("error")}
    if status in ("done", "diverged"):
        runsdir.clear_failure(output, key)
        if status == "diverged":
            ends["diverged"].append(entry)
    elif status == "busy":
        ends["busy"].append(entry)
    else:
        runsdir.record_failure(output, key, str(event.get("error", "unknown error")), str(event.get("log", "")))
        ends["failed"].append(entry)
    runsdir.log_event(output, {"event": "end", "key": key, "status": status, "from_step": event.get("from_step"),
                               "error": event.get("error")})

