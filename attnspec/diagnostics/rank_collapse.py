"""Rank collapse (Dong, Cordonnier & Loukas 2021): how close each layer's output is to "all tokens
equal", for a spec at initialisation or a trained run, and for the paper's surgery variants.

For each layer output X (n tokens x d) the residual is res(X) = X - 1 mean_tokens(X) (the paper's
code centres on the token mean; the exact argmin of the composite norm has no closed form) and the
relative residual is ||res(X)|| / ||X|| in

- the paper's composite norm ||X||_{1,inf} = sqrt(||X||_1 ||X||_inf), where ||X||_1 is the largest
  absolute column sum and ||X||_inf the largest absolute row sum (not a true norm: no triangle
  inequality), and
- the Frobenius norm.

Layer 0 is the embedding output (the blocks' input); layer l the output of block l. The surgery
variants (the paper's Fig. 2) change only skips and MLPs: ``san`` (no skips, no MLP), ``san+skip``
(skips, no MLP), ``san+mlp`` (no skip around the mixer; the MLP keeps its own) and ``transformer``
(both skips and the MLP; a spec without an MLP gets the default one). Models run in float64,
because a collapsing residual falls below float32's resolution within a few layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnspec.diagnostics import (OVERRIDES, SEED, SUBJECT, Diagnostic, Parameter, Result, Table, output_option,
                                      output_directory)
from attnspec.diagnostics.subject import forward_with_hooks, random_inputs

VARIANTS: dict[str, list[str]] = {
    "san": ["blocks[*].residual=false", "blocks[*].mlp=none"],
    "san+skip": ["blocks[*].residual=true", "blocks[*].mlp=none"],
    "san+mlp": ["blocks[*].residual={mixer: false, mlp: true}"],
    "transformer": ["blocks[*].residual=true"],
}
"""The paper's surgery, as overrides of any spec (MLP variants keep the spec's MLP, see _with_mlp)."""


def composite_norm(x: Tensor) -> Tensor:
    """||X||_{1,inf} = sqrt(max column abs-sum * max row abs-sum) of (..., n, d) -> (...)."""
    columns = x.abs().sum(-2).amax(-1)
    rows = x.abs().sum(-1).amax(-1)
    return (columns * rows).sqrt()


def relative_residuals(x: Tensor) -> tuple[Tensor, Tensor]:
    """(..., n, d) -> the relative residual in the composite norm and in Frobenius, each (...)."""
    residual = x - x.mean(-2, keepdim=True)
    return (composite_norm(residual) / composite_norm(x),
            torch.linalg.matrix_norm(residual) / torch.linalg.matrix_norm(x))


def layer_outputs(model: Any, inputs: Tensor) -> list[Tensor]:
    """The blocks' input and every block's output, [(B, n, d)] * (blocks + 1), in float64."""
    outputs: list[Tensor] = []
    handles = [model.blocks[0].register_forward_pre_hook(lambda module, args: outputs.append(args[0].detach()))]
    handles += [block.register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
                for block in model.blocks]
    forward_with_hooks(model, inputs, handles)
    return [x.double() for x in outputs]


@dataclass
class RankCollapseRow:
    """One variant at one layer: mean and standard deviation over the samples."""

    variant: str
    layer: int
    composite_mean: float
    composite_std: float
    frobenius_mean: float
    frobenius_std: float


def diagnose(spec: Any, *, samples: int = 32, length: int | None = None, seed: int = 0,
             variants: list[str] | None = None, weights: dict[str, Tensor] | None = None,
             inputs: Tensor | None = None) -> list[RankCollapseRow]:
    """The relative residual of every layer for each surgery variant of ``spec``.

    Args:
        spec: a resolved spec (or a path / data; see :func:`attnspec.compiler.lower.as_spec`).
        samples, length, seed: random inputs (token ids uniform over the vocabulary, or features
            N(0, 1)) of ``samples`` x ``length`` (default: ``max_len``), unless ``inputs`` are given.
        variants: names from :data:`VARIANTS` (default: all).
        weights: trained tensors (a run's checkpoint) copied into each variant wherever a tensor of
            the same name and shape exists (surgery removes the MLPs' tensors, nothing else).

    Returns:
        One row per (variant, layer).
    """
    from attnspec.compiler.lower import as_spec
    from attnspec.nn.model import build_model_from_spec

    base = as_spec(spec)
    if inputs is None:
        inputs = random_inputs(base, samples, length, seed)
    rows = []
    if inputs.is_floating_point():
        inputs = inputs.double()
    for name in variants or list(VARIANTS):
        # float64: the residual falls below float32's resolution within a few layers
        variant = as_spec(base, [*VARIANTS[name], *_with_mlp(base, name), "dtype=float64"])
        model = build_model_from_spec(variant).eval()
        if weights is not None:
            _copy_matching(model, {name: tensor.double() if tensor.is_floating_point() else tensor
                                   for name, tensor in weights.items()})
        for layer, x in enumerate(layer_outputs(model, inputs)):
            composite, frobenius = relative_residuals(x)
            rows.append(RankCollapseRow(name, layer, float(composite.mean()), float(composite.std(correction=0)),
                                        float(frobenius.mean()), float(frobenius.std(correction=0))))
    return rows


def _with_mlp(spec: Any, variant: str) -> list[str]:
    """MLP variants of a spec whose blocks have no MLP get the default MLP."""
    from attnspec.spec.walk import iter_blocks

    if variant in ("san+mlp", "transformer") and any(block.mlp.is_identity for _, block in iter_blocks(spec)):
        return ["blocks[*].mlp={kind: mlp}"]
    return []


def _copy_matching(model: Any, weights: dict[str, Tensor]) -> None:
    state = model.state_dict()
    model.load_state_dict({name: tensor for name, tensor in weights.items()
                           if name in state and state[name].shape == tensor.shape}, strict=False)


def write(rows: list[RankCollapseRow], out: Path, title: str) -> list[Path]:
    """``rank_collapse.csv`` and the plot (PNG and SVG) in ``out``; returns the files written."""
    from attnspec.figures import log_scale, pyplot, save_figure, write_csv

    output_directory(out)
    table = write_csv(out / "rank_collapse.csv",
                      ["variant", "layer", "relative_residual_l1inf_mean", "relative_residual_l1inf_std",
                       "relative_residual_fro_mean", "relative_residual_fro_std"],
                      [[row.variant, row.layer, row.composite_mean, row.composite_std, row.frobenius_mean,
                        row.frobenius_std] for row in rows])
    plt = pyplot()
    figure, panels = plt.subplots(1, 2, figsize=(9, 3.6))
    for panel, (attribute, label) in zip(panels, (("composite", "l1,inf composite norm"), ("frobenius", "Frobenius"))):
        for variant in dict.fromkeys(row.variant for row in rows):
            mine = [row for row in rows if row.variant == variant]
            means = [max(getattr(row, f"{attribute}_mean"), 1e-30) for row in mine]
            stds = [getattr(row, f"{attribute}_std") for row in mine]
            layers = [row.layer for row in mine]
            panel.plot(layers, means, marker="o", label=variant)
            panel.fill_between(layers, [max(m - s, 1e-30) for m, s in zip(means, stds)],
                               [m + s for m, s in zip(means, stds)], alpha=0.2)
        log_scale(panel, "y")
        panel.set_xlabel("layer (0: the blocks' input)")
        panel.set_ylabel(f"relative residual ({label})")
        panel.grid(alpha=0.3)
    panels[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    return [table, *save_figure(figure, out, "rank_collapse")]



# ----------------------------------------------------------------------------- the command


def run(source: Path, output: Path, samples: int, length: int | None, seed: int, overrides: list[str]) -> Result:
    """``attnspec diagnose rank-collapse``: diagnose, write, and the table of every variant by layer."""
    from attnspec.diagnostics.subject import load_subject

    subject = load_subject(source, overrides)
    rows = diagnose(subject.spec, samples=samples, length=length, seed=seed, weights=subject.weights,
                    inputs=subject.task_inputs(samples))
    files = write(rows, output, f"{subject.spec.name}: relative residual by layer "
                                f"({'trained' if subject.trained else 'initialisation'})")
    variants = list(dict.fromkeys(row.variant for row in rows))
    table = [[str(layer), *(f"{row.composite_mean:.3g}" for variant in variants for row in rows
                            if row.variant == variant and row.layer == layer)]
             for layer in sorted({row.layer for row in rows})]
    return Result(Table("relative residual (l1,inf), mean over samples", ["layer", *variants], table), files)


DIAGNOSTIC = Diagnostic(
    "rank-collapse",
    "Relative residual ||X - 1 mean(X)|| / ||X|| of every layer (l1,inf composite norm and Frobenius), for the "
    "surgery variants san, san+skip, san+mlp and transformer (Dong et al. 2021).",
    (SUBJECT, output_option("rank_collapse.csv/.png/.svg"),
     Parameter("samples", int, "Input sequences.", default=32, minimum=1, maximum=4096),
     Parameter("length", int, "Tokens per sequence (default: max_len; a run uses its task's).", default=None, minimum=1),
     SEED, OVERRIDES),
    run)
