"""Based's feature map as an attnspec plugin: the second-order Taylor expansion of exp(q.k).

Based (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput
tradeoff") approximates the softmax kernel on a small projected dimension n (16 in the paper) with

    phi(x) = [1, x, vec(x x^T) / sqrt(2)],   phi(q).phi(k) = 1 + q.k + (q.k)^2 / 2 ~ exp(q.k),

a feature width of 1 + n + n^2. The kernel is positive for every q.k (its minimum is 1/2), so the
linear-attention normaliser stays positive. The mixer's `scale` (1/sqrt(n) in Based) is applied
inside, as the temperature of the approximated exp, by scaling q and k with sqrt(scale).

This file is the whole component: the IR half (validated, costed and documented by attnspec) and
the nn half (built on first use, so `attnspec check` imports no torch). Use it from a spec with
`plugins: [based_taylor]` and `feature_map: taylor`, with this folder on PYTHONPATH.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from attnspec.spec.components import component
from attnspec.spec.ir import FeatureMapComponent


@component("feature_map")
class TaylorFeatures(FeatureMapComponent):
    """Based: phi(x) = [1, x, vec(x x^T)/sqrt(2)], the 2nd-order Taylor approximation of exp(q.k)."""

    kind: Literal["taylor"]
    implementation: ClassVar[str] = "based_taylor:build_taylor"
    consumes_scale: ClassVar[bool] = True

    def width(self, n: int) -> int:
        return 1 + n + n * n


def build_taylor(node: TaylorFeatures, *, scale: float, **_):
    """The nn half: a module ``forward(x, query) -> (features, None)`` for x of shape (B, H, L, n)."""
    import math

    import torch

    from attnspec.nn.features import FeatureMap

    class Taylor(FeatureMap):
        def __init__(self):
            super().__init__()
            self.sqrt_scale = math.sqrt(scale)

        def forward(self, x: torch.Tensor, query: bool):
            x = x * self.sqrt_scale
            square = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2.0)
            return torch.cat([torch.ones_like(x[..., :1]), x, square], dim=-1), None

    return Taylor()
