"""Experts: how a mixture-of-experts model routes tokens, layer by layer.

For every block whose MLP is a mixture of experts (``mlp: {kind: moe}``): the tokens each expert
received over the inputs (its share of the routed slots), the load-balancing loss of that routing
(1 x top_k when balanced) and the share of the busiest expert, read from the MLP's own record of
its last call (:class:`attnspec.nn.channel.MoeMlp`), so what is shown is what the forward did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnspec.diagnostics import (OVERRIDES, SEED, SUBJECT, Diagnostic, Parameter, Result, Table, output_option,
                                  output_directory)


def routing(model: Any, inputs: Tensor) -> dict[int, tuple[Tensor, float]]:
    """Block index -> (tokens per expert (E,), the load-balancing loss), for every MoE block."""
    with torch.no_grad():
        model(inputs)
    found = {}
    for index, block in enumerate(model.blocks):
        if block.mlp is not None and block.mlp.aux_loss is not None:
            found[index] = (block.mlp.expert_counts.double().cpu(), float(block.mlp.aux_loss))
    return found


def write(found: dict[int, tuple[Tensor, float]], out: Path, title: str) -> list[Path]:
    """``experts.csv`` (block, expert, tokens, share) and ``experts.png``/``.svg`` (a bar per expert per block)."""
    from attnspec.figures import pyplot, save_figure, write_csv

    output_directory(out)
    rows = [[layer, expert, int(count), float(count / counts.sum())] for layer, (counts, _) in found.items()
            for expert, count in enumerate(counts.tolist())]
    table = write_csv(out / "experts.csv", ["block", "expert", "tokens", "share"], rows)
    plt = pyplot()
    figure, panels = plt.subplots(len(found), 1, figsize=(6.4, 1.8 * len(found)), squeeze=False)
    for panel, (layer, (counts, loss)) in zip(panels[:, 0], found.items()):
        panel.bar(range(len(counts)), (counts / counts.sum()).numpy(), width=0.8)
        panel.axhline(1 / len(counts), color="red", linewidth=0.8, alpha=0.6)
        panel.set_title(f"block {layer}: load-balancing loss {loss:.3f}", fontsize=9)
        panel.set_ylabel("share of slots")
    panels[-1, 0].set_xlabel("expert (red: an even share)")
    figure.suptitle(title, fontsize=10)
    return [table, *save_figure(figure, out, "experts")]


def run(source: Path, output: Path, samples: int, length: int | None, seed: int, overrides: list[str]) -> Result:
    """``attnspec diagnose experts``: tokens per expert and the load-balancing loss of each MoE block."""
    from attnspec.diagnostics.subject import load_subject
    from attnspec.errors import AttnSpecError

    subject = load_subject(source, overrides)
    inputs = subject.inputs(samples, length, seed)
    found = routing(subject.model(), inputs)
    if not found:
        raise AttnSpecError(f"{subject.spec.name} has no mixture-of-experts MLP (`mlp: {{kind: moe}}`) to show")
    files = write(found, output, f"{subject.spec.name}: routing ({'trained' if subject.trained else 'initialisation'})")
    rows = []
    for layer, (counts, loss) in found.items():
        share = counts / counts.sum()
        rows.append([str(layer), f"{int(counts.sum()):,}", f"{loss:.3f}", f"{float(share.max()):.3f}",
                     f"{float(share.min()):.3f}", str(int((counts == 0).sum()))])
    return Result(Table("routing by block", ["block", "routed slots", "balance loss", "busiest share",
                                             "idlest share", "unused experts"], rows), files)


DIAGNOSTIC = Diagnostic(
    "experts",
    "How a mixture-of-experts model routes: tokens per expert in every MoE block, the load-balancing loss "
    "(1 x top_k when balanced), the busiest and idlest experts.",
    (SUBJECT, output_option("experts.csv/.png/.svg"),
     Parameter("samples", int, "Input sequences.", default=16, minimum=1, maximum=4096),
     Parameter("length", int, "Tokens per sequence (a spec's default: max_len; a run uses its task's).", default=None,
               minimum=1),
     SEED, OVERRIDES),
    run)
