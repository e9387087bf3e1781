"""How the CLI shows a sweep: the dry-run plan, progress while it runs, and the results table.

Rendering only (rich); the numbers come from :mod:`attnspec.ablation`.
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from attnspec.ablation.ablate import SweepPlan
from attnspec.ablation.estimate import format_flops, format_seconds
from attnspec.ablation.sweep import MISSING
from attnspec.cli.metrics import metrics_text

MAX_DIFFERENCES = 12
"""Differences printed per variant before `... and N more`."""


def describe_value(value) -> str:
    """A resolved spec value as the dry run prints it."""
    return "(absent)" if value == MISSING else repr(value) if isinstance(value, str) else str(value)


def print_plan(console: Console, plan: SweepPlan, workers: int) -> None:
    """The dry run: each variant's differences from the base, then one row per (variant, task point)."""
    sweep = plan.loaded.sweep
    points = len({(run.task, repr(run.task_params)) for run in plan.runs})
    console.print(f"sweep {sweep.name}: {len(plan.variants)} variant(s) x {points} task point(s) x "
                  f"{len(sweep.seeds)} seed(s) x {len(sweep.lr)} learning rate(s) = {len(plan.runs)} runs "
                  f"({len(plan.unique_runs)} distinct); every spec and task validated", markup=False)
    for variant in plan.variants:
        if not variant.differences:
            console.print(f"\nvariant {variant.name}: the base spec", markup=False)
            continue
        console.print(f"\nvariant {variant.name}: differs from the base in {len(variant.differences)} field(s)",
                      markup=False)
        for path, old, new in variant.differences[:MAX_DIFFERENCES]:
            console.print(f"  {path}: {describe_value(old)} -> {describe_value(new)}", markup=False)
        if len(variant.differences) > MAX_DIFFERENCES:
            console.print(f"  ... and {len(variant.differences) - MAX_DIFFERENCES} more", markup=False)
    for first, second in plan.duplicates():
        console.print(f"\nwarning: variants {first} and {second} resolve to the same model; they share their runs",
                      style="yellow", markup=False)
    table = Table(title="runs", title_justify="left")
    for column in ("variant", "task", "point", "runs", "parameters", "state size", "FLOPs / run", "est. time / run",
                   "status"):
        table.add_column(column, justify="left" if column in ("variant", "task", "point", "status") else "right")
    groups: dict[tuple, list] = {}
    for run in plan.runs:
        groups.setdefault((run.variant, run.task, repr(run.task_params)), []).append(run)
    total_seconds = 0.0
    for (variant, task, _), runs in groups.items():
        estimate = plan.estimates[runs[0].key]
        states = Counter(plan.states.get(run.key, "new") for run in runs)
        total_seconds += sum(plan.estimates[run.key].seconds for run in runs if plan.states.get(run.key) != "done")
        cells = [variant, task, " ".join(f"{k}={v}" for k, v in runs[0].task_params.items()), str(len(runs)),
                 f"{estimate.parameters:,}", f"{estimate.state_size:,}", format_flops(estimate.flops),
                 format_seconds(estimate.seconds), ", ".join(f"{n} {s}" for s, n in states.items())]
        table.add_row(*map(Text, cells))  # Text: a variant named `linear[heads=2]` is not markup
    console.print()
    console.print(table)
    todo = len(plan.todo)
    console.print(f"{todo} run(s) to do; estimated {format_seconds(total_seconds)} of training "
                  f"(~{format_seconds(total_seconds / max(workers, 1))} on {workers} worker(s); cost-model estimate, "
                  "not a measurement)", markup=False)


class SweepProgress:
    """An overall bar (runs done, running, failed, ETA) and one line per running run; plain lines
    when the output is not a terminal."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = None
        self.overall = None
        self.rows: dict[str, int] = {}
        self.steps: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.counts = Counter()
        self.total_runs = 0

    def __enter__(self) -> "SweepProgress":
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), console=self.console)
            self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def _summary(self) -> str:
        return (f"runs {self.counts['done']}/{self.total_runs} done, {self.counts['running']} running, "
                f"{self.counts['failed']} failed, {self.counts['diverged']} diverged, {self.counts['busy']} elsewhere")

    def update(self, event: dict) -> None:
        kind, key = event["event"], event.get("key")
        if kind == "sweep_start":
            self.steps = dict(event["steps"])
            self.total_runs = len(event["todo"])
            self.console.print(f"{event['runs']} run(s) in the sweep, {len(event['todo'])} to do, on the "
                               f"{event['runner']} runner ({event['workers'] or 'Ray'} worker(s) x "
                               f"{event['threads']} thread(s))", markup=False)
            if self.progress is not None:
                self.overall = self.progress.add_task(self._summary(), total=sum(self.steps.values()) or 1)
        elif kind == "run_start":
            self.counts["running"] += 1
            if self.progress is not None:
                self.rows[key] = self.progress.add_task(escape(f"  {event.get('label')}"), total=self.steps.get(key, 1))
            else:
                self.console.print(f"started  {event.get('label')}", markup=False)
        elif kind == "run_progress":
            record = event["record"]
            if "step" in record:
                self.done[key] = record["step"]
            if self.progress is not None and key in self.rows:
                text = escape(f"  {event.get('label')}")
                if record.get("event") == "step":
                    text += f"  loss {record['loss']:.3f}"
                self.progress.update(self.rows[key], completed=self.done.get(key, 0), description=text)
        elif kind == "run_end":
            self.counts["running"] -= 1
            status = event.get("status")
            status = status if status in ("done", "diverged", "busy") else "failed"
            self.counts[status] += 1
            self.done[key] = self.steps.get(key, 0)
            if self.progress is not None and key in self.rows:
                self.progress.remove_task(self.rows.pop(key))
            metrics = event.get("metrics") or {}
            first_line = str(event.get("error")).splitlines()[0] if event.get("error") else "?"
            detail = (metrics_text(metrics) if status == "done"
                      else first_line if status in ("diverged", "busy") else f"FAILED: {first_line}")
            word = {"done": "finished", "diverged": "diverged", "busy": "elsewhere", "failed": "failed  "}[status]
            self.console.print(f"{word} {event.get('label')}: {detail}",
                               style={"done": None, "busy": None, "diverged": "yellow"}.get(status, "red"),
                               markup=False)
        if self.progress is not None and self.overall is not None:
            self.progress.update(self.overall, completed=sum(self.done.values()), description=self._summary())
        elif kind == "run_end":
            self.console.print(self._summary(), markup=False)


def results_table(header: list[str], rows: list[list[str]], title: str) -> Table:
    """The report's summary table for the terminal."""
    table = Table(title=title, title_justify="left")
    for column in header:
        table.add_column(column, justify="left" if column in ("variant", "task", "point") else "right")
    for row in rows:
        table.add_row(*map(Text, row))
    return table
