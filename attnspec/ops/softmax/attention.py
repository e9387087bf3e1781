"""Softmax attention, causal or not, with an optional additive log-decay bias (GateLoop sec. 3.4), a
sliding window, grouped keys/values (GQA) and a soft-cap on the scores (Gemma 2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops.linear.checks import INPUT_DTYPES
from attnspec.ops.linear.common import _segsum, accumulation_dtype


def decay_bias(log_a: Tensor) -> Tensor:
    """The additive bias ``sum_{s=j+1..i} log a_s`` for ``j <= i`` and ``-inf`` for ``j > i``.

    ``log_a``: ``(B, H, L)`` real; returns ``(B, H, L, L)``. With this bias, softmax attention
    weights pair (i, j) by ``prod_{s=j+1..i} a_s`` before normalising (the real-decay case of
    GateLoop's surrogate attention under softmax).
    """
    return _segsum(log_a.unsqueeze(-1)).squeeze(-1)


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_a: Tensor | None = None,
    *,
    causal: bool = True,
    scale: float | None = None,
    window: int | None = None,
    mask: Tensor | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """``softmax(scale * q k^T + bias) v`` with a causal mask, an optional log-decay bias and window.

    Args:
        q: ``(B, H, L, Dk)``, float32, float64, bfloat16 or float16 (SDPA accumulates the softmax
            of half-precision inputs in float32).
        k: ``(B, H_kv, L, Dk)`` with ``H_kv`` dividing ``H``: query head h reads key head
            ``h // (H / H_kv)`` (grouped-query attention; ``H_kv = 1``: multi-query).
        v: ``(B, H_kv, L, Dv)``.
        log_a: ``None`` or a real per-head log-transition ``(B, H, L)`` (``log a_t <= 0``); the
            score of pair (i, j) gets ``sum_{s=j+1..i} log a_s``. Requires ``causal=True``.
        causal: position i attends to j <= i only.
        scale: score multiplier; defaults to ``1/sqrt(Dk)``.
        window: position i attends to the ``window`` positions i - window + 1 .. i only (a sliding
            window, causal; composes with ``log_a``). None: every earlier position.
        mask: ``(B, 1, L, L)`` bool or None: pair (i, j) is attended only where True, on top of the
            causal mask and the window (packed documents: :func:`attnspec.ops.documents.same_document`).
            Each row must keep its diagonal (a query that sees no key has no softmax).
        softcap: a tanh soft-cap on the scores (Gemma 2): each scaled score s becomes ``softcap *
            tanh(s / softcap)`` before the masks and the bias. The scores are then explicit (SDPA has no
            cap): computed, capped and normalised in float32 for half-precision inputs (float64 stays).
        sinks: ``(H,)`` or None: a logit per head that joins every query's softmax as a key without a value
            (attention sinks: gpt-oss), so the weights on the keys sum to ``1 - p_sink``. The scores are then
            explicit, as with ``softcap``.

    Returns:
        ``(B, H, L, Dv)``. Differentiable on CPU (PyTorch's SDPA math/flash kernels).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dtype not in INPUT_DTYPES:
            raise ShapeError(f"{name} must be a float32, float64, bfloat16 or float16 tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ShapeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()  # traced floats may be symbolic
    if scale is not None and not tracing and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                              or not math.isfinite(scale)):
        raise ShapeError(f"scale must be a finite number, got {scale!r}")
    if (q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]
            or v.shape[0] != q.shape[0] or v.shape[2] != q.shape[2] or 0 in (k.shape[1], v.shape[1])
            or q.shape[1] % k.shape[1] or q.shape[1] % v.shape[1]):
        raise ShapeError(f"q must be (B, H, L, Dk), k (B, H_kv, L, Dk) and v (B, H_kv, L, Dv) with H_kv dividing H; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if softcap is not None and not tracing and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                                or not math.isfinite(softcap) or softcap <= 0):
        raise ShapeError(f"softcap must be a positive finite number, got {softcap!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1 or not causal):
        raise ShapeError(f"window must be a positive int with causal=True, got {window!r} (causal={causal})")
    if k.shape[1] != q.shape[1]:  # each key/value head serves H / H_kv consecutive query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    if v.shape[1] != q.shape[1]:
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if mask is not None and (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[0] != q.shape[0]
                             or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (q.shape[2],) * 2):
        raise ShapeError(f"mask must be bool (B, 1, L, L) = ({q.shape[0]}, 1, {q.shape[2]}, {q.shape[2]}), got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    bias = None
    if log_a is not None:
        if not causal:
            raise ShapeError("log_a needs causal=True: a decay orders positions")
        if log_a.is_complex() or tuple(log_a.shape) != tuple(q.shape[:3]):
            raise ShapeError(f"log_a for softmax attention must be real with shape (B, H, L) = "
                             f"{tuple(q.shape[:3])}, got {tuple(log_a.shape)} {log_a.dtype}")
        bias = decay_bias(log_a.to(accumulation_dtype(q.dtype))).to(q.dtype)
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != q.shape[1]):
        raise ShapeError(f"sinks must be (H,) = ({q.shape[1]},), got {tuple(sinks.shape)}")
    if softcap is not None or sinks is not None:
        return explicit_attention(q, k, v, scale if scale is not None else q.shape[-1] ** -0.5, softcap,
                                  _pairs(q.shape[2], causal, window, mask, q.device), bias, sinks)
    if bias is not None:
        if window is not None:
            bias = bias.masked_fill(~window_mask(q.shape[2], window, q.device), float("-inf"))
        if mask is not None:
            bias = bias.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_pairs(q.shape[2], causal, window, mask, q.device),
                                              scale=scale)
    if window is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(q.shape[2], window, q.device),
                                              scale=scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _pairs(L: int, causal: bool, window: int | None, mask: Tensor | None, device) -> Tensor | None:
    """The pairs (i, j) attended, bool broadcasting to (B, 1, L, L): the window's or the causal triangle,
    and ``mask``; None where every pair is."""
    pairs = window_mask(L, window, device) if window is not None else \
        torch.ones(L, L, dtype=torch.bool, device=device).tril() if causal else None
    return mask if pairs is None else pairs if mask is None else mask & pairs


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, softcap: float | None, allowed: Tensor | None,
                       bias: Tensor | None, sinks: Tensor | None = None) -> Tensor:
    """Softmax attention written out: ``softmax(cap(scale q k^T) + bias) v`` over the pairs ``allowed``, the
    scores soft-capped where ``softcap`` is given, a sink logit per head joining each softmax where ``sinks``
    (H,) is. q, k: ``(B, H, L, Dk)`` (heads already shared out); v: ``(B, H, L, Dv)``; allowed: bool
    broadcasting to ``(B, H, L, L)`` or None; bias: additive, the same, or None. Scores, weights and the sum in
    float32 for half precision (float64 stays). Returns ``(B, H, L, Dv)`` in q's dtype."""
    wide = accumulation_dtype(q.dtype)
    scores = scale * (q.to(wide) @ k.to(wide).transpose(-1, -2))
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(wide)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (weights_with_sinks(scores, sinks) @ v.to(wide)).to(q.dtype)


def weights_with_sinks(scores: Tensor, sinks: Tensor | None) -> Tensor:
    """``softmax(scores)`` over the last axis, with a sink logit per head (``sinks`` (H,), heads on axis 1 of
    ``scores``) as one more entry of each softmax whose weight is then dropped; plain softmax where None."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.to(scores.dtype).view(1, -1, *([1] * (scores.dim() - 2))).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def window_mask(L: int, window: int, device) -> Tensor:
    """``(L, L)`` bool: True where query i may attend key j, i.e. ``0 <= i - j < window``."""
    offset = torch.arange(L, device=device).view(-1, 1) - torch.arange(L, device=device).view(1, -1)
    return (offset >= 0) & (offset < window)
