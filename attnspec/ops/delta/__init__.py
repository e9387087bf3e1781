"""The delta rule (DeltaNet, Gated DeltaNet, KDA): a state that is corrected toward each new value
rather than only added to.

Per batch and head, with ``S`` of shape ``(Dk, Dv)`` (flash-linear-attention's convention):

    S_t = (I - beta_t k_t k_tᵀ) diag(a_t) S_(t-1) + beta_t k_t v_tᵀ,      o_t = scale q_tᵀ S_t

``a_t = exp(log_a_t)`` is 1 (DeltaNet), one gate per head (Gated DeltaNet) or one per key channel
(KDA). With unit-norm keys (the l2norm feature map) and beta in [0, 1], ``I - beta k kᵀ`` has
eigenvalues in [0, 1] and the state stays bounded by its inputs; beta in (1, 2] (``2 sigmoid``, the
state-tracking variant) gives eigenvalues in [-1, 1): still no growth, but the state can flip sign
along ``k``. Beta above 2 or keys longer than 1 can grow the state without bound; the op allows beta
in [0, 2] and does not normalise keys (the mixer's feature map does).

:mod:`.modes` holds the modes, :mod:`.naive` the float64 reference they are tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops.documents import check_starts, with_resets
from attnspec.ops.delta.modes import chunked, quadratic, recurrent, recurrent_step
from attnspec.ops.linear.checks import INPUT_DTYPES
from attnspec.ops.linear.common import accumulation_dtype

MODES = ("recurrent", "chunk", "quadratic")


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None = None, *, mode: str = "chunk",
               scale: float = 1.0, chunk_size: int = 64, initial_state: Tensor | None = None,
               return_state: bool = False, max_length: int | None = None,
               starts: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Causal delta-rule attention in any of its modes (they compute the same function).

    Args:
        q, k: ``(B, H, L, Dk)`` (already feature-mapped: DeltaNet normalises them per head).
        v: ``(B, H, L, Dv)``. q, k, v share a dtype: float32, float64, bfloat16 or float16; half
            precision is computed in float32 and the output rounded once.
        beta: ``(B, H, L)``, the write strength, in [0, 2].
        log_a: None, ``(B, H, L)`` (a gate per head) or ``(B, H, L, Dk)`` (per key channel); ``-inf``
            (a = 0) resets the state.
        mode: ``recurrent`` (a step per position), ``chunk`` (WY/UT transform in chunks of
            ``chunk_size``, a scan across chunks) or ``quadratic`` (one L x L transform, short sequences).
        initial_state: ``(B, H, Dk, Dv)``, the state before the first position (a prefill's).
        return_state: also return the final state ``(B, H, Dk, Dv)`` (float32 for half inputs).
        max_length: the longest L this call will see (fixes the chunk scan's depth, so compiled code
            serves every length up to it without recompiling); default: this L.
        starts: ``(B, L)`` bool or None: packed documents' first positions, where the state resets
            (``a = 0``) so each document computes as it would alone (:mod:`attnspec.ops.documents`).

    Returns:
        ``out (B, H, L, Dv)`` in the inputs' dtype, and with ``return_state`` the final state.

    Raises:
        ShapeError: a wrong shape, dtype, mode or chunk size.
    """
    _check(q, k, v, beta, log_a, mode, chunk_size, initial_state)
    check_starts(starts, q)
    if starts is not None:  # a reset is a decay of 0 at each document's first position
        log_a = with_resets(None if log_a is None else log_a.unsqueeze(-1) if log_a.dim() == 3 else log_a, starts, q)
    out_dtype = q.dtype
    work = accumulation_dtype(q.dtype)
    q, k, v, beta = (t.to(work) for t in (q, k, v, beta))
    if log_a is not None:
        log_a = (log_a.unsqueeze(-1) if log_a.dim() == 3 else log_a).to(torch.float64 if work == torch.float64
                                                                         else torch.float32)
    state = None if initial_state is None else initial_state.to(work)
    if mode == "recurrent":
        B, H, _, Dk = q.shape
        start = state if state is not None else q.new_zeros(B, H, Dk, v.shape[-1])
        out, final = recurrent(q, k, v, beta, log_a, start, scale)
    elif mode == "quadratic":
        out, final = quadratic(q, k, v, beta, log_a, state, scale)
    else:
        out, final = chunked(q, k, v, beta, log_a, state, scale, chunk_size, max_length)
    out = out.to(out_dtype)
    return (out, final) if return_state else out


def delta_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None, state: Tensor, *,
               scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """One decoding step: q, k ``(B, H, Dk)``, v ``(B, H, Dv)``, beta ``(B, H)``, log_a None, ``(B, H)``
    or ``(B, H, Dk)``, state ``(B, H, Dk, Dv)`` -> ``(out (B, H, Dv), new state)``; the state is
    constant in size whatever the position."""
    if log_a is not None and log_a.dim() == 2:
        log_a = log_a.unsqueeze(-1)
    return recurrent_step(q, k, v, beta, log_a, state, scale)


def _check(q, k, v, beta, log_a, mode, chunk_size, initial_state) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ShapeError(f"{name} must be a tensor of shape (B, H, L, D), got {tuple(getattr(t, 'shape', ()))}")
        if t.dtype not in INPUT_DTYPES:
            raise ShapeError(f"{name} must be float32, float64, bfloat16 or float16, got {t.dtype}")
    B, H, L, Dk = q.shape
    if k.shape != q.shape or v.shape[:3] != q.shape[:3] or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ShapeError(f"k must match q {tuple(q.shape)} and v be (B, H, L, Dv) = ({B}, {H}, {L}, Dv), all of one "
                         f"dtype; got k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    if not isinstance(beta, Tensor) or beta.shape != (B, H, L) or not beta.is_floating_point():
        raise ShapeError(f"beta must be a float tensor of shape (B, H, L) = ({B}, {H}, {L}), got "
                         f"{tuple(getattr(beta, 'shape', ()))}")
    if log_a is not None and (not isinstance(log_a, Tensor) or log_a.shape not in ((B, H, L), (B, H, L, Dk))
                              or not log_a.is_floating_point()):
        raise ShapeError(f"log_a must be None, (B, H, L) = ({B}, {H}, {L}) or (B, H, L, Dk) = ({B}, {H}, {L}, {Dk}) "
                         f"real, got {tuple(getattr(log_a, 'shape', ()))}")
    if mode not in MODES:
        raise ShapeError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ShapeError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if initial_state is not None and (not isinstance(initial_state, Tensor)
                                      or initial_state.shape != (B, H, Dk, v.shape[-1])):
        raise ShapeError(f"initial_state must be (B, H, Dk, Dv) = ({B}, {H}, {Dk}, {v.shape[-1]}), got "
                         f"{tuple(getattr(initial_state, 'shape', ()))}")


__all__ = ["delta_rule", "delta_step", "MODES"]
