"""Attention maps (cosFormer's Fig. 3): the attention matrix each block's mixer implies on real
inputs, drawn, and how close to the diagonal its weight sits.

The matrix comes from :func:`implied_attention` (V = I) on each block's own input in a forward pass,
so it is what the mixer computes, in its mode; for mixers without a normaliser the rows need not
sum to 1, and the locality numbers below use the absolute weights normalised per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnspec.diagnostics import SEED, Diagnostic, Parameter, Result, Table, output_option, output_directory
from attnspec.diagnostics.attention import implied_attention
from attnspec.diagnostics.subject import mixer_inputs


def block_attention(model: Any, inputs: Tensor) -> list[Tensor]:
    """Every block's implied attention on ``inputs``: [(B, H, L, L)] per block, float64."""
    return [implied_attention(block.mixer, x)[0].double()
            for block, x in zip(model.blocks, mixer_inputs(model, inputs))]


def locality(attention: Tensor, window: int) -> tuple[Tensor, Tensor]:
    """(B, H, L, L) -> per head (H,): the mean distance |i - j| under each row's weights, and the
    share of the weight within ``window`` positions of the diagonal (rows' |weights| normalised)."""
    weights = attention.abs()
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-300)
    L = attention.shape[-1]
    distance = (torch.arange(L).view(L, 1) - torch.arange(L).view(1, L)).abs().double()
    mean_distance = (weights * distance).sum(-1).mean((0, 2))
    near = (weights * (distance < window)).sum(-1).mean((0, 2))
    return mean_distance, near


@dataclass
class MapRow:
    """One head of one block of one model."""

    label: str
    layer: int
    head: int
    mean_distance: float
    near_diagonal: float


def diagnose(subjects: list[tuple[str, Any]], *, samples: int = 4, length: int | None = None, window: int = 8,
             seed: int = 0) -> tuple[list[MapRow], dict[str, list[Tensor]]]:
    """Locality rows for every (label, Subject) and the mean maps per label ([(H, L, L)] per block).
    Runs use their task's test inputs, specs random tokens of ``length`` (default: max_len)."""
    rows, maps = [], {}
    for label, subject in subjects:
        inputs = subject.inputs(samples, length, seed)
        attention = block_attention(subject.model(float64=True), inputs)
        maps[label] = [a.mean(0) for a in attention]
        for layer, a in enumerate(attention):
            distance, near = locality(a, window)
            rows += [MapRow(label, layer, head, float(distance[head]), float(near[head]))
                     for head in range(a.shape[1])]
    return rows, maps


def write(rows: list[MapRow], maps: dict[str, list[Tensor]], out: Path, window: int, title: str) -> list[Path]:
    """``maps.csv`` and the maps (one row of panels per model, one panel per block, head 0, each row of
    a map scaled to its largest weight; PNG, SVG)."""
    from attnspec.figures import pyplot, save_figure, write_csv

    output_directory(out)
    table = write_csv(out / "maps.csv", ["label", "layer", "head", "mean_distance", f"share_within_{window}"],
                      [[r.label, r.layer, r.head, r.mean_distance, r.near_diagonal] for r in rows])
    plt = pyplot()
    labels = list(maps)
    depth = max(len(blocks) for blocks in maps.values())
    figure, panels = plt.subplots(len(labels), depth, figsize=(2.6 * depth, 2.6 * len(labels)), squeeze=False)
    for row, label in enumerate(labels):
        for layer in range(depth):
            panel = panels[row][layer]
            panel.set_xticks([])
            panel.set_yticks([])
            if layer < len(maps[label]):
                head = maps[label][layer][0].abs()  # each row scaled to its largest weight: rows stay comparable
                panel.imshow((head / head.amax(-1, keepdim=True).clamp_min(1e-300)).numpy(), cmap="viridis")
                panel.set_title(f"block {layer}, head 0", fontsize=7)
        panels[row][0].set_ylabel(label, fontsize=8)
    figure.suptitle(title, fontsize=10)
    return [table, *save_figure(figure, out, "maps")]


# ----------------------------------------------------------------------------- the command


def run(sources: list[Path], output: Path, samples: int, length: int | None, window: int, seed: int) -> Result:
    """``attnspec diagnose maps``: maps of every block, and the locality of each, averaged over heads."""
    from attnspec.diagnostics.subject import load_subjects

    rows, maps = diagnose(load_subjects(sources), samples=samples, length=length, window=window, seed=seed)
    files = write(rows, maps, output, window, "attention maps (head 0, mean over inputs)")
    table = []
    for label, layer in dict.fromkeys((row.label, row.layer) for row in rows):
        mine = [row for row in rows if (row.label, row.layer) == (label, layer)]
        table.append([label, str(layer), f"{sum(r.mean_distance for r in mine) / len(mine):.1f}",
                      f"{sum(r.near_diagonal for r in mine) / len(mine):.3f}"])
    return Result(Table(f"locality per block, mean over heads (share of weight within {window} of the diagonal)",
                        ["model", "block", "mean |i - j|", "share near"], table, left=frozenset({"model"})), files)


DIAGNOSTIC = Diagnostic(
    "maps",
    "Every block's attention map on real inputs (cosFormer's Fig. 3) and how close to the diagonal its weight sits: "
    "the mean distance |i - j| and the share within --window positions.",
    (Parameter("sources", Path, "Spec files, run, runs or build directories (every finished run; an imported model).",
               positional=True, many=True, metavar="SOURCE..."),
     output_option("maps.csv/.png/.svg"),
     Parameter("samples", int, "Input sequences (a run's test inputs).", default=4, minimum=1, maximum=256),
     Parameter("length", int, "Tokens per sequence of a spec (default: max_len).", default=None, minimum=2,
               maximum=4096),
     Parameter("window", int, "Positions around the diagonal counted as near.", default=8, minimum=1, maximum=4096),
     SEED),
    run)
