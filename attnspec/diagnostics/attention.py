"""The attention matrix a mixer implies, and its error against exact softmax attention.

Every mixer is linear in its values given its queries and keys (softmax, kernel feature maps with
their normaliser, decays, Scatterbrain's sparse + low-rank sum): o = A v. So running a mixer with
v = I (the identity over positions, one "value channel" per position) gives A itself, computed by
the mixer's own code in its own mode; nothing about any mechanism is re-implemented here. The exact
reference is softmax attention of the same q and k (the mixer's projections, before any feature map),
with the same scale and causal mask.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def implied_attention(mixer: Any, x: Tensor, mode: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The mixer's attention matrix on input ``x`` (B, L, d_model): (A (B, H, L, L), q, k (B, H, L, d_qk)).

    The mixer runs unchanged except that its values are replaced by the identity and its output
    stage (group norm, gate, output projection) is skipped: A[b, h, i, j] is the weight of value j
    in output i.
    """
    captured: dict[str, Tensor] = {}
    project = mixer._project

    def identity_values(h: Tensor, *args: Any, **kwargs: Any):
        q, k, v, state = project(h, *args, **kwargs)
        captured["q"], captured["k"] = q, k
        B, H, L, _ = v.shape
        eye = torch.eye(L, dtype=v.dtype, device=v.device).expand(B, H, L, L)
        return q, k, eye, state

    def keep(o: Tensor, h: Tensor) -> Tensor:
        captured["A"] = o
        return o

    mixer._project, mixer._output = identity_values, keep  # instance attributes shadow the methods
    try:
        with torch.no_grad():
            mixer(x, mode)
    finally:
        del mixer._project, mixer._output
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
