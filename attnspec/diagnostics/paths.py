"""Path isolation (Dong, Cordonnier & Loukas 2021, Theorem 2.1 and sec. 4.3): how much of a trained
model's accuracy each length of attention path carries.

A network of attention-only blocks with skips, X^l = X^{l-1} + sum_h A^l_h X^{l-1} W^l_h, unrolls
into a sum over paths (h_1, ..., h_L), h_l in {0 (the skip), 1..H}:

    X^L = sum_path A^L_{h_L} ... A^1_{h_1} X^0 W^1_{h_1} ... W^L_{h_L}     (A^l_0 = I, W^l_0 = I)

where A^l_h is head h's attention matrix on the real layer input X^{l-1} (so every path shares the
full network's attention, as in the theorem) and W^l_h = W_V,h W_O,h the head's value and output
maps. A path's length is the number of heads it goes through; there are C(L, l) H^l paths of length
l. Path isolation evaluates the model's head on the normalised sum (the mean) of a random subset of
paths of one length, in place of X^L; the final norm makes the result independent of how the sum is
scaled. The attention matrix of any mixer comes from :func:`implied_attention` (V = I), so linear
mixers are probed the same way as softmax attention (their matrices need not be row-stochastic).

The identity holds for blocks ``x + mixer(x)`` with no norm and no MLP inside the block, and mixers
whose output is linear in their values through the output projection (no group norm, output gate or
convolution of x or v): the paper's setting. Other models are refused with what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations, product
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnspec.diagnostics import Diagnostic, Parameter, Result, Table, output_option, output_directory
from attnspec.diagnostics.attention import implied_attention
from attnspec.diagnostics.subject import block_inputs
from attnspec.errors import AttnSpecError

MAX_ENUMERATED_PATHS = 1 << 16
"""Enumerating every path of a length is done only up to this many (the decomposition check)."""


@dataclass
class PathTerms:
    """What every path of a model on one batch is built from."""

    x0: Tensor
    """The blocks' input (B, n, d), float64."""
    attention: list[Tensor]
    """Per block: every head's attention matrix on the block's real input, (B, H, n, n)."""
    maps: list[Tensor]
    """Per block: every head's value-then-output map W_V,h W_O,h, (H, d, d) (right-multiplied)."""

    @property
    def depth(self) -> int:
        return len(self.attention)

    @property
    def heads(self) -> int:
        return self.attention[0].shape[1]


def check_decomposable(model: Any) -> None:
    """Refuse a model whose blocks are not ``x + mixer(x)`` with a value-linear mixer (see the module doc)."""
    from attnspec.nn.mixers.parts import ProjectedMixer

    problems = []
    for index, block in enumerate(model.blocks):
        mixer = block.mixer
        where = f"block {index}"
        if not isinstance(mixer, ProjectedMixer) or getattr(mixer, "value_activation", "none") != "none":
            problems.append(f"{where}'s {mixer.kind} mixer is not linear in its values through q/k/v projections "
                            "(linear, softmax, scatterbrain, delta and mlstm mixers without value_activation are)")
            continue
        if not block.mixer_residual:
            problems.append(f"{where} has no skip around its mixer (residual: true)")
        if block.mlp is not None:
            problems.append(f"{where} has an MLP (mlp: none)")
        if not isinstance(block.norm1, torch.nn.Identity):
            problems.append(f"{where} normalises inside the block (norm: none; a final_norm is fine)")
        if mixer.gate is not None or mixer.norm_weight is not None or mixer.D is not None:
            problems.append(f"{where}'s mixer has an output gate, group norm or skip (output_gate: none, "
                            "group_norm: false, skip: false)")
        if any(stream in mixer.conv.widths for stream in ("x", "v")):
            problems.append(f"{where}'s mixer convolves x or v (no conv on those streams)")
    if problems:
        raise AttnSpecError("path isolation needs attention-only blocks with skips (the paper's setting): "
                            + "; ".join(problems))


def path_terms(model: Any, inputs: Tensor) -> PathTerms:
    """Every head's attention matrix and value-output map, for ``model`` (eval, float64) on ``inputs``.

    Raises:
        AttnSpecError: the model does not decompose into paths (:func:`check_decomposable`).
    """
    check_decomposable(model)
    received = block_inputs(model, inputs)  # no norm inside the blocks: what the mixers see
    attention, maps = [], []
    for block, x in zip(model.blocks, received):
        mixer = block.mixer
        attention.append(implied_attention(mixer, x)[0].double())
        H, dv = mixer.heads, mixer.d_v
        w_v = mixer.v_proj.weight.double().view(H, dv, -1)  # (H, dv, d): v_h = x w_v[h]^T
        w_o = mixer.out_proj.weight.double().view(-1, H, dv).permute(1, 2, 0)  # (H, dv, d): y = o_h w_o[h]
        maps.append(w_v.transpose(1, 2) @ w_o)
    return PathTerms(received[0].double(), attention, maps)


def path_output(terms: PathTerms, path: tuple[int, ...]) -> Tensor:
    """One path's contribution to the last block's output: (B, n, d). ``path[l]`` is 0 (skip) or a
    1-based head of block l."""
    y = terms.x0
    for layer, head in enumerate(path):
        if head:
            y = terms.attention[layer][:, head - 1] @ y @ terms.maps[layer][head - 1]
    return y


def count_paths(depth: int, heads: int, length: int) -> int:
    """C(depth, length) * heads^length: the paths that go through ``length`` heads."""
    return math.comb(depth, length) * heads ** length


def all_paths(depth: int, heads: int, length: int | None = None) -> list[tuple[int, ...]]:
    """Every path (of one length, or of every length), in a fixed order; at most
    :data:`MAX_ENUMERATED_PATHS` candidates (sample larger models with :func:`sample_paths`)."""
    if (heads + 1) ** depth > MAX_ENUMERATED_PATHS:
        raise AttnSpecError(f"{(heads + 1) ** depth:,} paths ({heads} heads, {depth} blocks) are more than "
                            f"{MAX_ENUMERATED_PATHS:,} to enumerate; sample them instead")
    return [path for path in product(range(heads + 1), repeat=depth)
            if length is None or sum(h > 0 for h in path) == length]


def sample_paths(depth: int, heads: int, length: int, count: int, rng: np.random.Generator
                 ) -> list[tuple[int, ...]]:
    """``count`` distinct random paths of ``length`` heads (every one of them when there are no more)."""
    total = count_paths(depth, heads, length)
    if total <= count:
        return [path for layers in combinations(range(depth), length)
                for path in _with_heads(depth, layers, heads)]
    chosen: set[tuple[int, ...]] = set()
    while len(chosen) < count:
        layers = rng.choice(depth, size=length, replace=False)
        path = [0] * depth
        for layer in layers:
            path[int(layer)] = int(rng.integers(1, heads + 1))
        chosen.add(tuple(path))
    return sorted(chosen)


def _with_heads(depth: int, layers: tuple[int, ...], heads: int) -> list[tuple[int, ...]]:
    paths = []
    for choice in product(range(1, heads + 1), repeat=len(layers)):
        path = [0] * depth
        for layer, head in zip(layers, choice):
            path[layer] = head
        paths.append(tuple(path))
    return paths


def answer_accuracy(logits: Tensor, targets: Tensor) -> float:
    """Accuracy of argmax ``logits`` (B, n, classes) on the answer positions of ``targets`` (B, n)."""
    from attnspec.training.tasks import IGNORE

    mask = targets != IGNORE
    return float((logits.argmax(-1)[mask] == targets[mask]).double().mean())


def majority_accuracy(targets: Tensor) -> float:
    """Accuracy of always answering the most frequent answer (the paper's naive classifier)."""
    from attnspec.training.tasks import IGNORE

    answers = targets[targets != IGNORE]
    return float(torch.bincount(answers).max()) / max(int(answers.numel()), 1)


@dataclass
class PathRow:
    """Accuracy of one path length (``length`` = -1: the full model; -2: the majority answer)."""

    length: int
    paths: int
    """Paths of this length in the model."""
    subset: int
    """Paths asked for per evaluation (0 for the reference rows)."""
    summed: int
    """Paths summed per evaluation: ``subset``, or every path of the length when there are fewer."""
    accuracy_mean: float
    accuracy_std: float


def isolate(model: Any, inputs: Tensor, targets: Tensor, *, subsets: tuple[int, ...] = (5, 1000),
            repeats: int = 5, seed: int = 0) -> list[PathRow]:
    """Accuracy of each path length alone: for each subset size, ``repeats`` random subsets of that
    many paths of one length (all of them when there are fewer), each evaluated on the mean of its
    paths through the model's final norm and head.

    Args:
        model: a :class:`~attnspec.nn.model.Model` in eval mode, float64, whose blocks decompose.
        inputs: (B, n) token ids or (B, n, dim) features; targets: (B, n) answers, ``IGNORE`` elsewhere.
        subsets: paths summed per evaluation (the paper uses 5).

    Returns:
        One row per (subset size, length 0..depth), then the full model (length -1) and the
        majority answer (length -2).
    """
    terms = path_terms(model, inputs)
    rng = np.random.default_rng(seed)
    rows = []
    with torch.no_grad():
        for subset in subsets:
            for length in range(terms.depth + 1):
                available = count_paths(terms.depth, terms.heads, length)
                accuracies = []
                for _ in range(repeats if available > subset else 1):  # all paths: one evaluation
                    paths = sample_paths(terms.depth, terms.heads, length, subset, rng)
                    hidden = torch.stack([path_output(terms, path) for path in paths]).mean(0)
                    accuracies.append(answer_accuracy(model._head(model.final_norm(hidden)), targets))
                rows.append(PathRow(length, available, subset, min(subset, available), float(np.mean(accuracies)),
                                    float(np.std(accuracies))))
        full = answer_accuracy(model(inputs), targets)
    rows.append(PathRow(-1, (terms.heads + 1) ** terms.depth, 0, 0, full, 0.0))
    rows.append(PathRow(-2, 0, 0, 0, majority_accuracy(targets), 0.0))
    return rows


def write(rows: list[PathRow], out: Path, title: str) -> list[Path]:
    """``paths.csv`` and the accuracy-by-path-length plot (PNG, SVG) in ``out``."""
    from attnspec.figures import pyplot, save_figure, write_csv

    output_directory(out)
    names = {-1: "full model", -2: "majority answer"}
    table = write_csv(out / "paths.csv", ["path_length", "paths", "subset", "summed", "accuracy_mean",
                                           "accuracy_std"],
                      [[names.get(r.length, r.length), r.paths, r.subset, r.summed, r.accuracy_mean, r.accuracy_std]
                       for r in rows])
    plt = pyplot()
    figure, panel = plt.subplots(figsize=(5.5, 3.8))
    for subset in dict.fromkeys(r.subset for r in rows if r.length >= 0):
        mine = [r for r in rows if r.length >= 0 and r.subset == subset]
        label = "every path" if all(r.summed == r.paths for r in mine) else f"{subset} random paths"
        panel.errorbar([r.length for r in mine], [r.accuracy_mean for r in mine],
                       yerr=[r.accuracy_std for r in mine], marker="o", capsize=3, label=f"sum of {label}")
    for row, style in zip((r for r in rows if r.length < 0), ("--", ":")):
        panel.axhline(row.accuracy_mean, linestyle=style, color="grey", label=names[row.length])
    panel.set_xlabel("path length (heads the path goes through)")
    panel.set_ylabel("test accuracy")
    panel.set_ylim(0, 1.02)
    panel.grid(alpha=0.3)
    panel.legend(fontsize=8)
    panel.set_title(title, fontsize=10)
    return [table, *save_figure(figure, out, "paths")]


# ----------------------------------------------------------------------------- the command


def run(source: Path, output: Path, samples: int, subsets: list[int], repeats: int, seed: int) -> Result:
    """``attnspec diagnose paths``: isolate every path length of a trained run, write, tabulate."""
    from attnspec.diagnostics.subject import load_subject

    subject = load_subject(source)
    if not subject.trained or subject.task is None:
        raise AttnSpecError(f"{source}: path isolation measures a trained model on its task; give a run directory "
                            "(attnspec train / attnspec ablate)")
    inputs, targets = subject.task.batch("test", 0, samples, subject.seed)
    rows = isolate(subject.model(float64=True), inputs, targets, subsets=tuple(subsets or (5, 1000)),
                   repeats=repeats, seed=seed)
    files = write(rows, output, f"{subject.spec.name}: accuracy by attention-path length")
    table = [[{-1: "full model", -2: "majority answer"}.get(row.length, str(row.length)),
              f"{row.paths:,}" if row.length != -2 else "", str(row.summed) if row.length >= 0 else "",
              f"{row.accuracy_mean:.3f} ± {row.accuracy_std:.3f}" if row.length >= 0 else f"{row.accuracy_mean:.3f}"]
             for row in rows]
    return Result(Table("test accuracy of paths of one length (mean ± std over subsets)",
                        ["path length", "paths", "summed", "accuracy"], table), files)


DIAGNOSTIC = Diagnostic(
    "paths",
    "Accuracy of each attention-path length alone (Dong et al. 2021, sec. 4.3): the trained model's head applied to "
    "the mean of a random subset of paths that go through that many heads.",
    (Parameter("source", Path, "A run directory of a model of attention-only blocks with skips (e.g. from "
                               "ablations/rank-collapse-paths.yaml).", positional=True, metavar="RUN"),
     output_option("paths.csv/.png/.svg"),
     Parameter("samples", int, "Test sequences of the run's task.", default=200, minimum=1, maximum=4096),
     Parameter("subsets", int, "Paths summed per evaluation (repeatable; default 5 and 1000, i.e. every path of a "
                               "length).", default=None, flags=("--subset",), minimum=1, maximum=100_000, many=True),
     Parameter("repeats", int, "Random subsets per length.", default=5, minimum=1, maximum=100),
     Parameter("seed", int, "Seed of the path sampling.", default=0, minimum=0)),
    run)
