"""A sweep's results as data: a runs directory read into a :class:`Report` (no matplotlib, no files written).

:func:`collect` reads the runs directory (:mod:`attnspec.ablation.runsdir`): every run's status
(done, diverged, failed, unfinished), final metric, curve and speed, then groups the runs by
(variant, task point) and picks each group's best learning rate: the one with the best mean over
seeds (Zoology's protocol), among finished runs (a diverged run has no metric and is never chosen).
The metric is the sweep's ``metric`` or the task's own. :func:`summary_rows` and :func:`lr_table`
are the tables as text, which the terminal, Markdown and HTML renderings share
(:mod:`attnspec.ablation.report`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from attnspec.ablation import runsdir
from attnspec.ablation.runsdir import params_text
from attnspec.io import MAX_JSON_BYTES, json_lines
from attnspec.training.tasks.base import learned

HIGHER_IS_BETTER = {"accuracy": True, "perplexity": False, "loss": False}
MAX_CURVE_POINTS = 400


@dataclass
class RunRow:
    """One run as the report sees it."""

    key: str
    variant: str
    task: str
    task_params: dict
    seed: int
    lr: float
    status: str
    metric: float | None
    parameters: int | None
    state_size: int | None
    tokens_per_s: float | None
    error: str | None = None
    curve: list[tuple[int, float]] = field(default_factory=list, repr=False)
    modes: list[str] = field(default_factory=list)
    """The full mode of every block: as trained (result.json), else as planned (the sweep's estimate)."""

    @property
    def directory(self) -> str:
        return f"runs/{self.key}"


class LrResult(NamedTuple):
    """One learning rate's runs of a (variant, task point): their mean, how many finished, and the
    worst and best seed (None where none finished), so the by-lr table shows a spread beside its mean."""

    mean: float | None
    seeds: int
    worst: float | None = None
    best: float | None = None


@dataclass
class ResultRow:
    """One (variant, task point) at its best learning rate."""

    variant: str
    task: str
    task_params: dict
    lr: float | None
    mean: float | None
    std: float | None
    worst: float | None
    """The worst seed's metric (a "black swan" seed shows here, far from the mean)."""
    best: float | None
    seeds: int
    parameters: int | None
    state_size: int | None
    tokens_per_s: float | None
    runs: list[str]
    by_lr: dict[float, LrResult]
    """lr -> its mean over finished seeds, their count, worst and best."""
    chance: float | None = None
    """The task point's chance accuracy (:meth:`~attnspec.training.tasks.base.Task.chance`), if any."""
    per_seed: list[tuple[int, float | None]] = field(default_factory=list)
    """(seed, metric) of every run at the chosen learning rate, by seed (None: the run did not finish), so
    a reader can check any one run."""

    @property
    def learned(self) -> bool | None:
        """False when the mean is within noise of chance: below chance + max(NOISE, 2 seed stds)."""
        return learned(self.mean, self.chance, self.std or 0.0)


@dataclass
class Report:
    """Everything the report shows, computed from a runs directory."""

    directory: Path
    sweep: dict
    metric: str
    runs: list[RunRow]
    results: list[ResultRow]
    difficulty: dict[str, str | None]
    machine: dict
    plots: list[str] = field(default_factory=list)

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(row.variant for row in self.results))

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(row.task for row in self.results))


def collect(directory: str | Path) -> Report:
    """Read a runs directory into a :class:`Report` (raises RunError if it is not one)."""
    from attnspec.ablation.sweep import LoadedSweep, Sweep, difficulty_axis
    from attnspec.spec.source import Position, SourceMap
    from attnspec.spec.validate import validate_model

    directory = Path(directory)
    record = runsdir.read(directory)
    where = SourceMap(root=Position(f"{directory / runsdir.SWEEP_FILE} (its recorded sweep)"))
    sweep = validate_model(Sweep, record["sweep"], where, what="sweep")
    metrics = {entry.task.metric for entry in sweep.tasks}
    metric = sweep.metric or (metrics.pop() if len(metrics) == 1 else "loss")
    runs = [_run_row(directory, run, metric) for run in record["runs"]]
    difficulty = {entry.name or entry.task.kind: difficulty_axis(entry) for entry in sweep.tasks}
    machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
    results = _results(runs, metric)
    if metric == "accuracy":
        chances = _chances(LoadedSweep(sweep, None, where))
        for row in results:
            row.chance = chances.get((row.task, json.dumps(row.task_params, sort_keys=True)))
    return Report(directory, record["sweep"], metric, runs, results, difficulty, machine)


def _chances(loaded) -> dict[tuple[str, str], float | None]:
    """(task name, task point as JSON) -> the point's chance accuracy on the sweep's test set."""
    from attnspec.ablation.sweep import task_points

    sweep = loaded.sweep
    examples = sweep.train.model_dump(by_alias=True).get("test_examples") or 512
    chances = {}
    for index, name, params, data in task_points(loaded):
        task = type(sweep.tasks[index].task).model_validate(data)
        chances[(name, json.dumps(params, sort_keys=True))] = task.chance(sweep.seeds[0], examples)
    return chances


# --------------------------------------------------------------------------- collecting


def _run_row(directory: Path, run: dict, metric: str) -> RunRow:
    key = run["key"]
    estimate = {name: value for name, value in (run.get("estimate") or {}).items()
                if isinstance(value, int) and not isinstance(value, bool)}
    result = runsdir.result(directory, key)
    failure = runsdir.failure(directory, key)
    status = runsdir.state(directory, key) if runsdir.run_directory(directory, key).exists() else "new"
    if failure is not None and status not in ("done", "diverged"):
        status = "failed"
    history = _metrics_lines(runsdir.run_directory(directory, key) / "metrics.jsonl")
    speeds = [r["tokens_per_s"] for r in history if r.get("split") == "train" and isinstance(r.get("tokens_per_s"), (int, float))]
    curve = [(r["step"], r["loss"]) for r in history if r.get("split") == "train"
             and isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    if len(curve) > MAX_CURVE_POINTS:
        stride = math.ceil(len(curve) / MAX_CURVE_POINTS)
        curve = curve[::stride] + [curve[-1]]
    value = result.get(metric) if result and status == "done" else None
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    error = failure.get("error") if failure and status == "failed" else None
    if status == "diverged":
        error = runsdir.divergence(directory, key)
    return RunRow(key, str(run.get("variant")), str(run.get("task")), dict(run.get("task_params") or {}),
                  int(run.get("seed", 0)), float(run.get("lr", 0)), status,
                  float(value) if finite else None, estimate.get("parameters"),
                  estimate.get("state_size"), statistics.median(speeds[1:] or speeds) if speeds else None,
                  str(error) if error is not None else None, curve, _modes(result, run.get("estimate")))


def _modes(result: dict | None, estimate: object) -> list[str]:
    """The modes a run trained with (its result.json's plan), else those its sweep planned; strings only."""
    trained = result.get("plan") if isinstance(result, dict) else None
    for plan in (trained, estimate):
        modes = plan.get("modes") if isinstance(plan, dict) else None
        if isinstance(modes, list) and all(isinstance(mode, str) and len(mode) <= 40 for mode in modes):
            return modes[:1000]
    return []


def _metrics_lines(path: Path) -> list[dict]:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_JSON_BYTES:
        return []
    return [record for record in json_lines(path.read_text(errors="replace"))
            if type(record.get("step")) is int and 0 <= record["step"] <= 1 << 40]


def _results(runs: list[RunRow], metric: str) -> list[ResultRow]:
    """Group runs by (variant, task point), pick the best learning rate, average over seeds."""
    groups: dict[tuple, list[RunRow]] = {}
    for run in runs:
        groups.setdefault((run.variant, run.task, json.dumps(run.task_params, sort_keys=True)), []).append(run)
    better = max if HIGHER_IS_BETTER[metric] else min
    rows = []
    for (variant, task, _), members in groups.items():
        by_lr: dict[float, list[RunRow]] = {}
        for run in members:
            by_lr.setdefault(run.lr, []).append(run)
        means = {lr: _mean([r.metric for r in group if r.metric is not None]) for lr, group in by_lr.items()}
        finished = {lr: mean for lr, mean in means.items() if mean is not None}
        best = better(finished, key=finished.get) if finished else None
        chosen = by_lr[best] if best is not None else members
        values = [r.metric for r in chosen if r.metric is not None]
        speeds = [r.tokens_per_s for r in chosen if r.tokens_per_s is not None]
        ordered = sorted(values, reverse=HIGHER_IS_BETTER[metric])  # best first
        rows.append(ResultRow(variant, task, members[0].task_params, best, _mean(values),
                              statistics.stdev(values) if len(values) > 1 else None,
                              ordered[-1] if ordered else None, ordered[0] if ordered else None, len(values),
                              members[0].parameters, members[0].state_size, _mean(speeds),
                              [r.directory for r in chosen],
                              {lr: _lr_result(group, metric) for lr, group in by_lr.items()},
                              per_seed=sorted((r.seed, r.metric) for r in chosen)))
    return rows


def _lr_result(group: list[RunRow], metric: str) -> LrResult:
    values = sorted((r.metric for r in group if r.metric is not None), reverse=HIGHER_IS_BETTER[metric])
    return LrResult(_mean(values), len(values), values[-1] if values else None, values[0] if values else None)


def run_counts(report: Report) -> dict[str, int]:
    """How many runs are done, diverged, failed and unfinished."""
    counts = {"done": 0, "diverged": 0, "failed": 0, "unfinished": 0}
    for run in report.runs:
        counts[run.status if run.status in counts else "unfinished"] += 1
    return counts


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


# --------------------------------------------------------------------------- tables


def format_value(value: float | None, std: float | None = None, metric: str = "accuracy") -> str:
    """``0.9123 ± 0.0100`` (accuracy to 4 digits, perplexity and loss to 4 significant digits)."""
    if value is None:
        return "—"
    text = f"{value:.4f}" if metric == "accuracy" else f"{value:.4g}"
    if std is not None:
        text += f" ± {std:.4f}" if metric == "accuracy" else f" ± {std:.3g}"
    return text


def summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The headline table (header, rows): variant, task, task point, metric at best lr, lr, seeds,
    parameters, state size, tokens/s. The CLI prints it; results.md and report.html contain it."""
    header = ["variant", "task", "point", f"{report.metric} (mean ± std)", "chance", "worst / best seed", "per seed",
              "best lr", "seeds", "parameters", "state size", "tokens/s"]
    rows = []
    for row in report.results:
        spread = f"{format_value(row.worst, None, report.metric)} / {format_value(row.best, None, report.metric)}" \
            if row.seeds > 1 else "—"
        value = format_value(row.mean, row.std, report.metric) + (" not learned" if row.learned is False else "")
        rows.append([row.variant, row.task, params_text(row.task_params), value,
                     format_value(row.chance, None, report.metric), spread, per_seed_text(row, report.metric),
                     f"{row.lr:g}" if row.lr is not None else "—", str(row.seeds),
                     f"{row.parameters:,}" if row.parameters is not None else "—",
                     f"{row.state_size:,}" if row.state_size is not None else "—",
                     f"{row.tokens_per_s:,.0f}" if row.tokens_per_s is not None else "—"])
    return header, rows


def per_seed_text(row: ResultRow, metric: str) -> str:
    """Each seed's value at the chosen learning rate, ``s0 0.981 · s1 0.975`` (``—`` for a run that did not finish)."""
    return " · ".join(f"s{seed} {format_value(value, None, metric) if value is not None else '—'}"
                      for seed, value in row.per_seed) or "—"


def lr_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Every learning rate's mean with its worst and best seed, ``0.7706 (0.5112 / 0.9385) *``, the
    chosen rate starred (header, rows)."""
    lrs = sorted({lr for row in report.results for lr in row.by_lr})
    header = ["variant", "task", "point", *(f"lr {lr:g}: mean (worst / best)" for lr in lrs)]
    rows = [[row.variant, row.task, params_text(row.task_params),
             *(_lr_cell(row.by_lr[lr], report.metric) + ("" if lr != row.lr else " *")
               if lr in row.by_lr else "" for lr in lrs)] for row in report.results]
    return header, rows


def _lr_cell(result: LrResult, metric: str) -> str:
    text = format_value(result.mean, None, metric)
    if result.seeds > 1:
        text += f" ({format_value(result.worst, None, metric)} / {format_value(result.best, None, metric)})"
    return text
