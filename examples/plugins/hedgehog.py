"""Hedgehog's feature map as an attnspec plugin: a trainable, spiky, non-negative map.

Hedgehog (Zhang et al. 2024, "The Hedgehog & the Porcupine: expressive linear attentions with
softmax mimicry") learns a per-head projection W (n x m, initialised to the identity) and uses

    phi(x) = [softmax(x W), softmax(-x W)]   (softmax over the m features),

a width of 2m, non-negative, whose dot products can be trained to mimic softmax attention's
spiky, monotone weights. `feature_dim` is m (default: n, the head width).

One file, both halves: the IR class (facts: width 2m, non-negative) and the nn module, built on
first use so that validating a spec imports no torch. Use `plugins: [hedgehog]` and
`feature_map: hedgehog` (or `{kind: hedgehog, feature_dim: 32}`), with this folder on PYTHONPATH.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from attnspec.spec.components import component
from attnspec.spec.ir import FeatureMapComponent


@component("feature_map")
class HedgehogFeatures(FeatureMapComponent):
    """Hedgehog: phi(x) = [softmax(x W), softmax(-x W)] with a trainable per-head W (identity at start)."""

    kind: Literal["hedgehog"]
    feature_dim: Annotated[int, Field(gt=0, le=4096)] | None = None
    """Features m per sign (the width is 2m); defaults to the head width n."""
    implementation: ClassVar[str] = "hedgehog:build_hedgehog"

    def width(self, n: int) -> int:
        return 2 * (self.feature_dim or n)


def build_hedgehog(node: HedgehogFeatures, *, dim: int, heads: int, **_):
    """The nn half: ``forward(x, query) -> (features, None)``, x (B, H, L, n) -> (B, H, L, 2m)."""
    import torch
    from torch import nn

    from attnspec.nn.features import FeatureMap

    width = node.feature_dim or dim

    class Hedgehog(FeatureMap):
        def __init__(self):
            super().__init__()
            start = torch.eye(dim, width).expand(heads, dim, width).clone()  # identity: softmax(x) at first
            self.weight = nn.Parameter(start)  # (H, n, m): one projection per head, shared by q and k

        def forward(self, x: torch.Tensor, query: bool):
            # A broadcast product summed over n: `x @ w` with a per-head w decomposes into reshapes that branch
            # on batch size 1, which `torch.export` cannot keep dynamic; (B, H, L, n, m) is small at these widths.
            projected = (x.unsqueeze(-1) * self.weight.unsqueeze(0).unsqueeze(2)).sum(-2)  # (B, H, L, m)
            return torch.cat([torch.softmax(projected, dim=-1), torch.softmax(-projected, dim=-1)], dim=-1), None

    return Hedgehog()
