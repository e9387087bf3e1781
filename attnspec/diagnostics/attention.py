"""The attention matrix a mixer implies, and its error against exact softmax attention.

Every mixer is linear in its values given its queries and keys (softmax, kernel feature maps with
their normaliser, decays, Scatterbrain's sparse + low-rank sum): o = A v. So running a mixer with
v = I (the identity over positions, one "value channel" per position) gives A itself, computed by
the mixer's own code in its own mode; nothing about any mechanism is re-implemented here. The exact
reference is softmax attention of the same q and k (the mixer's projections, before any feature map),
with the same scale and causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnspec.diagnostics import OVERRIDES, SEED, Diagnostic, Parameter, Result, Table, output_option, output_directory
from attnspec.errors import ShapeError
import torch
from torch import Tensor


def implied_attention(mixer: Any, x: Tensor, mode: str | None = None,
                      qk: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The mixer's attention matrix on input ``x`` (B, L, d_model): (A (B, H, L, L), q, k (B, H, L, d_qk)).

    The mixer runs unchanged except that its values are replaced by the identity and its output
    stage (group norm, gate, output projection) is skipped: A[b, h, i, j] is the weight of value j
    in output i. With ``qk``, those queries and keys replace the mixer's projections (synthetic
    q/k of a chosen entropy; ``x`` then only feeds input-dependent decays).
    """
    from attnspec.nn.mixers.parts import ProjectedMixer

    if not isinstance(mixer, ProjectedMixer):  # the families built on shared q/k/v projections and output stages
        raise ShapeError(f"a {mixer.kind} mixer has no query/key/value form to read an attention matrix from; "
                         "attention diagnostics read the linear, softmax, scatterbrain, delta and mlstm families")
    captured: dict[str, Tensor] = {}
    project = mixer._project
    activation = getattr(mixer, "value_activation", None)
    if activation is not None:  # the weights on the values as they are summed (after MiniMax's SiLU)
        mixer.value_activation = "none"

    def identity_values(h: Tensor, *args: Any, **kwargs: Any):
        q, k, v, state = project(h, *args, **kwargs)
        if qk is not None:
            q, k = qk
        captured["q"], captured["k"] = q, k
        B, H, L, _ = v.shape
        eye = torch.eye(L, dtype=v.dtype, device=v.device).expand(B, H, L, L)
        return q, k, eye, state

    def keep(o: Tensor, h: Tensor, v: Tensor | None = None) -> Tensor:
        captured["A"] = o
        return o

    mixer._project, mixer._output = identity_values, keep  # instance attributes shadow the methods
    try:
        with torch.no_grad():
            mixer(x, mode)
    finally:
        del mixer._project, mixer._output
        if activation is not None:
            mixer.value_activation = activation
    return captured["A"], captured["q"], captured["k"]


def exact_attention(q: Tensor, k: Tensor, scale: float, causal: bool) -> Tensor:
    """softmax(scale q k^T) with the causal mask: (B, H, L, d) x2 -> (B, H, L, L), in float64."""
    scores = scale * q.double() @ k.double().transpose(-1, -2)
    if causal:
        L = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1)


def approximation_error(approx: Tensor, exact: Tensor) -> dict[str, Tensor]:
    """Per (batch, head): the Frobenius error ||A - M||_F, and the normalised error ||A - M||_F / ||M||_F."""
    difference = torch.linalg.matrix_norm(approx.double() - exact)
    return {"frobenius": difference, "relative": difference / torch.linalg.matrix_norm(exact)}


def row_entropy(attention: Tensor) -> Tensor:
    """Mean entropy (nats) of the attention rows: (B, H, L, L) -> (B, H); log L for uniform rows."""
    p = attention.double().clamp_min(0)
    return -(p * torch.log(p.clamp_min(1e-300))).sum(-1).mean(-1)


@dataclass
class ApproximationRow:
    """One mixer at one sharpness of the synthetic scores."""

    mixer: str
    sharpness: float
    entropy: float
    """Mean row entropy of the exact attention (nats; log L is uniform)."""
    relative_error_mean: float
    relative_error_std: float


def synthetic_qk(batch: int, heads: int, length: int, d_qk: int, sharpness: float, seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """q, k ~ N(0, sharpness^2) of (batch, heads, length, d_qk): with the scale 1/sqrt(d_qk) the scores
    q.k have standard deviation sharpness^2, so a larger sharpness gives lower-entropy attention."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, d_qk, generator=gen, dtype=dtype) * sharpness
    k = torch.randn(batch, heads, length, d_qk, generator=gen, dtype=dtype) * sharpness
    return q, k


def approximation_sweep(mixers: dict[str, Any], *, length: int, sharpness: list[float], samples: int = 2,
                        seed: int = 0) -> list[ApproximationRow]:
    """Each mixer's normalised error against exact softmax attention of the same synthetic q and k, at
    each sharpness (entropy). ``mixers``: name -> (mixer module, d_model)."""
    rows = []
    for name, (mixer, d_model) in mixers.items():
        for sigma in sharpness:
            q, k = synthetic_qk(samples, mixer.heads, length, mixer.d_qk, sigma, seed)
            x = torch.zeros(samples, length, d_model, dtype=q.dtype)
            A, _, _ = implied_attention(mixer, x, qk=(q, k))
            exact = exact_attention(q, k, mixer.scale, mixer.causal)
            errors = approximation_error(A, exact)["relative"].flatten()
            rows.append(ApproximationRow(name, sigma, float(row_entropy(exact).mean()), float(errors.mean()),
                                         float(errors.std(correction=0))))
    return rows


def write(rows: list[ApproximationRow], out: Path, title: str) -> list[Path]:
    """``attention_error.csv`` and the error-against-entropy plot (PNG, SVG) in ``out``."""
    from attnspec.figures import log_scale, pyplot, save_figure, write_csv

    output_directory(out)
    table = write_csv(out / "attention_error.csv", ["mixer", "sharpness", "entropy", "relative_error_mean",
                                                     "relative_error_std"],
                      [[r.mixer, r.sharpness, r.entropy, r.relative_error_mean, r.relative_error_std] for r in rows])
    plt = pyplot()
    figure, panel = plt.subplots(figsize=(5.5, 3.8))
    for name in dict.fromkeys(r.mixer for r in rows):
        mine = sorted((r for r in rows if r.mixer == name), key=lambda r: r.entropy)
        panel.errorbar([r.entropy for r in mine], [r.relative_error_mean for r in mine],
                       yerr=[r.relative_error_std for r in mine], marker="o", capsize=3, label=name)
    panel.set_xlabel("mean row entropy of exact attention (nats)")
    panel.set_ylabel("||A - softmax||_F / ||softmax||_F")
    log_scale(panel, "y")
    panel.grid(alpha=0.3)
    panel.legend(fontsize=8)
    panel.set_title(title, fontsize=10)
    return [table, *save_figure(figure, out, "attention_error")]


# ----------------------------------------------------------------------------- the command


def run(specs: list[Path], output: Path, length: int, sharpness: list[float], samples: int, seed: int,
        overrides: list[str]) -> Result:
    """``attnspec diagnose attention``: the first block's mixer of each spec against exact softmax."""
    from attnspec.compiler.lower import as_spec
    from attnspec.nn.model import build_model_from_spec

    mixers = {}
    for path in specs:
        spec = as_spec(path, (*overrides, "dtype=float64", f"max_len={length}"))
        name = spec.name if spec.name not in mixers else f"{spec.name} ({path})"
        mixers[name] = (build_model_from_spec(spec).blocks[0].mixer, spec.d_model)
    rows = approximation_sweep(mixers, length=length, sharpness=sharpness or [0.25, 0.5, 1, 1.5, 2, 3],
                               samples=samples, seed=seed)
    files = write(rows, output, f"attention error by entropy (L = {length})")
    table = [[row.mixer, f"{row.sharpness:g}", f"{row.entropy:.2f}",
              f"{row.relative_error_mean:.3g} ± {row.relative_error_std:.2g}"] for row in rows]
    return Result(Table("||A - softmax||_F / ||softmax||_F (mean over heads and draws)",
                        ["mixer", "sharpness", "entropy", "error"], table, left=frozenset({"mixer"})), files)


DIAGNOSTIC = Diagnostic(
    "attention",
    "Each mixer's attention matrix (run with V = I) against exact softmax attention of the same synthetic q and k, by "
    "the entropy of the exact attention (Scatterbrain's Fig. 1 protocol).",
    (Parameter("specs", Path, "Spec files; the first block's mixer of each.", positional=True, many=True,
               metavar="SPEC..."),
     output_option("attention_error.csv/.png/.svg"),
     Parameter("length", int, "Positions (the attention is L x L).", default=256, minimum=2, maximum=4096),
     Parameter("sharpness", float, "Standard deviation of the synthetic q and k (repeatable; higher: lower-entropy "
                                   "attention). Default 0.25 0.5 1 1.5 2 3.", default=None, minimum=0.01, maximum=100,
               many=True),
     Parameter("samples", int, "Synthetic q/k draws.", default=2, minimum=1, maximum=64),
     SEED, OVERRIDES),
    run)
