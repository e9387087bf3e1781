"""Accuracy against the memory span an answer needs (GateLoop's Fig. 7), for trained runs whose
task says how far back each answer reaches (:meth:`Task.answer_spans`; Memory Horizon: the list
since the last reset).

Runs are grouped by label (a sweep's variant, else the run directory's name); each group reports,
per span bin, the mean and spread over its runs (seeds) of the per-run accuracy in that bin.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnspec.diagnostics import Diagnostic, Parameter, Result, Table, output_option, output_directory
from attnspec.errors import AttnSpecError


@dataclass
class SpanRow:
    """One label's accuracy on the answers whose span is in [low, high]."""

    label: str
    low: int
    high: int
    answers: int
    """Answers in the bin, summed over the label's runs."""
    runs: int
    accuracy_mean: float
    accuracy_std: float


def correct_by_span(model: Any, inputs: Tensor, targets: Tensor, spans: Tensor, edges: list[int]
                    ) -> list[tuple[int, int]]:
    """(correct, answers) per bin [edges[i], edges[i+1]) of the answers' spans, for ``model`` on
    ``inputs`` (B, L) with ``targets`` (B, L) (``IGNORE`` where no answer)."""
    from attnspec.training.tasks import IGNORE

    with torch.no_grad():
        right = model(inputs).argmax(-1) == targets
    answered = targets != IGNORE
    found = []
    for low, high in zip(edges[:-1], edges[1:]):
        inside = answered & (spans >= low) & (spans < high)
        found.append((int((right & inside).sum()), int(inside.sum())))
    return found


def span_edges(length: int, width: int) -> list[int]:
    """Bin edges 1, 1 + width, ... covering spans 1..length."""
    return list(range(1, length + 1, width)) + [length + 1]


def diagnose(subjects: list[tuple[str, Any]], *, samples: int = 256, width: int = 16) -> list[SpanRow]:
    """Per label and span bin, the mean and std over runs of the accuracy. ``subjects``: (label,
    :class:`~attnspec.diagnostics.subject.Subject` of a trained run) pairs.

    Raises:
        AttnSpecError: a subject is not a trained run, or its task does not define answer spans.
    """
    per_label: dict[str, list[list[tuple[int, int]]]] = {}
    edges: list[int] | None = None
    for label, subject in subjects:
        if not subject.trained or subject.task is None:
            raise AttnSpecError(f"{label}: accuracy by span needs a trained run (an `attnspec train` or "
                                "`attnspec ablate` run directory) and its task, not a spec or a build directory")
        inputs, targets = subject.task.batch("test", 0, samples, subject.seed)
        spans = subject.task.answer_spans(inputs)
        if spans is None:
            raise AttnSpecError(f"{label}: the {subject.task.kind} task does not say how far back its answers "
                                "reach; accuracy by span is defined for memory_horizon")
        edges = edges or span_edges(inputs.shape[1], width)
        if edges[-1] != inputs.shape[1] + 1:
            raise AttnSpecError(f"{label}: its task's seq_len differs from the other runs'; compare runs of one task")
        per_label.setdefault(label, []).append(correct_by_span(subject.model(), inputs, targets, spans, edges))
    rows = []
    for label, runs in per_label.items():
        for index, (low, high) in enumerate(zip(edges[:-1], edges[1:])):
            counts = [run[index] for run in runs]
            accuracies = [correct / answers for correct, answers in counts if answers]
            if accuracies:
                rows.append(SpanRow(label, low, high - 1, sum(answers for _, answers in counts), len(accuracies),
                                    float(np.mean(accuracies)), float(np.std(accuracies))))
    return rows


def write(rows: list[SpanRow], out: Path, title: str) -> list[Path]:
    """``span.csv`` and the accuracy-against-span plot (PNG, SVG) in ``out``."""
    from attnspec.figures import pyplot, save_figure, write_csv

    output_directory(out)
    table = write_csv(out / "span.csv", ["label", "span_low", "span_high", "answers", "runs", "accuracy_mean",
                                         "accuracy_std"],
                      [[r.label, r.low, r.high, r.answers, r.runs, r.accuracy_mean, r.accuracy_std] for r in rows])
    plt = pyplot()
    figure, panel = plt.subplots(figsize=(5.5, 3.8))
    for label in dict.fromkeys(r.label for r in rows):
        mine = [r for r in rows if r.label == label]
        middles = [(r.low + r.high) / 2 for r in mine]
        means = np.array([r.accuracy_mean for r in mine])
        stds = np.array([r.accuracy_std for r in mine])
        panel.plot(middles, means, marker="o", markersize=3, label=label)
        panel.fill_between(middles, means - stds, means + stds, alpha=0.2)
    panel.set_xlabel("required memory span (positions since the last reset)")
    panel.set_ylabel("test accuracy")
    panel.grid(alpha=0.3)
    panel.legend(fontsize=8)
    panel.set_title(title, fontsize=10)
    return [table, *save_figure(figure, out, "span")]


# ----------------------------------------------------------------------------- the command


def run(sources: list[Path], output: Path, samples: int, width: int) -> Result:
    """``attnspec diagnose span``: accuracy by span bin, a column per run label."""
    from attnspec.diagnostics.subject import load_subjects

    rows = diagnose(load_subjects(sources), samples=samples, width=width)
    files = write(rows, output, "accuracy by required memory span")
    labels = list(dict.fromkeys(row.label for row in rows))
    table = []
    for low, high in dict.fromkeys((row.low, row.high) for row in rows):
        cells = {row.label: f"{row.accuracy_mean:.3f}" for row in rows if (row.low, row.high) == (low, high)}
        table.append([f"{low}–{high}", *(cells.get(label, "—") for label in labels)])
    return Result(Table("test accuracy by span (mean over runs)", ["span", *labels], table), files)


DIAGNOSTIC = Diagnostic(
    "span",
    "Accuracy against the memory span each answer needs (GateLoop's Fig. 7), per variant, mean ± std over its seeds.",
    (Parameter("sources", Path, "Runs directories (attnspec ablate) or run directories (attnspec train).",
               positional=True, many=True, metavar="RUNS..."),
     output_option("span.csv/.png/.svg"),
     Parameter("samples", int, "Test sequences of each run's task.", default=256, minimum=1, maximum=4096),
     Parameter("width", int, "Width of a span bin (positions).", default=16, flags=("--bin",), minimum=1,
               maximum=100_000)),
    run)
