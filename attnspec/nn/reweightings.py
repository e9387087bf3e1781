"""Position re-weightings rho(t) of the features: ``forward(q, k, offset) -> (q~, k~)``, (B, H, L, m) each.

The feature width they produce is the IR node's fact (``width_factor``); positions are 1-based and
start at ``offset`` (an int, a (B,) tensor of positions in decoding, or (B, L) packed documents'
positions, 0-based: :func:`attnspec.nn.positions.positions`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnspec.errors import ShapeError
from attnspec.nn.positions import positions as absolute_positions
from attnspec.nn.registry import register


@register("reweighting", "none")
class NoReweighting(nn.Module):
    def __init__(self, node, **_):
        super().__init__()

    def forward(self, q: Tensor, k: Tensor, offset: Tensor | int = 0) -> tuple[Tensor, Tensor]:
        return q, k


@register("reweighting", "cos")
class CosReweighting(nn.Module):
    """cosFormer: features [phi cos(pi i / 2M), phi sin(pi i / 2M)] (Ptolemy's identity splits the
    weight cos(pi/2 (i - j)/M) into a sum of two separable terms, doubling the width)."""

    def __init__(self, node, **_):
        super().__init__()
        self.M = node.M  # None: M = L per call (non-causal only; rules enforce it)

    def forward(self, q: Tensor, k: Tensor, offset: Tensor | int = 0) -> tuple[Tensor, Tensor]:
        L = q.shape[2]
        if self.M is None and isinstance(offset, Tensor) and offset.dim() == 2:
            raise ShapeError("cosFormer with M = L (non-causal) re-weights by the whole row's length, so packed "
                             "documents would not compute as they do alone; give `M`, or unpacked sequences")
        M = self.M if self.M is not None else L
        positions = absolute_positions(L, offset, q.device, q.dtype) + 1  # 1-based: (L,) or (B, L)
        positions = positions.view(-1, 1, L, 1) if positions.dim() == 2 else positions.view(1, 1, L, 1)
        angle = positions * (math.pi / (2 * M))
        cos, sin = torch.cos(angle), torch.sin(angle)
        return torch.cat([q * cos, q * sin], dim=-1), torch.cat([k * cos, k * sin], dim=-1)
