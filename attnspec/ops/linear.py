"""Gated linear attention in four execution modes that compute the same function.

Per batch and head, with q, k already feature-mapped (and re-weighted):

    S_t = diag(a_t) S_(t-1) + k_t^T v_t,      o_t = Re(scale * q_t S_t)

where ``a_t = exp(log_a_t)`` is real or complex (``log|a| + i theta``), per head or per key
channel. With ``normalize=True`` the same recurrence is run on ``k`` alone and the output is
divided by ``Re(scale * q_t z_t)`` clamped below at ``eps`` (:func:`apply_normalizer`, the one place
the normaliser is computed). Non-causal attention sums over all positions (no transition).

Implementation choices (why, not what):

* Complex transitions are carried as (log-magnitude, phase) and the state as a pair of real
  tensors (re, im), so Inductor only ever sees real arithmetic.
* Decays between positions are never cumprod and 1/cumprod (which underflow). Over a whole
  sequence they are *segment sums* of log|a| accumulated directly (never differences of long
  cumulative sums); inside a chunk they are differences of the chunk's cumulative sums taken in
  float64, which stay exact to ~1e-11 because a chunk is short and log|a| is clamped at
  ``LOG_ZERO`` (where exp is exactly 0 anyway). So gates near 0 (even exactly 0,
  ``log_a = -inf``) and long sequences neither underflow into NaN nor lose precision.
* The normaliser is the same recurrence applied to an extra all-ones column of ``v``.
* Chunk mode: dense attention inside chunks of ``chunk_size`` (pairwise decays ``exp(b_i - b_j)``
  from one fused pass, no C x C cumulative sum); across chunks the states come from
  :func:`chunk_scan`: inside groups of ``GROUP`` chunks the recurrence itself, unrolled over the
  group and vectorised over everything else (one fused pass over the states, no matrix product),
  the group totals scanned the same way one level up, and a small quadratic form at the top. It
  serves per-head and per-channel, real and complex decays alike. The number of levels is fixed
  by ``max_length``, so ``torch.compile`` and ``torch.export`` see no Python loop over positions
  and no new length recompiles.
* Chunk mode without gradients (inference), float32 on the CPU, no decay or one real or complex
  decay per head: a fused C++ kernel (:mod:`attnspec.ops.native`) computes the same chunks with
  one thread per head walking its chunks in order, about 2x faster than the compiled graph path
  at L = 8192. It has no backward, so training takes the graph path; exported programs do too, so
  they load without attnspec.
* Scan mode: a Hillis-Steele prefix scan over positions with the GateLoop operator
  ``(a1, S1) . (a2, S2) = (a1 a2, a2 S1 + S2)``, materialising every per-position state (small
  states only). torch's ``associative_scan`` is not used: on CPU it supports only
  ``combine_mode="generic"``, recompiles per length and cannot be exported with a dynamic length.
* Shapes are written so symbolic shape reasoning never specialises on L: padding is always
  applied (``n = ceil(L / C) + 1`` chunks, never a single one), batched products are explicit
  ``bmm``s, and the padding is dropped with an index_select rather than a slice. ``n`` is written
  as one floor division, ``(L + 2C - 1) // C``: with ``ceil(L / C) + 1`` sympy distributes the
  stride ``C D n`` into a sum, Inductor then fails to see that the chunked views are plain
  reshapes and copies every bmm operand.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops import native

MODES = ("recurrent", "scan", "chunk", "quadratic")
# log|a| at or below this is a = 0: exp underflows to exactly 0 in float32 and float64 alike.
LOG_ZERO = -1000.0
State = Tensor | tuple[Tensor, Tensor]


class Decay(NamedTuple):
    """A log-transition split for real arithmetic: ``log_a = log_mag + i * phase``.

    ``log_mag``: (B, H, L, 1) per head or (B, H, L, Dk) per channel. ``phase``: same shape or None.
    """

    log_mag: Tensor
    phase: Tensor | None


class PairState(NamedTuple):
    """A possibly complex state as real tensors; ``im`` is None for real transitions."""

    re: Tensor
    im: Tensor | None


# ----------------------------------------------------------------------------- public API


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_a: Tensor | None = None,
    *,
    causal: bool = True,
    normalize: bool = False,
    scale: float = 1.0,
    eps: float = 1e-6,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: State | None = None,
    return_state: bool = False,
    max_length: int | None = None,
    log_scale: Tensor | None = None,
) -> Tensor | tuple[Tensor, State]:
    """Causal or non-causal (gated) linear attention.

    Args:
        q: ``(B, H, L, Dk)`` queries, already feature-mapped. Float32 or float64.
        k: ``(B, H, L, Dk)`` keys, already feature-mapped; same dtype as ``q``.
        v: ``(B, H, L, Dv)`` values; same dtype.
        log_a: log-transition, ``None`` (a = 1), ``(B, H, L)`` (one per head) or ``(B, H, L, Dk)``
            (one per key channel). Real (``log|a|``) or complex (``log|a| + i theta``, complex64 with
            float32 inputs, complex128 with float64). ``-inf`` (a = 0) resets the state. Compiled
            code passes a :class:`Decay` ``(log_mag, phase)`` of real ``(B, H, L, 1 or Dk)`` tensors
            instead, so no complex tensor enters the graph.
        causal: position t sees positions <= t. Non-causal requires ``log_a is None``.
        normalize: divide by the same recurrence run on ``k`` alone (linear-attention normaliser).
        scale: multiplier on ``q``.
        eps: lower clamp of the normaliser, on its true scale (see ``log_scale``).
        mode: ``"recurrent"`` (sequential reference), ``"scan"`` (parallel prefix scan over
            positions, O(L Dk Dv) memory), ``"chunk"`` (dense within chunks, scan across chunks)
            or ``"quadratic"`` (an L x L score matrix with log-space decay differences).
        chunk_size: chunk length of the chunk mode; any L works (the tail is padded).
        initial_state: state before position 0: ``S0`` of shape ``(B, H, Dk, Dv)`` (complex when
            ``log_a`` is complex), or ``(S0, z0)`` with ``z0`` of shape ``(B, H, Dk)`` when
            ``normalize``. Causal only.
        return_state: also return the state after the last position, in the same form, so that
            feeding it back as ``initial_state`` continues the sequence.
        max_length: longest L the caller will use. Fixes the number of scan steps so compiled
            code does not specialise on L; longer inputs raise.
        log_scale: ``(B, H, L)`` per-query log factor of the kernel, or None (0): the kernel the
            features stand for is ``exp(log_scale_i) * q_i . k_j`` (Performer features are stored
            rescaled so they stay finite). It cancels in the normalised output; only the ``eps``
            clamp depends on it, which then acts on the true normaliser.

    Returns:
        ``o`` of shape ``(B, H, L, Dv)`` with the dtype of ``v``; with ``return_state`` also the
        final state.

    Raises:
        ShapeError: an argument has the wrong shape, dtype or combination (the message names it).
    """
    decay, initial = _check_inputs(q, k, v, log_a, causal, normalize, mode, chunk_size, initial_state,
                                   return_state, max_length, scale, eps)
    if normalize:
        # The normaliser z is the state of the same recurrence for a value that is always 1.
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if _is_empty_sequence(q):  # every mode agrees: nothing to attend to, the state passes through
        out = v.new_zeros(*v.shape[:2], 0, v.shape[-1])
        final = initial if initial is not None else _zero_state(q, v, decay is not None and decay.phase is not None)
        out = out[..., :-1] if normalize else out
        return (out, _export_state(final, normalize)) if return_state else out
    if _native_chunk_applies(q, k, v, decay, initial, causal, mode):
        out, final = _native_chunked(q, k, v, decay, initial, scale, chunk_size)
    elif not causal:
        out, final = _noncausal(q * scale, k, v, mode), None
    elif mode == "recurrent":
        out, final = _recurrent(q * scale, k, v, decay, initial)
    elif mode == "scan":
        out, final = _scan_mode(q * scale, k, v, decay, initial, max_length)
    elif mode == "chunk":
        out, final = _chunked(q * scale, k, v, decay, initial, chunk_size, max_length)
    else:
        out, final = _quadratic(q * scale, k, v, decay, initial)
    if normalize:
        out = apply_normalizer(out, eps, log_scale)
    if not return_state:
        return out
    return out, _export_state(final, normalize)


def _is_empty_sequence(q: Tensor) -> bool:
    """L = 0 in eager code (traced code has L >= 1: export's dynamic length starts at 2)."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    return q.shape[2] == 0


def apply_normalizer(out: Tensor, eps: float, log_scale: Tensor | None = None) -> Tensor:
    """Normalised output: the value columns of ``out`` divided by its last column, the normaliser.

    Args:
        out: ``(..., Dv + 1)``: numerator columns, then the normaliser ``Re(q~ . z)``.
        eps: lower clamp of the normaliser on its true scale ``exp(log_scale) * out[..., -1]``.
        log_scale: ``(...)`` (``out``'s shape without the last dimension) or None (0).

    Returns:
        ``(..., Dv)``. The clamp is ``eps * exp(-log_scale)`` on the stored normaliser: features
        stored rescaled (Performer keys carry ``exp(-|w|^2/2)``, about ``e^(-d/2)``) would otherwise
        meet an ``eps`` far above their normaliser, and the clamp would replace it (relative error
        1.0 against softmax at d_qk = 64 before this). The floor's exponent is kept within the dtype's
        range, so it is never 0 (0/0) nor inf.
    """
    numerator, normalizer = out[..., :-1], out[..., -1:]
    if log_scale is None:
        return numerator / normalizer.clamp_min(eps)
    info = torch.finfo(out.dtype)
    log_floor = math.log(eps) - log_scale.to(out.dtype).unsqueeze(-1)
    log_floor = log_floor.clamp(math.log(info.tiny), math.log(info.max) / 2)
    return numerator / torch.maximum(normalizer, torch.exp(log_floor))


def _native_chunk_applies(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None,
                          causal: bool, mode: str) -> bool:
    """Whether the chunk mode runs on the CPU kernel (:mod:`attnspec.ops.native`) rather than the graph path.

    The kernel covers float32 CPU inputs with no decay or one real or complex decay per head, and
    has no backward, so it is used only when no gradient is needed. Exported programs always take the
    graph path, so that they load without attnspec.
    """
    if mode != "chunk" or not causal or q.device.type != "cpu" or q.dtype != torch.float32:
        return False
    if decay is not None and decay.log_mag.shape[-1] != 1:
        return False
    if torch.compiler.is_exporting():
        return False
    inputs = (q, k, v, *(decay or ()), *(initial or ()))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
        return False
    return native.available()


def _native_chunked(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None, scale: float,
                    chunk_size: int) -> tuple[Tensor, PairState]:
    """The chunk mode on the CPU kernel; per-head decays ``(B, H, L, 1)`` go in as ``(B, H, L)``."""
    log_mag = phase = None
    if decay is not None:
        log_mag, phase = decay.log_mag.squeeze(-1), None if decay.phase is None else decay.phase.squeeze(-1)
    start_re, start_im = initial if initial is not None else (None, None)
    out, final_re, final_im = native.chunked_linear_attention(q, k, v, log_mag, phase, start_re, start_im, scale,
                                                              chunk_size, LOG_ZERO)
    return out, PairState(final_re, None if phase is None else final_im)


# ----------------------------------------------------------------------------- validation


def _check_inputs(q, k, v, log_a, causal, normalize, mode, chunk_size, initial_state, return_state, max_length,
                  scale, eps):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.float64):
            raise ShapeError(f"{name} must be float32 or float64, got {t.dtype}")
    B, H, L, Dk = q.shape
    if k.shape != q.shape:
        raise ShapeError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ShapeError(f"v must have shape (B, H, L, Dv) = ({B}, {H}, {L}, Dv), got {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ShapeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if mode not in MODES:
        raise ShapeError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):  # traced floats may be symbolic
        for name, number in (("scale", scale), ("eps", eps)):
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise ShapeError(f"{name} must be a finite number, got {number!r}")
        if eps <= 0:
            raise ShapeError(f"eps must be positive, got {eps!r}")
    if mode == "chunk" and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ShapeError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if max_length is not None and isinstance(L, int) and L > max_length:
        raise ShapeError(f"sequence length {L} exceeds max_length = {max_length}")
    if not causal and log_a is not None:
        raise ShapeError("log_a needs causal=True: a transition orders positions")
    if not causal and initial_state is not None:
        raise ShapeError("initial_state needs causal=True")
    if not causal and return_state:
        raise ShapeError("return_state needs causal=True")
    decay = _split_log_a(log_a, q) if log_a is not None else None
    is_complex = decay is not None and decay.phase is not None
    initial = _import_state(initial_state, q, v, normalize, is_complex) if initial_state is not None else None
    return decay, initial


def _split_log_a(log_a: Tensor, q: Tensor) -> Decay:
    B, H, L, Dk = q.shape
    if isinstance(log_a, Decay):
        return _check_decay_pair(log_a, q)
    if not isinstance(log_a, Tensor):
        raise ShapeError(f"log_a must be a tensor, a Decay pair or None, got {type(log_a).__name__}")
    if tuple(log_a.shape) not in ((B, H, L), (B, H, L, Dk)):
        raise ShapeError(f"log_a must have shape (B, H, L) = ({B}, {H}, {L}) or (B, H, L, Dk) = "
                         f"({B}, {H}, {L}, {Dk}), got {tuple(log_a.shape)}")
    expected_complex = torch.complex64 if q.dtype == torch.float32 else torch.complex128
    if log_a.dtype not in (q.dtype, expected_complex):
        raise ShapeError(f"log_a must be {q.dtype} (real) or {expected_complex} (complex) for {q.dtype} inputs, "
                         f"got {log_a.dtype}")
    if log_a.dim() == 3:
        log_a = log_a.unsqueeze(-1)
    if log_a.is_complex():
        return Decay(log_a.real, log_a.imag)
    return Decay(log_a, None)


def _check_decay_pair(decay: Decay, q: Tensor) -> Decay:
    B, H, L, Dk = q.shape
    for name, t in (("log_a.log_mag", decay.log_mag), ("log_a.phase", decay.phase)):
        if t is None:
            continue
        if tuple(t.shape) not in ((B, H, L, 1), (B, H, L, Dk)) or t.dtype != q.dtype:
            raise ShapeError(f"{name} must be {q.dtype} with shape (B, H, L, 1) or (B, H, L, Dk) = "
                             f"({B}, {H}, {L}, 1 or {Dk}), got {tuple(t.shape)} {t.dtype}")
    if decay.phase is not None and decay.phase.shape != decay.log_mag.shape:
        raise ShapeError("log_a.phase must have the shape of log_a.log_mag")
    return decay


def _import_state(state: State, q: Tensor, v: Tensor, normalize: bool, is_complex: bool) -> PairState:
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    if normalize:
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            raise ShapeError("with normalize=True, initial_state must be a pair (S0, z0)")
        S0, z0 = state
        if not isinstance(z0, Tensor) or tuple(z0.shape) != (B, H, Dk):
            raise ShapeError(f"initial_state z0 must have shape (B, H, Dk) = ({B}, {H}, {Dk}), "
                             f"got {tuple(getattr(z0, 'shape', ()))}")
    else:
        S0, z0 = state, None
    if not isinstance(S0, Tensor) or tuple(S0.shape) != (B, H, Dk, Dv):
        raise ShapeError(f"initial_state S0 must have shape (B, H, Dk, Dv) = ({B}, {H}, {Dk}, {Dv}), "
                         f"got {tuple(getattr(S0, 'shape', ()))}")
    if S0.is_complex() and not is_complex:
        raise ShapeError("initial_state is complex but log_a is real (or None)")
    if z0 is not None:
        S0 = torch.cat([S0, z0.to(S0.dtype).unsqueeze(-1)], dim=-1)
    if S0.is_complex():
        return PairState(S0.real.to(q.dtype), S0.imag.to(q.dtype))
    S0 = S0.to(q.dtype)
    return PairState(S0, torch.zeros_like(S0) if is_complex else None)


def _export_state(state: PairState, normalize: bool) -> State:
    S = state.re if state.im is None else torch.complex(state.re, state.im)
    if normalize:
        return S[..., :-1], S[..., -1]
    return S


# ----------------------------------------------------------------------------- shared pieces


def _segsum(x: Tensor) -> Tensor:
    """``out[..., i, j, :] = sum_{s=j+1..i} x[..., s, :]`` for ``i >= j`` and ``-inf`` for ``i < j``.

    ``x``: ``(..., T, D)`` -> ``(..., T, T, D)``. Built as a cumulative sum down the rows of a
    matrix whose row ``s`` holds ``x_s`` only in the columns ``j < s``: every entry accumulates
    only its own terms, so there is no cancellation and no ``inf - inf``.
    """
    T = x.shape[-2]
    rows = x.unsqueeze(-2).expand(*x.shape[:-2], T, T, x.shape[-1])  # [..., s, j, :] = x_s
    below = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)  # j < s
    rows = rows.masked_fill(~below.unsqueeze(-1), 0.0)
    sums = torch.cumsum(rows, dim=-3)  # [..., i, j] = sum_{s <= i, s > j} x_s
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    return sums.masked_fill(~causal.unsqueeze(-1), float("-inf"))


def batched_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for equal leading (batch) dims, as one ``bmm`` on explicitly flattened batches.

    ``torch.matmul``'s decomposition branches on whether batch dimensions have size 1, which
    makes compiled code recompile when the number of chunks changes from 1 to more; an explicit
    bmm has no such branch.
    """
    batch = a.shape[:-2]
    count = math.prod(batch)
    out = torch.bmm(a.reshape(count, a.shape[-2], a.shape[-1]), b.reshape(count, b.shape[-2], b.shape[-1]))
    return out.reshape(*batch, a.shape[-2], b.shape[-1])


def _rotate(x: Tensor, log_mag: Tensor, phase: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``x * exp(log_mag + i phase)`` as (re, im); im is None for real decays."""
    scaled = x * torch.exp(log_mag)
    if phase is None:
        return scaled, None
    return scaled * torch.cos(phase), scaled * torch.sin(phase)


def wrap_phase(phase: Tensor) -> Tensor:
    """``phase`` reduced to [-pi, pi): only cos and sin of phases are ever used.

    Phase sums grow with the length (a fixed RetNet-style theta summed over 4096 positions, times
    100, is ~4e5 rad, where a float32 ulp is 0.03 rad), so every sum of phases is reduced before it
    is narrowed to the input dtype or summed again.
    """
    return torch.remainder(phase + math.pi, 2 * math.pi) - math.pi


def _phase_cumsum(phase: Tensor, dim: int) -> Tensor:
    """Inclusive cumulative sum of ``phase`` along ``dim``, taken in float64 and reduced (same dtype out)."""
    return wrap_phase(torch.cumsum(phase.to(torch.float64), dim=dim)).to(phase.dtype)


def _phase_segsum(phase: Tensor) -> Tensor:
    """``out[..., i, j, :] = sum_{s=j+1..i} phase_s`` reduced to [-pi, pi), for all i, j (the caller masks j > i).

    ``phase``: ``(..., T, D)`` -> ``(..., T, T, D)``. Differences of float64 cumulative sums: exact to
    ~1e-16 * |sum|, and phases (unlike log-magnitudes) are finite, so no inf - inf can arise.
    """
    total = torch.cumsum(phase.to(torch.float64), dim=-2)
    return wrap_phase(total.unsqueeze(-2) - total.unsqueeze(-3)).to(phase.dtype)


def _read_state(q_re: Tensor, q_im: Tensor | None, state: PairState) -> Tensor:
    """``Re((q_re + i q_im) @ (S.re + i S.im))`` for queries (..., T, Dk) and states (..., Dk, Dv)."""
    out = batched_matmul(q_re, state.re)
    if q_im is not None and state.im is not None:
        out = out - batched_matmul(q_im, state.im)
    return out


def _decay_state(state: PairState, log_mag: Tensor, phase: Tensor | None) -> PairState:
    """``diag(exp(log_mag + i phase)) @ S``; ``log_mag``/``phase`` (..., Dk) broadcast over Dv."""
    rotation = None if phase is None else (torch.cos(phase), torch.sin(phase))
    return _rotate_state(state, torch.exp(log_mag), rotation)


def _add(a: PairState, b: PairState) -> PairState:
    if a.im is None and b.im is None:
        return PairState(a.re + b.re, None)
    a_im = a.im if a.im is not None else torch.zeros_like(a.re)
    b_im = b.im if b.im is not None else torch.zeros_like(b.re)
    return PairState(a.re + b.re, a_im + b_im)


def scan_steps(n: int, max_length: int | None = None, unit: int = 1) -> int:
    """Number of Hillis-Steele steps for ``n`` elements (or for ``ceil(max_length / unit)`` if given)."""
    count = -(-max_length // unit) if max_length is not None else n
    return max(0, math.ceil(math.log2(max(int(count), 1))))


def inclusive_scan(log_mag: Tensor, phase: Tensor | None, state: PairState, dim: int, steps: int) -> PairState:
    """Prefix "sums" of ``(a_t, U_t)`` under ``(a1, U1) . (a2, U2) = (a1 a2, a2 U1 + U2)`` along ``dim``.

    ``log_mag``/``phase``: ``(..., T, Dk')`` with ``Dk'`` 1 or Dk; ``state``: ``(..., T, Dk, Dv)``; ``dim`` is
    the T axis of ``state`` (negative, counted from the end). Hillis-Steele: ``steps`` rounds of
    shift-by-2^s and combine, so the result is exact whenever ``2**steps >= T``.
    """
    assert dim < 0
    decay_dim = dim + 1
    # The phase of the segment ending at t is a difference of float64 prefix sums, rounded once:
    # doubling it in the input dtype would add one rounding per level, growing with the segment.
    phase_prefix = None if phase is None else torch.cumsum(phase.to(torch.float64), dim=decay_dim)
    for s in range(steps):
        shift = 1 << s
        prev = PairState(_shift(state.re, shift, dim), None if state.im is None else _shift(state.im, shift, dim))
        prev_mag = _shift(log_mag, shift, decay_dim)  # padded with log 1 = 0
        if phase_prefix is not None:  # where t < shift the previous state is 0, so the phase there is moot
            phase = wrap_phase(phase_prefix - _shift(phase_prefix, shift, decay_dim)).to(log_mag.dtype)
        state = _add(_decay_state(prev, log_mag, phase), state)
        log_mag = log_mag + prev_mag
    return state


def _shift(x: Tensor, shift: int, dim: int) -> Tensor:
    """Shift ``x`` towards higher indices along ``dim`` by ``shift``, filling with zeros."""
    size = x.shape[dim]
    pad = [0, 0] * (-dim - 1) + [shift, 0]
    return F.pad(x, pad).narrow(dim, 0, size)


GROUP = 16  # chunks per group of the cross-chunk scan: a recurrence unrolled over a group
TOP = 64  # at most this many elements go to the quadratic top level of the cross-chunk scan


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
    local = _sequential_scan(log_mag, phase, PairState(spread(writes.re), spread(writes.im)))
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


def _rotate_state(state: PairState, mag: Tensor, rotation: tuple[Tensor, Tensor] | None) -> PairState:
    """``diag(mag * (cos + i sin)) @ S`` with precomputed factors of shape (..., Dd), broadcast over Dv."""
    mag = mag.unsqueeze(-1)
    if rotation is None:
        return PairState(state.re * mag, None if state.im is None else state.im * mag)
    cos, sin = (t.unsqueeze(-1) for t in rotation)
    im = state.im if state.im is not None else torch.zeros_like(state.re)
    return PairState(mag * (cos * state.re - sin * im), mag * (sin * state.re + cos * im))


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

    ``weight``: ``(..., n, n, Dd)`` with Dd 1 or Dk; ``states``: ``(..., n, Dk, Dv)``. A broadcast
    product summed by Inductor in one reduction (no bmm, whose batch shape would depend on Dd).
    """
    return (weight.unsqueeze(-1) * states.unsqueeze(-4)).sum(dim=-3)


# ----------------------------------------------------------------------------- modes


def _noncausal(q: Tensor, k: Tensor, v: Tensor, mode: str) -> Tensor:
    if mode == "quadratic":
        return (q @ k.transpose(-1, -2)) @ v
    return q @ (k.transpose(-1, -2) @ v)


def _zero_state(q: Tensor, v: Tensor, is_complex: bool) -> PairState:
    B, H, _, Dk = q.shape
    zeros = q.new_zeros(B, H, Dk, v.shape[-1])
    return PairState(zeros, torch.zeros_like(zeros) if is_complex else None)


def recurrent_step(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, state: PairState, *,
                   normalize: bool = False, eps: float = 1e-6,
                   log_scale: Tensor | None = None) -> tuple[Tensor, PairState]:
    """One position of the recurrence: ``S <- diag(a) S + k^T v``, ``o = Re(q S)``.

    Args:
        q, k: ``(B, H, Dk)`` (q already scaled). v: ``(B, H, Dv)``. decay: ``(B, H, 1 or Dk)``
            log-magnitude and phase, or None.
        state: ``(B, H, Dk, Dv)`` real part and imaginary part (None for real transitions); with
            ``normalize`` ``(B, H, Dk, Dv + 1)``, the last column being the normaliser state z.
        normalize, eps, log_scale: as in :func:`linear_attention` (``log_scale`` ``(B, H)``).

    Returns:
        ``(o, state)`` with ``o`` of shape ``(B, H, Dv)``. Plain tensors in and out, so the
        decoding step of a model can be exported.
    """
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if decay is not None:
        state = _decay_state(state, decay.log_mag, decay.phase)
    state = _add(state, PairState(k.unsqueeze(-1) * v.unsqueeze(-2), None))
    out = _read_state(q.unsqueeze(-2), None, state).squeeze(-2)
    return (apply_normalizer(out, eps, log_scale) if normalize else out), state


def _recurrent(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None):
    """The sequential reference: :func:`recurrent_step` at every position."""
    is_complex = decay is not None and decay.phase is not None
    state = initial if initial is not None else _zero_state(q, v, is_complex)
    outputs = []
    for t in range(q.shape[2]):
        step_decay = None if decay is None else Decay(decay.log_mag[:, :, t],
                                                      None if decay.phase is None else decay.phase[:, :, t])
        out, state = recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], step_decay, state)
        outputs.append(out)
    return torch.stack(outputs, dim=2), state


def _scan_mode(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None,
               max_length: int | None):
    """Every per-position state at once by a parallel prefix scan over (a_t, k_t^T v_t)."""
    L = q.shape[2]
    writes = PairState(k.unsqueeze(-1) * v.unsqueeze(-2), None)  # (B, H, L, Dk, Dv)
    if decay is None:
        states = PairState(torch.cumsum(writes.re, dim=2), None)
        if initial is not None:
            states = _add(states, PairState(initial.re.unsqueeze(2), None))
    else:
        if initial is not None:  # fold S0 into the first write: S_1 = a_1 S0 + W_1
            first = _decay_state(initial, decay.log_mag[:, :, 0], None if decay.phase is None else decay.phase[:, :, 0])
            writes = _add(writes, PairState(_at_first(first.re, L), None if first.im is None else _at_first(first.im, L)))
        states = inclusive_scan(decay.log_mag, decay.phase, writes, dim=-3, steps=scan_steps(L, max_length))
    out = (q.unsqueeze(-2) @ states.re).squeeze(-2)
    final = PairState(states.re[:, :, -1], None if states.im is None else states.im[:, :, -1])
    return out, final


def _at_first(x: Tensor, L: int) -> Tensor:
    """Place ``x`` (B, H, Dk, Dv) at position 0 of a zero tensor (B, H, L, Dk, Dv)."""
    return F.pad(x.unsqueeze(2), [0, 0, 0, 0, 0, L - 1])


def _quadratic(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None):
    """All pairs at once: scores (L x L) times the pairwise decay exp(segment sums), masked."""
    L = q.shape[2]
    if decay is None:
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0)
        out = scores @ v
        final_re = k.transpose(-1, -2) @ v
        final = PairState(final_re + (initial.re if initial is not None else 0), None)
        if initial is not None:
            out = out + q @ initial.re
        return out, final
    rel_mag = _segsum(decay.log_mag)  # (B, H, L, L, Dk')
    rel_phase = None if decay.phase is None else _phase_segsum(decay.phase)
    pair = torch.exp(rel_mag)
    if rel_phase is not None:
        pair = pair * torch.cos(rel_phase)
    if decay.log_mag.shape[-1] == 1:
        scores = (q @ k.transpose(-1, -2)) * pair.squeeze(-1)
    else:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3) * pair).sum(-1)  # per-channel decays: (.., i, j, Dk)
    out = scores @ v
    # Decay from each position to the end (sum_{s > j} log a_s), and from the start to each position.
    to_end = _reverse_exclusive_cumsum(decay.log_mag)
    to_end_phase = None if decay.phase is None else _reverse_exclusive_cumsum(decay.phase.to(torch.float64))
    to_end_phase = None if to_end_phase is None else wrap_phase(to_end_phase).to(decay.phase.dtype)
    k_re, k_im = _rotate(k, to_end, to_end_phase)
    final = PairState(k_re.transpose(-1, -2) @ v, None if k_im is None else k_im.transpose(-1, -2) @ v)
    if initial is not None:
        from_start = torch.cumsum(decay.log_mag, dim=2)
        from_start_phase = None if decay.phase is None else _phase_cumsum(decay.phase, dim=2)
        q_re, q_im = _rotate(q, from_start, from_start_phase)
        out = out + _read_state(q_re, q_im, initial)
        total_mag = from_start[:, :, -1]
        final = _add(final, _decay_state(initial, total_mag, None if from_start_phase is None else from_start_phase[:, :, -1]))
    return out, final


def _reverse_exclusive_cumsum(x: Tensor, dim: int = -2) -> Tensor:
    """``out[j] = sum_{s > j} x[s]`` along ``dim``, accumulated directly (no subtraction)."""
    shifted = torch.cat([x.narrow(dim, 1, x.shape[dim] - 1), torch.zeros_like(x.narrow(dim, 0, 1))], dim=dim)
    return torch.flip(torch.cumsum(torch.flip(shifted, dims=[dim]), dim=dim), dims=[dim])


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
    states = chunk_scan(chunk_mag, chunk_phase, writes, levels=scan_levels(n, max_length, C))
    start_re = initial.re if initial is not None else None
    start_im = initial.im if initial is not None else None
    entering = PairState(_shift_in(states.re, start_re), None if states.im is None else _shift_in(states.im, start_im))
    q_re, q_im = _rotate(q, narrow(from_start), narrow_phase(from_start_phase))
    out = out + _read_state(q_re, q_im, entering)
    final = PairState(states.re[:, :, -1], None if states.im is None else states.im[:, :, -1])
    return _unpad(out.reshape(B, H, n * C, Dv), L), final


def _unpad(x: Tensor, length) -> Tensor:
    """``x[:, :, :length]``. When traced (compile/export) it is an index_select: a slice makes symbolic
    shapes prove ``length <= x.shape[2]`` (here ``L <= C * (ceil(L / C) + 1)``, which they cannot),
    specialising the program on L; the gather needs no such proof. Eager code takes the free view."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return x.index_select(2, torch.arange(length, device=x.device))
    return x[:, :, :length]


def _shift_in(states: Tensor, first: Tensor | None) -> Tensor:
    """States entering each chunk: the previous chunk's (B, H, n, Dk, Dv), ``first`` (or 0) for chunk 0.

    Written as pad-and-narrow (size exactly n) rather than ``cat([first, states[:, :, :-1]])``, whose
    size ``min(1, n) + max(0, n - 1)`` symbolic shapes cannot equate with n.
    """
    shifted = _shift(states, 1, dim=-3)
    if first is not None:
        shifted = shifted + _at_first(first, states.shape[2])
    return shifted
