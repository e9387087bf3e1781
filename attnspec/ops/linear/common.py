"""Pieces every mode of gated linear attention shares: the decay and state types, log-space
segment sums, phase reduction, rotations of real/imaginary state pairs, the normaliser, padding.

Complex transitions are carried as (log-magnitude, phase) and the state as a pair of real tensors
(re, im), so Inductor only ever sees real arithmetic. Decays between positions are never cumprod
and 1/cumprod (which underflow): over a whole sequence they are *segment sums* of log|a| accumulated
directly; phases are summed in float64 and reduced modulo 2 pi before they are narrowed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

MODES = ("recurrent", "scan", "chunk", "quadratic")


# log|a| at or below this is a = 0: exp underflows to exactly 0 in float32 and float64 alike.
LOG_ZERO = -1000.0


State = Tensor | tuple[Tensor, Tensor]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype states, decays and normalisers are accumulated in for inputs of ``dtype``: float32 for
    bfloat16 and float16 (their 8- and 11-bit mantissas cannot hold a sum over thousands of positions),
    the input dtype itself for float32 and float64."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class Decay(NamedTuple):
    """A log-transition split for real arithmetic: ``log_a = log_mag + i * phase``.

    ``log_mag``: (B, H, L, 1) per head or (B, H, L, Dk) per channel. ``phase``: same shape or None.
    """

    log_mag: Tensor
    phase: Tensor | None


def combine_decays(first: Decay | None, second: Decay | None) -> Decay | None:
    """The product of two transitions, in log space: log magnitudes add, phases add (broadcasting a
    per-head (..., 1) decay against a per-channel (..., Dk) one). None is a = 1."""
    if first is None or second is None:
        return first if second is None else second
    if first.phase is None and second.phase is None:
        phase = None
    else:
        phase = (first.phase if first.phase is not None else torch.zeros_like(first.log_mag)) \
            + (second.phase if second.phase is not None else torch.zeros_like(second.log_mag))
    return Decay(first.log_mag + second.log_mag, phase)  # both sums broadcast to the same shape


class PairState(NamedTuple):
    """A possibly complex state as real tensors; ``im`` is None for real transitions."""

    re: Tensor
    im: Tensor | None


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


def batched_matmul_add(base: Tensor, a: Tensor, b: Tensor, *, beta: float = 1.0, alpha: float = 1.0) -> Tensor:
    """``beta * base + alpha * (a @ b)`` for equal leading (batch) dims, as one ``baddbmm`` (no separate
    product, sum and scaling passes); flattened as :func:`batched_matmul` does."""
    batch = a.shape[:-2]
    count = math.prod(batch)
    out = torch.baddbmm(base.reshape(count, a.shape[-2], b.shape[-1]), a.reshape(count, a.shape[-2], a.shape[-1]),
                        b.reshape(count, b.shape[-2], b.shape[-1]), beta=beta, alpha=alpha)
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


def _rotate_state(state: PairState, mag: Tensor, rotation: tuple[Tensor, Tensor] | None) -> PairState:
    """``diag(mag * (cos + i sin)) @ S`` with precomputed factors of shape (..., Dd), broadcast over Dv."""
    mag = mag.unsqueeze(-1)
    if rotation is None:
        return PairState(state.re * mag, None if state.im is None else state.im * mag)
    cos, sin = (t.unsqueeze(-1) for t in rotation)
    im = state.im if state.im is not None else torch.zeros_like(state.re)
    return PairState(mag * (cos * state.re - sin * im), mag * (sin * state.re + cos * im))


def _add(a: PairState, b: PairState) -> PairState:
    if a.im is None and b.im is None:
        return PairState(a.re + b.re, None)
    a_im = a.im if a.im is not None else torch.zeros_like(a.re)
    b_im = b.im if b.im is not None else torch.zeros_like(b.re)
    return PairState(a.re + b.re, a_im + b_im)


def _shift(x: Tensor, shift: int, dim: int) -> Tensor:
    """Shift ``x`` towards higher indices along ``dim`` by ``shift``, filling with zeros."""
    size = x.shape[dim]
    pad = [0, 0] * (-dim - 1) + [shift, 0]
    return F.pad(x, pad).narrow(dim, 0, size)


def _zero_state(q: Tensor, v: Tensor, is_complex: bool) -> PairState:
    B, H, _, Dk = q.shape
    zeros = q.new_zeros(B, H, Dk, v.shape[-1], dtype=accumulation_dtype(q.dtype))
    return PairState(zeros, torch.zeros_like(zeros) if is_complex else None)


def _at_first(x: Tensor, L: int) -> Tensor:
    """Place ``x`` (B, H, Dk, Dv) at position 0 of a zero tensor (B, H, L, Dk, Dv)."""
    return F.pad(x.unsqueeze(2), [0, 0, 0, 0, 0, L - 1])


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

