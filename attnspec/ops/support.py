"""Sparse supports for Scatterbrain: which (query i, key j) pairs are computed exactly.

A support is a pair ``(index, valid)`` of shape ``(B, H, L, S)``: query i's candidate keys and
whether each candidate is in the support. Every support here is causal when asked (only
j <= i), lists each pair at most once, and costs O(L * S) memory (no L x L tensor).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class Support(NamedTuple):
    """Candidate keys per query: ``index`` (B, H, L, S) int64 and ``valid`` (B, H, L, S) bool."""

    index: Tensor
    valid: Tensor


def _broadcast(index: Tensor, valid: Tensor, batch: int, heads: int) -> Support:
    L, S = index.shape
    return Support(index.expand(batch, heads, L, S), valid.expand(batch, heads, L, S))


def local_support(length: int, window: int, *, causal: bool, batch: int = 1, heads: int = 1,
                  device: torch.device | None = None) -> Support:
    """A sliding window of ``window`` keys: ``[i - window + 1, i]`` if causal, else centred on i."""
    pos = torch.arange(length, device=device).unsqueeze(-1)
    start = -(window - 1) if causal else -(window // 2)
    index = pos + torch.arange(start, start + window, device=device)
    valid = (index >= 0) & (index < length)
    return _broadcast(index.clamp(0, max(length - 1, 0)), valid, batch, heads)


def block_support(length: int, size: int, *, causal: bool, batch: int = 1, heads: int = 1,
                  device: torch.device | None = None) -> Support:
    """Block-diagonal: i and j in the same block of ``size`` positions (and j <= i if causal)."""
    pos = torch.arange(length, device=device).unsqueeze(-1)
    index = (pos // size) * size + torch.arange(size, device=device)
    valid = index < length
    if causal:
        valid = valid & (index <= pos)
    return _broadcast(index.clamp(0, max(length - 1, 0)), valid, batch, heads)


def topk_support(q: Tensor, k: Tensor, keys: int, *, causal: bool) -> Support:
    """The ``keys`` keys of largest q.k for each query (among j <= i when causal): exact, O(L^2).

    Args:
        q, k: ``(B, H, L, d)``. keys: keys per query (at most L; fewer are valid early in a causal row).
    """
    with torch.no_grad():
        L = q.shape[2]
        scores = q @ k.transpose(-1, -2)
        if causal:
            future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        count = min(keys, L)
        values, index = scores.topk(count, dim=-1)
        return Support(index, values > float("-inf"))


def lsh_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH bucket of each row: ``argmax([xR, -xR])`` per round.

    ``x``: ``(B, H, L, d)``; ``rotations``: ``(R, d, buckets / 2)``; returns ``(R, B, H, L)`` int64.
    """
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    projected = torch.einsum("bhld,rdk->rbhlk", unit, rotations.to(x.dtype))
    return torch.cat([projected, -projected], dim=-1).argmax(dim=-1)


def lsh_support(q: Tensor, k: Tensor, rotations: Tensor, capacity: int, *, causal: bool) -> Support:
    """Keys sharing query i's bucket in any round, at most ``capacity`` per round, each pair once.

    In each round, of the keys in query i's bucket, the ``capacity`` nearest in position are
    taken (the latest ones with j <= i if causal; otherwise about half before and half after i).
    Hashes use only each row itself, so the support never depends on future tokens.

    Args:
        q, k: ``(B, H, L, d)``. rotations: ``(R, d, buckets / 2)``. capacity: keys per round.
    """
    with torch.no_grad():
        L = q.shape[2]
        q_bucket, k_bucket = lsh_buckets(q, rotations), lsh_buckets(k, rotations)  # (R, B, H, L)
        pos = torch.arange(L, device=q.device)
        key_code = k_bucket * L + pos
        sorted_code, order = torch.sort(key_code, dim=-1)
        # number of keys ordered before or at (bucket of q_i, position i)
        count = torch.searchsorted(sorted_code, (q_bucket * L + pos).contiguous(), right=True)
        first = -capacity if causal else -(capacity // 2)
        slot = count.unsqueeze(-1) + torch.arange(first, first + capacity, device=q.device)  # (R, B, H, L, c)
        in_range = (slot >= 0) & (slot < L)
        R, B, H = q_bucket.shape[:3]
        flat_slot = slot.clamp(0, max(L - 1, 0)).flatten(-2)
        key_index = torch.gather(order, -1, flat_slot).view_as(slot)
        same_bucket = torch.gather(k_bucket, -1, key_index.flatten(-2)).view_as(slot) == q_bucket.unsqueeze(-1)
        valid = in_range & same_bucket
        if causal:
            valid = valid & (key_index <= pos.view(1, 1, 1, L, 1))
        index = key_index.permute(1, 2, 3, 0, 4).reshape(B, H, L, R * capacity)
        valid = valid.permute(1, 2, 3, 0, 4).reshape(B, H, L, R * capacity)
        return deduplicate(Support(index, valid))


def deduplicate(support: Support) -> Support:
    """Keep each (i, j) pair once: a key found in several rounds is counted once."""
    S = support.index.shape[-1]
    if S == 0:
        return support
    # invalid candidates get distinct negative codes so they never match anything
    sentinel = -1 - torch.arange(S, device=support.index.device)
    codes = torch.where(support.valid, support.index, sentinel)
    codes, _ = torch.sort(codes, dim=-1)
    repeat = torch.cat([torch.zeros_like(codes[..., :1], dtype=torch.bool), codes[..., 1:] == codes[..., :-1]], -1)
    valid = (codes >= 0) & ~repeat
    return Support(codes.clamp_min(0), valid)
