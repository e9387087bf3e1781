"""Gates (GateLoop's Fig. 5): the state transitions a_t = |a_t| exp(i theta_t) a model applies at each
position, layer by layer, and their values at marked tokens (the Memory Horizon task's reset token,
where a data-controlled transition should learn to forget: |a| near 0).

Read from the mixers' transition modules (``data`` transitions vary with the input, ``fixed`` ones
do not); ALiBi's decay is a position scheme, not a transition, and is not included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnspec.diagnostics import (OVERRIDES, SEED, SUBJECT, Diagnostic, Parameter, Result, Table, output_option,
                                      output_directory)
from attnspec.diagnostics.subject import forward_with_hooks

QUANTILES = (0.05, 0.5, 0.95)


@dataclass
class GateRow:
    """The transition magnitudes (and phases) of one layer over one group of positions."""

    layer: int
    positions: str
    """``all``, ``marked`` (the marked token) or ``other``."""
    count: int
    """Positions (sample x token) in the group; each holds heads x width transitions."""
    magnitude_mean: float
    magnitude_quantiles: tuple[float, float, float]
    phase_abs_mean: float | None


def transitions(model: Any, inputs: Tensor) -> dict[int, tuple[Tensor, Tensor | None]]:
    """Block index -> (|a| (B, L, H*w), phase (B, L, H*w) or None), for every block with a transition."""
    captured: dict[int, tuple[Tensor, Tensor | None]] = {}
    handles = []
    for index, block in enumerate(model.blocks):
        transition = getattr(block.mixer, "transition", None)
        if transition is None:
            continue

        def hook(module, args, decay, index=index):
            if decay is not None:  # (B, H, L, w) -> (B, L, H*w)
                magnitude = decay.log_mag.detach().double().exp().permute(0, 2, 1, 3).flatten(2)
                phase = None if decay.phase is None else decay.phase.detach().double().permute(0, 2, 1, 3).flatten(2)
                captured[index] = (magnitude, phase)
        handles.append(transition.register_forward_hook(hook))
    forward_with_hooks(model, inputs, handles)
    return captured


def diagnose(model: Any, inputs: Tensor, marked_token: int | None = None) -> tuple[list[GateRow], dict]:
    """Statistics of every layer's transitions over all positions and, with ``marked_token``, over the
    positions holding it and the others. Returns the rows and the raw values (for the plot)."""
    captured = transitions(model, inputs)
    rows = []
    for layer, (magnitude, phase) in captured.items():
        B, L, _ = magnitude.shape
        groups = {"all": torch.ones(B, L, dtype=torch.bool)}
        if marked_token is not None and inputs.dtype == torch.long:
            groups["marked"] = inputs == marked_token
            groups["other"] = inputs != marked_token
        for name, mask in groups.items():
            values = magnitude[mask.to(magnitude.device)].flatten()
            if values.numel() == 0:
                continue
            quantiles = torch.quantile(values[: 1 << 24], torch.tensor(QUANTILES, dtype=values.dtype))
            phases = None if phase is None else float(phase[mask].abs().mean())
            rows.append(GateRow(layer, name, int(mask.sum()), float(values.mean()),
                                tuple(float(q) for q in quantiles), phases))
    return rows, captured


def write(rows: list[GateRow], captured: dict, inputs: Tensor, marked_token: int | None, out: Path,
          title: str) -> list[Path]:
    """``gates.csv`` and ``gates.png``/``.svg``: the magnitude's distribution per layer (all, marked) and,
    for the first sample, the mean |a| over channels at each position with the marked tokens shown."""
    from attnspec.figures import pyplot, save_figure, write_csv

    output_directory(out)
    table = write_csv(out / "gates.csv", ["layer", "positions", "count", "magnitude_mean", "magnitude_p05",
                                          "magnitude_p50", "magnitude_p95", "phase_abs_mean"],
                      [[row.layer, row.positions, row.count, row.magnitude_mean, *row.magnitude_quantiles,
                        row.phase_abs_mean] for row in rows])
    plt = pyplot()
    layers = list(captured)
    figure, panels = plt.subplots(2, max(len(layers), 1), figsize=(3.4 * max(len(layers), 1), 5.6), squeeze=False)
    for column, layer in enumerate(layers):
        magnitude = captured[layer][0]
        top, bottom = panels[0][column], panels[1][column]
        top.hist(magnitude.flatten().cpu().numpy(), bins=50, range=(0, 1), alpha=0.6, density=True, label="all")
        if marked_token is not None and inputs.dtype == torch.long and (inputs == marked_token).any():
            top.hist(magnitude[inputs == marked_token].flatten().cpu().numpy(), bins=50, range=(0, 1), alpha=0.6,
                     density=True, label=f"token {marked_token}")
        top.set_title(f"block {layer}", fontsize=9)
        top.set_xlabel("|a|")
        top.legend(fontsize=7)
        bottom.plot(magnitude[0].mean(-1).cpu().numpy(), linewidth=0.8)
        if marked_token is not None and inputs.dtype == torch.long:
            for t in (inputs[0] == marked_token).nonzero().flatten().tolist():
                bottom.axvline(t, color="red", alpha=0.4, linewidth=0.8)
        bottom.set_xlabel("position (sample 0; red: marked token)")
        bottom.set_ylabel("mean |a| over channels")
        bottom.set_ylim(0, 1.02)
    figure.suptitle(title, fontsize=10)
    return [table, *save_figure(figure, out, "gates")]


def default_marked_token(task: Any) -> int | None:
    """The token whose positions are reported apart: the Memory Horizon task's reset token."""
    if task is not None and getattr(task, "kind", None) == "memory_horizon":
        return task.max_number + 1
    return None


# ----------------------------------------------------------------------------- the command


def run(source: Path, output: Path, samples: int, length: int | None, token: int | None, seed: int,
        overrides: list[str]) -> Result:
    """``attnspec diagnose gates``: |a| by block, over all positions and at the marked token."""
    from attnspec.diagnostics.subject import load_subject
    from attnspec.errors import AttnSpecError

    subject = load_subject(source, overrides)
    marked = token if token is not None else default_marked_token(subject.task)
    inputs = subject.inputs(samples, length, seed)
    rows, captured = diagnose(subject.model(), inputs, marked)
    if not rows:
        raise AttnSpecError(f"{subject.spec.name} has no state transitions to show (no mixer has a `transition`)")
    files = write(rows, captured, inputs, marked, output, f"{subject.spec.name}: transitions "
                                                          f"({'trained' if subject.trained else 'initialisation'})")
    table = [[str(row.layer), row.positions, f"{row.count:,}", f"{row.magnitude_mean:.3f}",
              *(f"{q:.3f}" for q in row.magnitude_quantiles),
              "—" if row.phase_abs_mean is None else f"{row.phase_abs_mean:.3f}"] for row in rows]
    return Result(Table("|a| by layer", ["block", "positions", "count", "mean", "p05", "p50", "p95", "mean |phase|"],
                        table, left=frozenset({"positions"})), files)


DIAGNOSTIC = Diagnostic(
    "gates",
    "The transitions |a_t| and phases of every layer: quantiles over all positions and at a marked token (GateLoop's "
    "Fig. 5: data-controlled gates close at reset tokens).",
    (SUBJECT, output_option("gates.csv/.png/.svg"),
     Parameter("samples", int, "Input sequences.", default=16, minimum=1, maximum=4096),
     Parameter("length", int, "Tokens per sequence (a spec's default: max_len; a run uses its task's).", default=None,
               minimum=1),
     Parameter("token", int, "Report the positions holding this token id apart (default for Memory Horizon runs: the "
                             "reset token).", default=None, minimum=0),
     SEED, OVERRIDES),
    run)
