"""Chunk mode: dense attention inside chunks of C positions, a scan over chunk states across chunks.

* Inside a chunk, pairwise decays ``exp(b_i - b_j)`` come from one fused pass over float64 cumulative
  sums of log|a| (exact to ~1e-11 because a chunk is short and log|a| is clamped at ``LOG_ZERO``,
  where exp is exactly 0 anyway), so gates near 0 (even exactly 0) or 1 give no NaN.
* Across chunks the states come from :func:`chunk_scan`: inside groups of ``GROUP`` chunks the
  recurrence itself, unrolled over the group and vectorised over everything else (one fused pass
  over the states, no matrix product), the group totals scanned the same way one level up, and a
  small quadratic form at the top. It serves per-head and per-channel, real and complex decays alike.
  Traced, the number of levels is fixed by ``max_length``, so ``torch.compile`` and ``torch.export`` see
  no Python loop over positions and no new length recompiles; eager code takes the levels its length needs.
* Shapes are written so symbolic shape reasoning never specialises on L: padding is always applied
  (``n = ceil(L / C) + 1`` chunks, never a single one), batched products are explicit ``bmm``s, and
  the padding is dropped with an index_select rather than a slice. ``n`` is written as one floor
  division, ``(L + 2C - 1) // C``: with ``ceil(L / C) + 1`` sympy distributes the stride ``C D n``
  into a sum, Inductor then fails to see that the chunked views are plain reshapes and copies every
  bmm operand.
* Without gradients (inference), float32 on the CPU, no decay or one real or complex decay per head:
  a fused C++ kernel (:mod:`attnspec.ops.linear.backends.native`) computes the same chunks with one thread per head
  walking its chunks in order, about 2x faster than the compiled graph path at L = 8192. It has no
  backward, so training takes the graph path; exported programs do too, so they load without attnspec.
* On CUDA, in float32, bfloat16 or float16 with no decay or one decay per head: Triton kernels
  (:mod:`attnspec.ops.linear.backends.triton`), forward and backward, registered as a traceable op, so compiled
  and exported programs keep them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.ops.linear.backends import native
from attnspec.ops.linear.scan import inclusive_scan, scan_steps
from attnspec.ops.linear.common import (LOG_ZERO, Decay, PairState, _add, _at_first, _decay_state, _read_state,
                                        _rotate, _rotate_state, _segsum, _phase_cumsum, _phase_segsum,
                                        _shift_in, _unpad, batched_matmul, wrap_phase)


def _native_chunked(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None, scale: float,
                    chunk_size: int) -> tuple[Tensor, PairState]:
    """The chunk mode on the CPU kernel; per-head decays ``(B, H, L, 1)`` go in as ``(B, H, L)``."""
    log_mag = phase = None
    if decay is not None:
        log_mag, phase = decay.log_mag.squeeze(-1), None if decay.phase is None else decay.phase.squeeze(-1)
    start_re, start_im = initial if initial is not None else (None, None)
    out, final_re, final_im = native.run_chunked(q, k, v, log_mag, phase, start_re, start_im, scale, chunk_size,
                                                 LOG_ZERO)
    return out, PairState(final_re, None if phase is None else final_im)


def _triton_chunked(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None, scale: float,
                    chunk_size: int, out_dtype: torch.dtype) -> tuple[Tensor, PairState]:
    """The chunk mode on the Triton kernels; per-head decays ``(B, H, L, 1)`` go in as ``(B, H, L)``."""
    from attnspec.ops.linear.backends import triton as triton_chunk

    log_mag = phase = None
    if decay is not None:
        log_mag, phase = decay.log_mag.squeeze(-1), None if decay.phase is None else decay.phase.squeeze(-1)
    start_re, start_im = initial if initial is not None else (None, None)
    out, final_re, final_im = triton_chunk.chunked_linear_attention(q, k, v, log_mag, phase, start_re, start_im,
                                                                     scale, chunk_size, out_dtype)
    return out, PairState(final_re, final_im)


GROUP = 16  # chunks per group of the cross-chunk scan: a recurrence unrolled over a group


# At most this many elements go to the quadratic top level of the cross-chunk scan (its cost is
# n^2 Dk Dv per head, a matrix product): 128 keeps max_len up to 8128 at chunk size 64 free of
# grouping levels, whose unrolled steps make compiled and exported graphs several times larger.
TOP = 128


def scan_levels(n: int, max_length: int | None = None, unit: int = 1) -> int:
    """Grouping levels of :func:`chunk_scan` for ``n`` elements (or for the count at ``max_length``).

    Each level replaces ``m`` elements by ``ceil(m / GROUP) + 1`` group totals, until at most ``TOP``
    are left for the quadratic top level.
    """
    count = -(-max_length // unit) + 1 if max_length is not None else int(n)
    levels = 0
    while count > TOP:
        count = -(-count // GROUP) + 1
        levels += 1
    return levels


def chunk_scan(log_mag: Tensor, phase: Tensor | None, writes: PairState, levels: int) -> PairState:
    """Inclusive prefix states of ``S_c = diag(a_c) S_(c-1) + W_c`` along axis ``-3`` of ``writes``.

    Args:
        log_mag, phase: ``(B, H, n, Dd)`` log-magnitude and phase (or None) of ``a_c``, ``Dd`` 1 or Dk.
        writes: ``(B, H, n, Dk, Dv)`` real and imaginary parts (im None for real decays).
        levels: grouping levels (:func:`scan_levels`), fixed by the caller so that compiled code
            does not branch on ``n``.

    Within groups of ``GROUP`` elements the recurrence itself runs, unrolled over the group and
    vectorised over all groups, heads and state entries, so Inductor fuses it into one pass over
    the states. The group totals are scanned the same way one level up, and the top level is the
    quadratic form (a decay matrix from segment sums times the stacked states).
    """
    if levels == 0:
        return _quadratic_scan(log_mag, phase, writes)
    n = log_mag.shape[2]
    g = (n + 2 * GROUP - 1) // GROUP  # = ceil(n / GROUP) + 1: unconditional padding and g >= 2, as in _chunked
    pad = g * GROUP - n
    group = lambda t: None if t is None else t.unflatten(2, (g, GROUP))  # noqa: E731
    log_mag = group(F.pad(log_mag, [0, 0, 0, pad]))  # padded elements: a = 1 ...
    phase = None if phase is None else group(F.pad(phase, [0, 0, 0, pad]))
    # ... and write nothing. The padding is a clamped gather times 0/1 rather than F.pad: Inductor
    # turns F.pad into masked loads, which it does not share between the unrolled steps.
    index = torch.arange(g * GROUP, device=log_mag.device)
    keep = (index < n).to(writes.re.dtype).reshape(g, GROUP, 1, 1)
    spread = lambda t: None if t is None else group(t.index_select(2, index.clamp(max=n - 1))) * keep  # noqa: E731
    grouped = PairState(spread(writes.re), spread(writes.im))
    if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
        local = _sequential_scan(log_mag, phase, grouped)
    else:  # eager and exported programs run op by op: log2(GROUP) rounds instead of GROUP - 1 steps
        local = inclusive_scan(log_mag, phase, grouped, dim=-3, steps=scan_steps(GROUP))
    totals = PairState(local.re[:, :, :, -1], None if local.im is None else local.im[:, :, :, -1])
    group_phase = None if phase is None else wrap_phase(phase.to(torch.float64).sum(dim=-2)).to(phase.dtype)
    done = chunk_scan(log_mag.sum(dim=-2), group_phase, totals, levels - 1)
    entering = PairState(_shift_in(done.re, None), None if done.im is None else _shift_in(done.im, None))
    from_start = torch.cumsum(log_mag, dim=-2)  # (B, H, g, GROUP, Dd): decay from the group start
    from_start_phase = None if phase is None else _phase_cumsum(phase, dim=-2)
    carried = _decay_state(PairState(entering.re.unsqueeze(3), None if entering.im is None else entering.im.unsqueeze(3)),
                           from_start, from_start_phase)
    states = _add(local, carried)
    ungroup = lambda t: None if t is None else _unpad(t.flatten(2, 3), n)  # noqa: E731
    return PairState(ungroup(states.re), ungroup(states.im))


def _sequential_scan(log_mag: Tensor, phase: Tensor | None, writes: PairState) -> PairState:
    """The recurrence along axis -3 of ``writes`` (``(..., G, Dk, Dv)``), unrolled over its G elements."""
    if phase is not None and writes.im is None:  # a complex transition makes every state after the first complex
        writes = PairState(writes.re, torch.zeros_like(writes.re))
    mag = torch.exp(log_mag)
    cos = None if phase is None else torch.cos(phase)
    sin = None if phase is None else torch.sin(phase)
    pick = lambda t, j: None if t is None else t[..., j, :, :]  # noqa: E731
    state = PairState(pick(writes.re, 0), pick(writes.im, 0))
    states = [state]
    for j in range(1, writes.re.shape[-3]):
        state = _add(_rotate_state(state, mag[..., j, :], None if phase is None else (cos[..., j, :], sin[..., j, :])),
                     PairState(pick(writes.re, j), pick(writes.im, j)))
        states.append(state)
    stack = lambda part: None if part[0] is None else torch.stack(part, dim=-3)  # noqa: E731
    return PairState(stack([s.re for s in states]), stack([s.im for s in states]))


def _quadratic_scan(log_mag: Tensor, phase: Tensor | None, writes: PairState) -> PairState:
    """Inclusive states ``S_c = sum_{c' <= c} exp(sum_{s=c'+1..c} log a_s) W_c'`` all at once.

    ``log_mag``/``phase``: ``(..., n, Dd)``; ``writes``: ``(..., n, Dk, Dv)``. O(n^2 Dk Dv) work, so it
    is only used on at most ``TOP`` elements.
    """
    rel = _segsum(log_mag)  # (..., n, n, Dd), -inf above the diagonal
    weight = torch.exp(rel)
    if phase is None:
        return PairState(_apply_decay_matrix(weight, writes.re),
                         None if writes.im is None else _apply_decay_matrix(weight, writes.im))
    angle = _phase_segsum(phase)  # zero weight where rel = -inf, so no masking is needed
    t_re, t_im = weight * torch.cos(angle), weight * torch.sin(angle)
    w_im = writes.im if writes.im is not None else torch.zeros_like(writes.re)
    re = _apply_decay_matrix(t_re, writes.re) - _apply_decay_matrix(t_im, w_im)
    im = _apply_decay_matrix(t_re, w_im) + _apply_decay_matrix(t_im, writes.re)
    return PairState(re, im)


def _apply_decay_matrix(weight: Tensor, states: Tensor) -> Tensor:
    """``out[..., c, :, :] = sum_c' weight[..., c, c', :, None] * states[..., c', :, :]``.

    ``weight``: ``(..., n, n, Dd)`` with Dd 1 or Dk; ``states``: ``(..., n, Dk, Dv)``. One batched
    matrix product: over the flattened state entries for a per-head decay (Dd = 1), per state row
    for a per-channel one (a broadcast product would materialise n x n x Dk x Dv numbers when run
    op by op, as in eager code and exported programs).
    """
    n, Dk, Dv = states.shape[-3:]
    if weight.shape[-1] == 1:
        return batched_matmul(weight[..., 0], states.reshape(*states.shape[:-2], Dk * Dv)).reshape(states.shape)
    out = batched_matmul(weight.movedim(-1, -3), states.transpose(-3, -2))  # (..., Dk, n, Dv)
    return out.transpose(-3, -2)


def _chunked(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None,
             chunk_size: int, max_length: int | None):
    """Dense attention inside chunks of C positions, a scan over per-chunk states across chunks."""
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    C = chunk_size
    # n = ceil(L / C) + 1 chunks and pad = n C - L, always applied: written this way L + pad = n C holds
    # symbolically, and the extra all-padding chunk keeps n >= 2, so compiled and exported code never
    # specialises on "one chunk" (size-1 dimensions are special to torch's shape reasoning) or on L % C.
    # One floor division rather than ceil + 1 keeps the chunked views free (module docstring).
    n = (L + 2 * C - 1) // C
    pad = n * C - L
    traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    q, k, v = (F.pad(t, [0, 0, 0, pad]) for t in (q, k, v))
    if decay is not None:  # padded positions have a = 1 (log 0) and write nothing
        decay = Decay(F.pad(decay.log_mag, [0, 0, 0, pad]),
                      None if decay.phase is None else F.pad(decay.phase, [0, 0, 0, pad]))
    q, k, v = (t.reshape(B, H, n, C, t.shape[-1]) for t in (q, k, v))
    mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()

    if decay is None:
        scores = batched_matmul(q, k.transpose(-1, -2)).masked_fill(~mask, 0.0)
        out = batched_matmul(scores, v)
        chunk_states = PairState(torch.cumsum(batched_matmul(k.transpose(-1, -2), v), dim=2), None)  # inclusive over chunks
        if initial is not None:
            chunk_states = PairState(chunk_states.re + initial.re.unsqueeze(2), None)
        entering = PairState(_shift_in(chunk_states.re, initial.re if initial is not None else None), None)
        out = out + _read_state(q, None, entering)
        final = PairState(chunk_states.re[:, :, -1], None)
        return _unpad(out.reshape(B, H, n * C, Dv), L), final

    # Log-decays from the chunk start to each position, b_i = sum_{s <= i in chunk} log a_s, accumulated
    # in float64: every decay below is exp of a difference of these, and float64 keeps the difference
    # exact to ~1e-11 even after a stretch of strong decays (|b| up to C * |LOG_ZERO|). Clamping at
    # LOG_ZERO keeps a = 0 (log a = -inf) exactly 0 while avoiding inf - inf.
    Dd = decay.log_mag.shape[-1]
    wide = lambda t: torch.cumsum(t.reshape(B, H, n, C, Dd).to(torch.float64), dim=-2)  # noqa: E731
    from_start = wide(decay.log_mag.clamp_min(LOG_ZERO))  # (B, H, n, C, Dd)
    from_start_phase = None if decay.phase is None else wide(decay.phase)
    narrow = lambda t: None if t is None else t.to(q.dtype)  # noqa: E731
    narrow_phase = lambda t: None if t is None else wrap_phase(t).to(q.dtype)  # noqa: E731
    pairwise = lambda t: t.unsqueeze(-2) - t.unsqueeze(-3)  # noqa: E731  [.., i, j, :] = t_i - t_j

    # Inside each chunk: pairwise decays exp(b_i - b_j) for j <= i, 0 above the diagonal.
    causal = mask.unsqueeze(-1)
    pair = torch.exp(torch.where(causal, narrow(pairwise(from_start)), float("-inf")))
    if from_start_phase is not None:
        pair = pair * torch.cos(narrow_phase(pairwise(from_start_phase)))
    if Dd == 1:
        scores = batched_matmul(q, k.transpose(-1, -2)) * pair.squeeze(-1)
    else:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3) * pair).sum(-1)  # per-channel decays: (.., i, j, Dk)
    out = batched_matmul(scores, v)

    # Each chunk's write to the state: sum_j exp(b_C - b_j) k_j^T v_j.
    chunk_mag, chunk_phase = from_start[..., -1, :], None if from_start_phase is None else from_start_phase[..., -1, :]
    to_end = narrow(chunk_mag.unsqueeze(-2) - from_start)
    to_end_phase = None if from_start_phase is None else narrow_phase(chunk_phase.unsqueeze(-2) - from_start_phase)
    k_re, k_im = _rotate(k, to_end, to_end_phase)
    writes = PairState(batched_matmul(k_re.transpose(-1, -2), v),
                       None if k_im is None else batched_matmul(k_im.transpose(-1, -2), v))
    chunk_mag, chunk_phase = narrow(chunk_mag), narrow_phase(chunk_phase)  # (B, H, n, Dd): decay across a chunk
    if initial is not None:  # fold S0 into the first chunk's write
        first = _decay_state(initial, chunk_mag[:, :, 0], None if chunk_phase is None else chunk_phase[:, :, 0])
        writes = _add(writes, PairState(_at_first(first.re, n), None if first.im is None else _at_first(first.im, n)))
    states = chunk_scan(chunk_mag, chunk_phase, writes, levels=scan_levels(n, max_length if traced else None, C))
    start_re = initial.re if initial is not None else None
    start_im = initial.im if initial is not None else None
    entering = PairState(_shift_in(states.re, start_re), None if states.im is None else _shift_in(states.im, start_im))
    q_re, q_im = _rotate(q, narrow(from_start), narrow_phase(from_start_phase))
    out = out + _read_state(q_re, q_im, entering)
    final = PairState(states.re[:, :, -1], None if states.im is None else states.im[:, :, -1])
    return _unpad(out.reshape(B, H, n * C, Dv), L), final

