"""One decoding step of causal softmax attention over a key/value cache of fixed capacity.

The cache holds C positions in place: the token at absolute position t goes to slot ``t % C``. With
``C > t`` for every decoded t (capacity ``max_len``) it is full causal attention; with C = a window
it is a ring buffer of the last C positions (sliding-window attention in constant memory). Tensors
never change shape, so an exported step program carries the cache as fixed-shape state, and a step
writes it in place. A step reads the shortest prefix (of a few fixed lengths) holding every written
slot, so its cost follows the position rather than the capacity. Slots not written yet are masked by
value (``where``), so whatever they hold (zeros, NaN) never reaches the output.

A decay (:func:`attnspec.ops.softmax.softmax_attention`'s ``log_a``) is carried as a per-slot bias
``sum_{s=j+1..t} log a_s``: every step adds ``log a_t`` to the slots already written and starts the
new slot at 0, so the bias is a sum of at most C terms and stays accurate however long one decodes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def last_positions(t: Tensor, capacity: int) -> tuple[Tensor, Tensor]:
    """The cache slots (C,) of the last C = ``capacity`` positions of ``t`` (B, H, L, ...) and their
    entries (B, H, C, ...): position p goes to slot p % C, and where L < C zeros stand for the positions
    before 0 (slots a step masks as unwritten). Written without ``min(L, C)``, so an exported prefill
    has no guard on the length."""
    L = t.shape[2]
    padded = F.pad(t, [0, 0] * (t.dim() - 3) + [capacity, 0])
    return torch.arange(L - capacity, L, device=t.device) % capacity, padded[:, :, L:]


MIN_READ = 256
"""The shortest cache prefix a step reads: below it, a step's fixed costs outweigh reading a few more slots."""


def read_lengths(capacity: int) -> list[int]:
    """The cache prefixes a traced step chooses among, ascending: MIN_READ, doubling, then ``capacity``.

    A step reads the shortest one that holds every written slot, so its cost follows the position, not
    the capacity; a traced step holds one static branch per length (``torch.cond``), so exported and
    compiled steps need no recompile as the position grows, and there are at most log2(C / MIN_READ) + 1.
    (Eager steps read the shortest multiple of MIN_READ instead.)"""
    lengths, n = [], MIN_READ
    while n < capacity:
        lengths.append(n)
        n *= 2
    return lengths + [capacity]


def softmax_step(q: Tensor, k: Tensor, v: Tensor, cache: Cache, position: Tensor, *, log_a: Tensor | None = None,
                 scale: float | None = None) -> tuple[Tensor, Cache]:
    """Attend from one new position over the cache, after writing its key and value into it in place.

    Args:
        q: ``(B, H, Dk)`` the query at ``position``.
        k: ``(B, H_k, Dk)``, v: ``(B, H_v, Dv)``: its key and value (H_k and H_v divide H; query head h
            reads key head ``h // (H / H_k)``: grouped-query attention).
        cache: ``(keys, values, bias)`` as :func:`empty_cache` makes them, holding positions before this one;
            updated in place (nothing the size of the cache is allocated).
        position: ``(B,)`` int64, the absolute position of this token (0 for the first).
        log_a: ``(B, H)`` real log-decay of this position, or None (no decay).
        scale: score multiplier, default ``Dk ** -0.5``.

    Returns:
        ``o`` ``(B, H, Dv)`` and the cache (the same tensors, with this position written).
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
    keys.scatter_(2, slot.view(B, 1, 1, 1).expand(B, k_heads, 1, Dk), k.unsqueeze(2).to(keys.dtype))
    values.scatter_(2, slot.view(B, 1, 1, 1).expand(B, v_heads, 1, Dv), v.unsqueeze(2).to(values.dtype))
    if log_a is not None:
        bias.add_(log_a.unsqueeze(-1).to(bias.dtype))  # one more decay between every written slot and now
    bias.scatter_(2, slot.view(B, 1, 1).expand(B, H, 1), torch.zeros(B, H, 1, dtype=bias.dtype, device=bias.device))
    filled = torch.clamp(position + 1, max=capacity)  # (B,) slots written: 0..filled-1 (a ring: all of them)
    scale = Dk ** -0.5 if scale is None else scale
    q = q.to(keys.dtype)
    lengths = read_lengths(capacity)
    heads = (H, k_heads, v_heads)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        o = _read_traced(q, keys, values, bias, filled, scale, heads, lengths)
    else:  # eager: the shortest multiple of MIN_READ holding every row's written slots (one host read of
        # the position; no graph to keep, so finer than the traced lengths: 512 rather than 1024 at 300)
        most = int(filled.max())
        o = _read_prefix(q, keys, values, bias, filled, scale, heads, min(capacity, -(-most // MIN_READ) * MIN_READ))
    return o.reshape(B, H, Dv).to(v.dtype), (keys, values, bias)


def _read_traced(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, filled: Tensor, scale: float,
                 heads: tuple[int, int, int], lengths: list[int]) -> Tensor:
    """:func:`_read_prefix` at the shortest of ``lengths`` that holds ``filled.max()``, chosen by data
    (nested ``torch.cond``, one static branch per length)."""
    if len(lengths) == 1:
        return _read_prefix(q, keys, values, bias, filled, scale, heads, lengths[0])
    n = lengths[0]
    return torch.cond(filled.max() <= n,
                      lambda *args: _read_prefix(*args, scale, heads, n),
                      lambda *args: _read_traced(*args, scale, heads, lengths[1:]),
                      (q, keys, values, bias, filled))


def _read_prefix(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, filled: Tensor, scale: float,
                 heads: tuple[int, int, int], n: int) -> Tensor:
    """Softmax attention of ``q`` (B, H, Dk) over the first ``n`` cache slots, the slots at or past
    ``filled`` (B,) masked by value (whatever they hold, NaN included, never reaches the output); shared
    key/value heads are read in place (no copy per query head). ``heads``: (H, H_k, H_v), given as
    numbers rather than read from the shapes, and the batch left as -1, so that a ``torch.cond`` branch,
    traced with symbolic shapes, sees plain sizes. Returns (B, H_v, H / H_v, Dv)."""
    H, k_heads, v_heads = heads
    for size, expected in ((q.shape[1], H), (keys.shape[1], k_heads), (values.shape[1], v_heads)):
        torch._check(size == expected)  # pins a traced branch's head counts (eager: true already)
    read_keys, read_values, read_bias = keys[:, :, :n], values[:, :, :n], bias[:, :, :n]
    grouped_q = q.reshape(-1, k_heads, H // k_heads, q.shape[-1])
    scores = torch.einsum("bgjd,bgcd->bgjc", grouped_q, read_keys).reshape(-1, H, n)
    valid = (torch.arange(n, device=q.device).view(1, n) < filled.view(-1, 1)).view(-1, 1, n)
    scores = torch.where(valid, scale * scores + read_bias, torch.full_like(scores, float("-inf")))
    weights = torch.softmax(scores, dim=-1)
    read_values = torch.where(valid.unsqueeze(-1), read_values, torch.zeros_like(read_values))
    return torch.einsum("bgjc,bgcd->bgjd", weights.view(-1, v_heads, H // v_heads, n), read_values).contiguous()


__all__ = ["Cache", "MIN_READ", "empty_cache", "last_positions", "read_lengths", "softmax_step"]
