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

from typing import NamedTuple

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


def cache_of(t: Tensor, capacity: int) -> Tensor:
    """The cache slots (B, H, C, ...) of the positions of ``t`` (B, H, L, ...), C = ``capacity``: slot
    p % C holds position p's entry for the last C positions, zeros where L < C leaves a slot unwritten.

    Eager code with L <= C pads on the right (slot p = position p: one write of the cache). Otherwise
    the last C positions (zeros standing for those before 0) are gathered so that p lands on p % C,
    written without ``min(L, C)``, so an exported prefill has no guard on the length."""
    L = t.shape[2]
    edge = [0, 0] * (t.dim() - 3)
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and L <= capacity:  # (no guard on L)
        return F.pad(t, edge + [0, capacity - L])
    last = F.pad(t, edge + [capacity, 0])[:, :, L:]  # positions L - C .. L - 1; entry i is position L - C + i
    # entry i goes to slot (L - C + i) % C = (i + L) % C, so slot j holds entry (j - L) % C (torch.roll by a
    # symbolic L would guard on it)
    return last.index_select(2, (torch.arange(capacity, device=t.device) - L) % capacity)


MIN_READ = 256
"""The shortest cache prefix a step reads: below it, a step's fixed costs outweigh reading a few more slots."""


def read_lengths(capacity: int) -> list[int]:
    """The cache prefixes a traced step chooses among, ascending: MIN_READ, doubling, then ``capacity``.

    A step reads the shortest one that holds every written slot, so its cost follows the position, not
    the capacity; a traced step holds one static branch per length (``torch.cond``), so exported and
    compiled steps need no recompile as the position grows, and there are at most log2(C / MIN_READ) + 1.
    (Eager steps read exactly the written slots instead.)"""
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
            updated in place (nothing the size of the cache is allocated). Without ``log_a`` the bias is
            neither read nor written: a mixer without decay never has one.
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
    # written by index (index_put_), not scatter_: AOTInductor runs an in-place scatter as a copy of the
    # whole cache, scattered, copied back (46 ms a step for a 64 MB cache), an index_put_ in place
    slot, rows = _as(position % capacity, torch.long), torch.arange(B, device=position.device)  # (B,) each
    keys.transpose(1, 2).index_put_((rows, slot), _as(k, keys.dtype))  # (B, C, H_k, Dk)[row, slot] = k[row]
    values.transpose(1, 2).index_put_((rows, slot), _as(v, values.dtype))
    if log_a is not None:
        bias.add_(log_a.unsqueeze(-1).to(bias.dtype))  # one more decay between every written slot and now
        bias.transpose(1, 2).index_put_((rows, slot), torch.zeros((), dtype=bias.dtype, device=bias.device))
    filled = torch.clamp(position + 1, max=capacity)  # (B,) slots written: 0..filled-1 (a ring: all of them)
    read = _Read(Dk ** -0.5 if scale is None else scale, (H, k_heads, v_heads))
    q = _as(q, keys.dtype)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        o = _read_traced(q, keys, values, bias, filled, read, read_lengths(capacity), biased=log_a is not None)
    else:  # eager: exactly the slots the furthest row has written (one host read; no graph to keep). When
        # every row has written all of them (one prompt length, or a full ring) nothing needs a mask.
        least, most = (int(n) for n in torch.aminmax(filled))
        o = read.prefix(q, keys, values, None if log_a is None else bias, None if least == most else filled, most)
    return _as(o.reshape(B, H, Dv), v.dtype), (keys, values, bias)


def _read_traced(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, filled: Tensor, read: _Read,
                 lengths: list[int], biased: bool) -> Tensor:
    """``read.prefix`` at the shortest of ``lengths`` that holds ``filled.max()``, chosen by data
    (nested ``torch.cond``, one static branch per length); every read is masked by ``filled``, and adds
    ``bias`` if ``biased``."""
    def prefix(n: int):
        return lambda q, keys, values, bias, filled: read.prefix(q, keys, values, bias if biased else None, filled, n)

    if len(lengths) == 1:
        return prefix(lengths[0])(q, keys, values, bias, filled)
    longer = lambda q, keys, values, bias, filled: _read_traced(  # noqa: E731
        q, keys, values, bias, filled, read, lengths[1:], biased)
    return torch.cond(filled.max() <= lengths[0], prefix(lengths[0]), longer, (q, keys, values, bias, filled))


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``; no op at all where it is in it already (a traced ``to`` of the same dtype
    stays in the program as two ops, run every step)."""
    return t if t.dtype == dtype else t.to(dtype)


class _Read(NamedTuple):
    """How a step reads the cache: the score scale and the head counts (H, H_k, H_v), given as numbers
    rather than read from the shapes, so that a ``torch.cond`` branch, traced with symbolic shapes,
    sees plain sizes."""

    scale: float
    heads: tuple[int, int, int]

    def prefix(self, q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, filled: Tensor | None,
               n: int) -> Tensor:
        """Softmax attention of ``q`` (B, H, Dk) over the first ``n`` cache slots, plus ``bias`` (B, H, C)
        where given. With ``filled`` (B,), the slots at or past it are masked by value (whatever they hold,
        NaN included, never reaches the output); None: every slot read is written. Shared key/value heads
        are read in place (no copy per query head). Returns (B, H_v, H / H_v, Dv)."""
        H, k_heads, v_heads = self.heads
        for size, expected in ((q.shape[1], H), (keys.shape[1], k_heads), (values.shape[1], v_heads)):
            torch._check(size == expected)  # pins a traced branch's head counts (eager: true already)
        read_keys, read_values = keys[:, :, :n], values[:, :, :n]
        read_bias = None if bias is None else bias[:, :, :n]
        if filled is None and k_heads == v_heads:
            # every slot is written: one fused call, the H / H_k query heads of a key head its "query positions"
            mask = None if read_bias is None else read_bias.reshape(-1, k_heads, H // k_heads, n)
            o = F.scaled_dot_product_attention(q.reshape(-1, k_heads, H // k_heads, q.shape[-1]), read_keys,
                                               read_values, attn_mask=mask, scale=self.scale)
            return o.reshape(-1, v_heads, H // v_heads, values.shape[-1])
        # masked by value: the scores of unwritten slots (their keys may be NaN) are replaced, not added to
        grouped_q = q.reshape(-1, k_heads, H // k_heads, q.shape[-1])
        scores = self.scale * torch.einsum("bgjd,bgcd->bgjc", grouped_q, read_keys).reshape(-1, H, n)
        if read_bias is not None:
            scores = scores + read_bias
        if filled is None:
            return _weighted(torch.softmax(scores, dim=-1), read_values, self.heads)
        valid = (torch.arange(n, device=q.device).view(1, n) < filled.view(-1, 1)).view(-1, 1, n)
        weights = torch.softmax(torch.where(valid, scores, float("-inf")), dim=-1)
        # The unwritten slots have weight exactly 0, so where they hold finite numbers (zeros, as every
        # cache attnspec makes) they add exactly nothing and the values need no mask: the output is the
        # masked one bit for bit. Only a non-finite output (0 x NaN) pays for masking a copy of the values
        # (it was most of an exported step's time at long reads: 38 ms of a 35 MB copy per layer).
        o = _weighted(weights, read_values, self.heads)
        masked = lambda o, weights, read_values, valid: _weighted(  # noqa: E731
            weights, torch.where(valid.unsqueeze(-1), read_values, 0.0), self.heads)
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return torch.cond(torch.isfinite(o).all(), lambda o, weights, read_values, valid: o.clone(), masked,
                              (o, weights, read_values, valid))
        return o if bool(torch.isfinite(o).all()) else masked(o, weights, read_values, valid)


def _weighted(weights: Tensor, values: Tensor, heads: tuple[int, int, int]) -> Tensor:
    """``weights`` (B, H, n) over ``values`` (B, H_v, n, Dv), the H / H_v query heads of a value head
    reading it in place: (B, H_v, H / H_v, Dv)."""
    H, _, v_heads = heads
    return torch.einsum("bgjc,bgcd->bgjd", weights.view(-1, v_heads, H // v_heads, weights.shape[-1]),
                        values).contiguous()


__all__ = ["Cache", "MIN_READ", "cache_of", "empty_cache", "read_lengths", "softmax_step"]
