"""Argument checking of :func:`attnspec.ops.linear.linear_attention`, and the state's import/export.

Every wrong shape, dtype or combination is a :class:`~attnspec.errors.ShapeError` naming the
argument, raised before any computation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops.linear.common import MODES, Decay, PairState, State, accumulation_dtype

INPUT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

def _check_inputs(q, k, v, log_a, causal, normalize, mode, chunk_size, initial_state, return_state, max_length,
                  scale, eps):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
        if t.dtype not in INPUT_DTYPES:
            raise ShapeError(f"{name} must be float32, float64, bfloat16 or float16, got {t.dtype}")
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
    real = _decay_dtypes(q)
    expected_complex = torch.complex128 if q.dtype == torch.float64 else torch.complex64
    if log_a.dtype not in (*real, expected_complex):
        raise ShapeError(f"log_a must be {' or '.join(map(str, real))} (real) or {expected_complex} (complex) for "
                         f"{q.dtype} inputs, got {log_a.dtype}")
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
        if tuple(t.shape) not in ((B, H, L, 1), (B, H, L, Dk)) or t.dtype not in _decay_dtypes(q):
            raise ShapeError(f"{name} must be {' or '.join(map(str, _decay_dtypes(q)))} with shape (B, H, L, 1) "
                             f"or (B, H, L, Dk) = ({B}, {H}, {L}, 1 or {Dk}), got {tuple(t.shape)} {t.dtype}")
    if decay.phase is not None and decay.phase.shape != decay.log_mag.shape:
        raise ShapeError("log_a.phase must have the shape of log_a.log_mag")
    return decay


def _decay_dtypes(q: Tensor) -> tuple[torch.dtype, ...]:
    """Real dtypes a decay may have with inputs like ``q``: its own, and float32 (the accumulation
    dtype) for half-precision inputs, whose decays are best computed in float32 in the first place."""
    wide = accumulation_dtype(q.dtype)
    return (q.dtype,) if wide == q.dtype else (wide, q.dtype)


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
    wide = accumulation_dtype(q.dtype)
    if S0.is_complex():
        return PairState(S0.real.to(wide), S0.imag.to(wide))
    S0 = S0.to(wide)
    return PairState(S0, torch.zeros_like(S0) if is_complex else None)


def _export_state(state: PairState, normalize: bool) -> State:
    S = state.re if state.im is None else torch.complex(state.re, state.im)
    if normalize:
        return S[..., :-1], S[..., -1]
    return S

