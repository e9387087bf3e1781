"""One decoding step of causal softmax attention over a key/value cache of fixed capacity.

The cache holds C positions in place: the token at absolute position t goes to slot ``t % C``. With
``C > t`` for every decoded t (capacity ``max_len``) it is full causal attention; with C = a window
it is a ring buffer of the last C positions (sliding-window attention in constant memory). Tensors
never change shape, so an exported step program carries the cache as fixed-shape state, and a step
writes it in place. A step reads the prefix of slots the furthest row has written, so its cost follows
the position rather than the capacity: eager code reads exactly it (a host read of the length), an
exported step too (an unbacked length in one program), a compiled one the shortest of a few fixed
prefixes holding it (``torch.cond``). Slots a row has not written (rows at different positions) are
masked, and zeroed in place before the read, so whatever they held (zeros, NaN) never reaches the output.

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
from attnspec.ops.per_step import shared
from attnspec.ops.softmax.attention import weights_with_sinks

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
"""The shortest cache prefix a compiled step reads: below it, a step's fixed costs outweigh reading a few
more slots."""


def read_lengths(capacity: int) -> list[int]:
    """The cache prefixes a compiled step chooses among, ascending: MIN_READ, doubling, then ``capacity``.

    A step reads the shortest one that holds every written slot, so its cost follows the position, not
    the capacity; a compiled step holds one static branch per length (``torch.cond``), so it needs no
    recompile as the position grows, and there are at most log2(C / MIN_READ) + 1. (``torch.compile``
    cannot read the exact length from the data without ``capture_scalar_outputs``; eager and exported
    steps read exactly the written slots.)"""
    lengths, n = [], MIN_READ
    while n < capacity:
        lengths.append(n)
        n *= 2
    return lengths + [capacity]


def softmax_step(q: Tensor, k: Tensor, v: Tensor, cache: Cache, position: Tensor, *, log_a: Tensor | None = None,
                 scale: float | None = None, softcap: float | None = None,
                 sinks: Tensor | None = None, chunked: bool = False,
                 selected: Tensor | None = None) -> tuple[Tensor, Cache]:
    """Attend from one new position over the cache, after writing its key and value into it in place.

    Args:
        q: ``(B, H, Dk)`` the query at ``position``.
        k: ``(B, H_k, Dk)``, v: ``(B, H_v, Dv)``: its key and value (H_k and H_v divide H; query head h
            reads key head ``h // (H / H_k)``: grouped-query attention); both None to read a cache that holds
            this position already, written by the layer that lends it (cross-layer sharing), without writing
            its keys and values (the bias, with ``log_a``, is the reader's own: advanced as a writer's is).
        cache: ``(keys, values, bias)`` as :func:`empty_cache` makes them, holding positions before this one;
            updated in place (nothing the size of the cache is allocated). Without ``log_a`` the bias is
            neither read nor written (it may be None): a mixer without decay never has one.
        position: ``(B,)`` int64, the absolute position of this token (0 for the first).
        log_a: ``(B, H)`` real log-decay of this position, or None (no decay).
        scale: score multiplier, default ``Dk ** -0.5``.
        softcap: a tanh soft-cap on the scaled scores (:func:`attnspec.ops.softmax.softmax_attention`'s).
        sinks: ``(H,)`` a sink logit per head joining the softmax (``softmax_attention``'s), or None.
        chunked: the cache is a ring of one chunk (chunked attention): a position reads the slots its own chunk
            wrote, 0 .. position % C, rather than every slot written.
        selected: ``(B, C)`` bool or None: the slots this query may read, of those written (a sparse attention's
            choice: DeepSeek's indexer); every row must select at least one written slot.

    Returns:
        ``o`` ``(B, H, Dv)`` and the cache (the same tensors, with this position written).
    """
    keys, values, bias = cache
    B, H, Dk = q.shape
    k_heads, v_heads, capacity, Dv = keys.shape[1], values.shape[1], keys.shape[2], values.shape[-1]
    writes = k is not None or v is not None
    if ((writes and (k is None or v is None or k.shape != (B, k_heads, Dk) or v.shape != (B, v_heads, Dv)))
            or keys.shape[0] != B or keys.shape[3] != Dk or H % k_heads or H % v_heads or values.shape[2] != capacity
            or (log_a is not None and (bias is None or bias.shape != (B, H, capacity)))):
        raise ShapeError(f"q (B, H, Dk), k (B, H_k, Dk), v (B, H_v, Dv) must fit the cache {tuple(keys.shape)}, "
                         f"{tuple(values.shape)}, {None if bias is None else tuple(bias.shape)}; got "
                         f"{tuple(q.shape)}, {None if k is None else tuple(k.shape)}, {None if v is None else tuple(v.shape)}")
    # the slots are the same for every layer of the step: computed once (per_step)
    slots = shared("softmax cache slots", (position, capacity, chunked), lambda: _slots(position, capacity, chunked))
    if not writes:  # a borrowed cache: its lender wrote this position, and zeroed the slots read yet unwritten;
        if log_a is not None:  # the bias is the reader's own (its decay, not the lender's), kept as below
            _advance(bias, log_a, slots)
        return _read(q, keys, values, None if log_a is None else bias, slots, Dk ** -0.5 if scale is None else scale,
                     softcap, sinks, selected, B, H, Dv, values.dtype)
    # Written by index (index_put_), not scatter_ (AOTInductor runs an in-place scatter as a copy of the
    # whole cache, scattered, copied back: 46 ms a step for a 64 MB cache), and once per cache: this
    # position's entry of each row, and zeros in the slots a step reads that their row has not written
    # (some rows ahead of others). Whatever a state holds there (NaN, from torch.empty) then adds exactly
    # nothing to the masked read, whose weight for them is 0; such a slot holds nothing a later step could
    # need, and caches attnspec makes hold zeros there already. (Two index_put_ on one cache, AOTInductor
    # again copies it whole.)
    keys.transpose(1, 2).index_put_(slots.targets, _entries(k, keys.dtype, slots.cleared))  # (B, C, H_k, Dk)
    values.transpose(1, 2).index_put_(slots.targets, _entries(v, values.dtype, slots.cleared))
    if log_a is not None:
        _advance(bias, log_a, slots)
    o, _ = _read(q, keys, values, None if log_a is None else bias, slots, Dk ** -0.5 if scale is None else scale,
                 softcap, sinks, selected, B, H, Dv, v.dtype)
    return o, (keys, values, bias)


def _advance(bias: Tensor, log_a: Tensor, slots: "_Slots") -> None:
    """The decay bias (B, H, C) one position on, in place: one more decay ``log_a`` (B, H) between every written
    slot and now, and 0 at the slot this position writes (and at those cleared)."""
    bias.add_(log_a.unsqueeze(-1).to(bias.dtype))
    bias.transpose(1, 2).index_put_(slots.targets, torch.zeros((), dtype=bias.dtype, device=bias.device))


def _read(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, slots: "_Slots", scale: float,
          softcap: float | None, sinks: Tensor | None, selected: Tensor | None, B: int, H: int, Dv: int,
          dtype: torch.dtype) -> tuple[Tensor, Cache]:
    """The read of :func:`softmax_step` over the written ``slots``: o (B, H, Dv) in ``dtype``, and the cache read."""
    read = _Read(scale, (H, keys.shape[1], values.shape[1]), softcap)
    q = _as(q, keys.dtype)
    if slots.filled is not None:  # torch.compile cannot take a length from the data (capture_scalar_outputs)
        # (the lengths are read from the capacity here alone: an exported step's capacity is a dynamic size)
        o = _read_bucketed(q, keys, values, bias, slots.filled, read, read_lengths(keys.shape[2]), sinks, selected)
    else:
        o = read.prefix(q, keys, values, bias, slots.valid, slots.most, sinks=sinks, selected=selected)
    return _as(o.reshape(B, H, Dv), dtype), (keys, values, bias)


class _Slots(NamedTuple):
    """The cache slots of a step: those it writes, and those written by then: 0..least-1 by every row,
    least..most-1 by some (ints in eager code, unbacked sizes in an exported step)."""

    targets: tuple[Tensor, Tensor]
    """(rows, slots), (B + cleared,) int64 each: row b writes slot position[b] % C, then the ``cleared``
    slots read that their row has not written are zeroed."""
    cleared: int
    least: int | None
    most: int | None
    valid: Tensor | None
    """(B, most) bool: slot j written by row b; None when every row wrote them all (eager code only)."""
    filled: Tensor | None = None
    """(B,) how many slots each row has written: given (and least, most, valid None) in a torch.compile
    graph alone, whose read picks its length by it."""


def _slots(position: Tensor, capacity: int, chunked: bool = False) -> _Slots:
    """The slots of a step at ``position`` (B,): it writes slot position % C, and every slot before
    it is written (all C of a ring that wrapped; with ``chunked``, those of its chunk: slots 0 .. position % C,
    as a chunk of C positions starts at slot 0)."""
    this = (torch.arange(position.shape[0], device=position.device), _as(position % capacity, torch.long))
    filled = position % capacity + 1 if chunked else torch.clamp(position + 1, max=capacity)  # (B,)
    if torch.compiler.is_dynamo_compiling():
        return _Slots(this, 0, None, None, None, filled)
    if torch.compiler.is_exporting():  # one program for every position: the counts stay data
        least, most = filled.min().item(), filled.max().item()
        torch._check(least >= 1)  # what the slicing and reshaping below need to know of them
        torch._check(least <= most)
        torch._check(most <= capacity)
    else:  # eager: one host read
        least, most = (int(n) for n in torch.aminmax(filled))
        if least == most:
            return _Slots(this, 0, least, most, None)
    valid = _written_mask(filled, most)
    rows, slots = valid[:, least:].logical_not().nonzero().unbind(1)  # never a row's own slot: it is valid
    return _Slots((torch.cat([this[0], rows]), torch.cat([this[1], slots + least])), rows.shape[0], least, most,
                  valid)


def _written_mask(filled: Tensor, n) -> Tensor:
    """(B, n) bool: slot j of row b is written (j < filled[b])."""
    return torch.arange(n, device=filled.device).view(1, n) < filled.view(-1, 1)


def _entries(x: Tensor, dtype: torch.dtype, cleared: int) -> Tensor:
    """``x`` (B, heads, D) in ``dtype``, followed by ``cleared`` rows of zeros: (B + cleared, heads, D)."""
    x = _as(x, dtype)
    return x if isinstance(cleared, int) and cleared == 0 else torch.cat([x, x.new_zeros(cleared, *x.shape[1:])])


def _read_bucketed(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, filled: Tensor, read: _Read,
                   lengths: list[int], sinks: Tensor | None = None, selected: Tensor | None = None) -> Tensor:
    """``read.prefix`` at the shortest of ``lengths`` slots that holds ``filled.max()``, chosen by data
    (nested ``torch.cond``, one static branch per length); every row masked by ``filled`` by value (a
    branch may not write its inputs, so unwritten slots are masked in a copy)."""
    # a cond's operands are tensors: the optional ones (bias, sinks, selected) are there or not, known when tracing
    present = tuple(t is not None for t in (bias, sinks, selected))

    def optional(extra: tuple) -> list[Tensor | None]:  # [bias, sinks, selected] from a cond's operands
        given = iter(extra)
        return [next(given) if there else None for there in present]

    def prefix(n: int):
        def read_prefix(q, keys, values, filled, *extra):
            bias, sinks, selected = optional(extra)
            return read.prefix(q, keys, values, bias, _written_mask(filled, n), n, by_value=True, sinks=sinks,
                               selected=selected)
        return read_prefix

    operands = (q, keys, values, filled) + tuple(t for t in (bias, sinks, selected) if t is not None)
    if len(lengths) == 1:
        return prefix(lengths[0])(*operands)
    longer = lambda q, keys, values, filled, *extra: _read_bucketed(  # noqa: E731
        q, keys, values, optional(extra)[0], filled, read, lengths[1:], *optional(extra)[1:])
    return torch.cond(filled.max() <= lengths[0], prefix(lengths[0]), longer, operands)


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``; no op at all where it is in it already (a traced ``to`` of the same dtype
    stays in the program as two ops, run every step)."""
    return t if t.dtype == dtype else t.to(dtype)


class _Read(NamedTuple):
    """How a step reads the cache: the score scale and the head counts (H, H_k, H_v), given as numbers
    rather than read from the shapes, so that traced code (a ``torch.cond`` branch, an unbacked read
    length) sees plain sizes."""

    scale: float
    heads: tuple[int, int, int]
    softcap: float | None = None

    def prefix(self, q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, valid: Tensor | None, n,
               by_value: bool = False, sinks: Tensor | None = None, selected: Tensor | None = None) -> Tensor:
        """Softmax attention of ``q`` (B, H, Dk) over the first ``n`` cache slots (B, H_k, C, Dk) and
        (B, H_v, C, Dv), plus ``bias`` (B, H, C) where given, only the slots ``valid`` (B, n) where given and
        ``selected`` (B, C) where given, with a sink logit per head (``sinks`` (H,)) in each softmax where given.
        A slot not valid has weight exactly 0; ``by_value`` also replaces its score and zeroes its value
        (a copy), so that not even a NaN there reaches the output. Shared key/value heads are read in
        place (no copy per query head). Returns (B, H_v, H / H_v, Dv)."""
        H, k_heads, v_heads = self.heads
        for size, expected in ((q.shape[1], H), (keys.shape[1], k_heads), (values.shape[1], v_heads)):
            if isinstance(size, torch.SymInt):  # pins a traced read's head counts (a plain size is known already)
                torch._check(size == expected)
        keys, values, bias = keys[:, :, :n], values[:, :, :n], None if bias is None else bias[:, :, :n]
        if selected is not None:  # a sparse attention's choice among the written slots
            valid = selected[:, :n] if valid is None else valid & selected[:, :n]
        if k_heads == v_heads and not by_value and self.softcap is None and sinks is None:
            # one fused call, a key head's H / H_k query heads its "positions"
            mask = None if bias is None else bias.reshape(-1, k_heads, H // k_heads, n)
            if valid is not None:
                valid = valid.view(-1, 1, 1, n)
                mask = valid if mask is None else torch.where(valid, mask, float("-inf"))
            o = F.scaled_dot_product_attention(q.reshape(-1, k_heads, H // k_heads, q.shape[-1]), keys, values,
                                               attn_mask=mask, scale=self.scale)
            return o.view(-1, v_heads, H // v_heads, values.shape[-1])
        # scores per key head, weights per value head (their heads may group differently)
        scores = self.scale * torch.einsum("bgjd,bgcd->bgjc", q.reshape(-1, k_heads, H // k_heads, q.shape[-1]),
                                           keys).reshape(-1, H, n)
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        if bias is not None:
            scores = scores + bias
        if valid is not None:
            scores = torch.where(valid.view(-1, 1, n), scores, float("-inf"))
            if by_value:
                values = torch.where(valid.view(-1, 1, n, 1), values, 0.0)
        weights = weights_with_sinks(scores, sinks).view(-1, v_heads, H // v_heads, n)
        return torch.einsum("bgjc,bgcd->bgjd", weights, values).contiguous()


__all__ = ["Cache", "MIN_READ", "cache_of", "empty_cache", "read_lengths", "softmax_step"]
