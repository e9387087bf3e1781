"""Scatterbrain's sparse supports: ``forward(q, k) -> Support`` (which keys each query sees exactly).

q, k: (B, H, L, d_qk). The support's size per query is the IR node's fact (``keys_per_query()``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnspec.nn.registry import register
from attnspec.ops.support import Support, block_support, local_support, lsh_support, topk_support


@register("sparse", "lsh")
class LshSupport(nn.Module):
    """Angular LSH with ``rounds`` random rotations fixed by the seed (a buffer, saved with the weights)."""

    def __init__(self, node, *, d_qk: int, seed: int, causal: bool, **_):
        super().__init__()
        generator = torch.Generator().manual_seed(seed + node.seed)
        self.register_buffer("rotations", torch.randn(node.rounds, d_qk, node.buckets // 2, generator=generator))
        self.capacity, self.causal = node.capacity, causal

    def forward(self, q: Tensor, k: Tensor) -> Support:
        return lsh_support(q, k, self.rotations, self.capacity, causal=self.causal)


@register("sparse", "local")
class LocalSupport(nn.Module):
    """|i - j| < window (j <= i when causal)."""

    def __init__(self, node, *, causal: bool, **_):
        super().__init__()
        self.window, self.causal = node.window, causal

    def forward(self, q: Tensor, k: Tensor) -> Support:
        B, H, L, _ = q.shape
        return local_support(L, self.window, causal=self.causal, batch=B, heads=H, device=q.device)


@register("sparse", "block")
class BlockSupport(nn.Module):
    """i and j in the same block of ``size`` positions."""

    def __init__(self, node, *, causal: bool, **_):
        super().__init__()
        self.size, self.causal = node.size, causal

    def forward(self, q: Tensor, k: Tensor) -> Support:
        B, H, L, _ = q.shape
        return block_support(L, self.size, causal=self.causal, batch=B, heads=H, device=q.device)


@register("sparse", "topk")
class TopkSupport(nn.Module):
    """The ``keys`` keys of largest q.k (exact, O(L^2): a reference support for diagnostics)."""

    def __init__(self, node, *, causal: bool, **_):
        super().__init__()
        self.keys, self.causal = node.keys, causal

    def forward(self, q: Tensor, k: Tensor) -> Support:
        return topk_support(q, k, self.keys, causal=self.causal)
