"""One decoding step of causal softmax attention over a key/value cache of fixed capacity.

The cache holds C positions in place: the token at absolute position t goes to slot ``t % C``. With
``C > t`` for every decoded t (capacity ``max_len``) it is full causal attention; with C = a window
it is a ring buffer of the last C positions (sliding-window attention in constant memory). Tensors
never change shape, so an exported step program carries the cache as fixed-shape state. Slots not
written yet are masked by value (``where``), so whatever they hold (zeros, NaN) never reaches
the output.

A decay (:func:`attnspec.ops.softmax.softmax_attention`'s ``log_a``) is carried as a per-slot bias
``sum_{s=j+1..t} log a_s``: every step adds ``log a_t`` to the slots already written and starts the
new slot at 0, so the bias is a sum of at most C terms and stays accurate however long one decodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.errors import ShapeError

Cache = tuple[Tensor, Tensor, Tensor]
"""(keys (B, H_k, C, Dk), values (B, H_v, C, Dv), decay bias (B, H, C))."""


def empty_cache(batch: int, heads: int, k_heads: int, v_heads: int, capacity: int, d_k: int, d_v: int,
                dtype: torch.dtype = torch.float32, device=None) -> Cache:
    """A cache of ``capacity`` positions with nothing written: zeros (B, H_k, C, Dk), (B, H_v, C, Dv), (B, H, C)."""
    return (torch.zeros(batch, k_heads, capacity, d_k, dtype=dtype, device=device),
            torch.zeros(batch, v_heads, capacity, d_v, dtype=dtype, device=device),
            torch.zeros(batch, heads, capacity, dtype=dtype, device=device))


def softmax_step(q: Tensor, k: Tensor, v: Tensor, cache: Cache, position: Tensor, *, log_a: Tensor | None = None,
                 scale: float | None = None) -> tuple[Tensor, Cache]:
    """Attend from one new position over the cache, after writing its key and value.

    Args:
        q: ``(B, H, Dk)`` the query at ``position``.
        k: ``(B, H_k, Dk)``, v: ``(B, H_v, Dv)``: its key and value (H_k and H_v divide H; query head h
            reads key head ``h // (H / H_k)``: grouped-query attention).
        cache: ``(keys, values, bias)`` as :func:`empty_cache` makes them, holding positions before this one.
        position: ``(B,)`` int64, the absolute position of this token (0 for the first).
        log_a: ``(B, H)`` real log-decay of this position, or None (no decay).
        scale: score multiplier, default ``Dk ** -0.5``.

    Returns:
        ``o`` ``(B, H, Dv)`` and the cache with this position written.
    """
    keys, values, bias = cache
    B, H, Dk = q.shape
    k_heads, v_heads, capacity, Dv = keys.shape[1], values.shape[1], keys.shape[2], values.shape[-1]
    if (k.shape != (B, k_heads, Dk) or v.shape != (B, v_heads, Dv) or H % k_heads or H % v_heads
            or values.shape[2] != capacity or bias.shape != (B, H, capacity)):
        raise ShapeError(f"q (B, H, Dk), k (B, H_k, Dk), v (B, H_v, Dv) must fit the cache {tuple(keys.shape)}, "
                         f"{tuple(values.shape)}, {tuple(bias.shape)}; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    slot = (position % capacity).long()  # (B,)
    keys = keys.scatter(2, slot.view(B, 1, 1, 1).expand(B, k_heads, 1, Dk), k.unsqueeze(2).to(keys.dtype))
    values = values.scatter(2, slot.view(B, 1, 1, 1).expand(B, v_heads, 1, Dv), v.unsqueeze(2).to(values.dtype))
    if log_a is not None:
        bias = bias + log_a.unsqueeze(-1).to(bias.dtype)  # one more decay between every written slot and now
    bias = bias.scatter(2, slot.view(B, 1, 1).expand(B, H, 1), torch.zeros(B, H, 1, dtype=bias.dtype,
                                                                                  device=bias.device))
    written = torch.arange(capacity, device=q.device).view(1, capacity) < torch.clamp(position + 1, max=capacity).view(B, 1)
    read_keys = keys.repeat_interleave(H // k_heads, dim=1) if k_heads != H else keys  # (B, H, C, Dk)
    read_values = values.repeat_interleave(H // v_heads, dim=1) if v_heads != H else values
    scale = Dk ** -0.5 if scale is None else scale
    scores = scale * torch.einsum("bhd,bhcd->bhc", q.to(keys.dtype), read_keys) + bias
    valid = written.view(B, 1, capacity)
    scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
    weights = torch.softmax(scores, dim=-1)
    read_values = torch.where(valid.unsqueeze(-1), read_values, torch.zeros_like(read_values))
    o = torch.einsum("bhc,bhcd->bhd", weights, read_values)
    return o.to(v.dtype), (keys, values, bias)


__all__ = ["Cache", "empty_cache", "softmax_step"]
