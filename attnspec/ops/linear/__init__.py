"""Gated linear attention in four execution modes that compute the same function.

Per batch and head, with q, k already feature-mapped (and re-weighted):

    S_t = diag(a_t) S_(t-1) + k_t^T v_t,      o_t = Re(scale * q_t S_t)

where ``a_t = exp(log_a_t)`` is real or complex (``log|a| + i theta``), per head or per key
channel. With ``normalize=True`` the same recurrence is run on ``k`` alone and the output is
divided by ``Re(scale * q_t z_t)`` clamped below at ``eps`` (:func:`apply_normalizer`, the one place
the normaliser is computed). Non-causal attention sums over all positions (no transition).

One file per job: :mod:`.common` (types, log-space pieces, the normaliser), :mod:`.checks`
(arguments), one file per mode (:mod:`.recurrent`, :mod:`.scan`, :mod:`.chunk`,
:mod:`.quadratic`), and :mod:`.naive`, the float64 reference every mode is tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops.documents import check_starts, ends, with_resets
from attnspec.ops.kernels import call_regime, chosen_kernel
from attnspec.ops.linear.checks import _check_inputs, _export_state
from attnspec.ops.linear.chunk import GROUP, TOP, _chunked, _native_chunked, _triton_chunked, chunk_scan, scan_levels
from attnspec.ops.linear.common import (LOG_ZERO, MODES, Decay, PairState, State, _zero_state, accumulation_dtype,
                                        apply_normalizer, batched_matmul, combine_decays, wrap_phase)
from attnspec.ops.linear.quadratic import _noncausal, _quadratic
from attnspec.ops.linear.recurrent import _recurrent, recurrent_step
from attnspec.ops.linear.scan import _scan_mode, inclusive_scan, scan_steps
from attnspec.spec.family import KernelInputs

KERNELS = ("triton", "native", "graph")  # the kernels of the chunk mode, in order of preference


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
    backend: str = "auto",
    starts: Tensor | None = None,
) -> Tensor | tuple[Tensor, State]:
    """Causal or non-causal (gated) linear attention.

    Args:
        q: ``(B, H, L, Dk)`` queries, already feature-mapped. Float32, float64, bfloat16 or float16:
            half-precision inputs are accumulated in float32 (states, decays, the normaliser) and the
            output is returned in their dtype.
        k: ``(B, H, L, Dk)`` keys, already feature-mapped; same dtype as ``q``.
        v: ``(B, H, L, Dv)`` values; same dtype.
        log_a: log-transition, ``None`` (a = 1), ``(B, H, L)`` (one per head) or ``(B, H, L, Dk)``
            (one per key channel). Real (``log|a|``; float32 or the inputs' dtype) or complex
            (``log|a| + i theta``, complex128 with float64 inputs, complex64 otherwise). ``-inf``
            (a = 0) resets the state. Compiled code passes a :class:`Decay` ``(log_mag, phase)`` of
            real ``(B, H, L, 1 or Dk)`` tensors instead, so no complex tensor enters the graph.
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
        backend: what runs the mode (the plan's choice, :meth:`MixerComponent.backends`):
            ``"graph"`` (plain torch), ``"native"`` (the C++ CPU kernel: causal chunk mode, float32
            CPU inputs with no decay or one per head, no gradient, not under export), ``"triton"``
            (CUDA, the same decays), or ``"auto"``: the first of triton, native, graph that applies.
            A named kernel runs or raises: whether it takes the call is its predicate in
            :mod:`attnspec.ops.kernels`, the one the plan asked.
        starts: ``(B, L)`` bool or None: packed documents' first positions (:mod:`attnspec.ops.documents`),
            each computed as it would be alone. Causal: the state resets there (a decay ``-inf`` joins
            ``log_a``, one of zeros where there is none), in every mode and kernel. Non-causal: a
            causal pass plus a reversed one, less the diagonal, on the graph path in ``mode``.

    Returns:
        ``o`` of shape ``(B, H, L, Dv)`` with the dtype of ``v``; with ``return_state`` also the
        final state, in the accumulation dtype (float32 for half-precision inputs).

    Raises:
        ShapeError: an argument has the wrong shape, dtype or combination (the message names it).
        KernelError: the named ``backend`` does not take this call (another device, dtype or regime
            than the plan's).
    """
    decay, initial = _check_inputs(q, k, v, log_a, causal, normalize, mode, chunk_size, initial_state,
                                   return_state, max_length, scale, eps)
    check_starts(starts, q)
    if starts is not None and not causal:
        if return_state:
            raise ShapeError("return_state needs causal=True")
        return _noncausal_documents(q, k, v, starts, normalize=normalize, scale=scale, eps=eps, mode=mode,
                                    chunk_size=chunk_size, max_length=max_length, log_scale=log_scale)
    if starts is not None:  # a reset is a decay of 0 at each document's first position
        decay = Decay(with_resets(None if decay is None else decay.log_mag, starts, q),
                      None if decay is None else decay.phase)
    kernel = _kernel(backend, q, k, v, decay, initial, causal, mode)
    use_triton, use_native = kernel == "triton", kernel == "native"
    out_dtype = v.dtype
    if not use_triton:
        # Half-precision inputs are computed in float32 on the graph path: every product is exact in
        # float32 and every sum over positions (states, decays, the normaliser) is a float32 sum.
        wide = accumulation_dtype(q.dtype)
        q, k, v = q.to(wide), k.to(wide), v.to(wide)
    if decay is not None:
        wide = accumulation_dtype(q.dtype)
        decay = Decay(decay.log_mag.to(wide), None if decay.phase is None else decay.phase.to(wide))
    if normalize:
        # The normaliser z is the state of the same recurrence for a value that is always 1.
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if _is_empty_sequence(q):  # every mode agrees: nothing to attend to, the state passes through
        out = v.new_zeros(*v.shape[:2], 0, v.shape[-1], dtype=out_dtype)
        final = initial if initial is not None else _zero_state(q, v, decay is not None and decay.phase is not None)
        out = out[..., :-1] if normalize else out
        return (out, _export_state(final, normalize)) if return_state else out
    if use_triton:
        # the normaliser's division needs its column in float32, the kernel's accumulation dtype
        out, final = _triton_chunked(q, k, v, decay, initial, scale, chunk_size,
                                     out_dtype=accumulation_dtype(q.dtype) if normalize else out_dtype)
    elif use_native:
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
    out = out.to(out_dtype)
    if not return_state:
        return out
    return out, _export_state(final, normalize)


def _noncausal_documents(q: Tensor, k: Tensor, v: Tensor, starts: Tensor, *, normalize: bool, scale: float,
                         eps: float, mode: str, chunk_size: int, max_length: int | None,
                         log_scale: Tensor | None) -> Tensor:
    """Non-causal linear attention within each packed document: the causal sum over j <= i of i's
    document, plus the same run backwards over j >= i (the reversed row, whose documents start where
    the forward ones end), less the j = i term counted twice; then the normaliser. Exact in any mode."""
    values = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1) if normalize else v
    run = lambda q_, k_, v_, s_: linear_attention(q_, k_, v_, causal=True, scale=scale, mode=mode,  # noqa: E731
                                                  chunk_size=chunk_size, max_length=max_length, backend="graph",
                                                  starts=s_)
    flip = lambda t: torch.flip(t, dims=[2])  # noqa: E731
    forward = run(q, k, values, starts)
    backward = flip(run(flip(q), flip(k), flip(values), torch.flip(ends(starts), dims=[1])))
    diagonal = (q * k).sum(-1, keepdim=True) * scale * values.to(q.dtype)
    out = forward + backward - diagonal.to(forward.dtype)
    if normalize:
        out = apply_normalizer(out.to(accumulation_dtype(out.dtype)), eps, log_scale).to(v.dtype)
    return out


def _kernel(backend: str, q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial, causal: bool,
            mode: str) -> str:
    """The kernel that runs this call: ``backend`` when it takes it (else :class:`KernelError`), or for
    ``"auto"`` the first of triton, native, graph that does (:mod:`attnspec.ops.kernels`)."""
    per = "none" if decay is None else "head" if decay.log_mag.shape[-1] == 1 else "channel"
    inputs = KernelInputs(mode, causal, per, q.shape[-1])
    regime = call_regime(q, k, v, *(decay or ()), *(initial or ()))
    return chosen_kernel(backend, KERNELS, inputs, regime)


def _is_empty_sequence(q: Tensor) -> bool:
    """L = 0 in eager code (traced code has L >= 1: export's dynamic length starts at 2)."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    return q.shape[2] == 0



__all__ = ["MODES", "LOG_ZERO", "Decay", "PairState", "State", "linear_attention", "recurrent_step", "combine_decays",
           "apply_normalizer", "wrap_phase", "chunk_scan", "scan_levels", "inclusive_scan", "scan_steps",
           "batched_matmul", "accumulation_dtype", "GROUP", "TOP"]
