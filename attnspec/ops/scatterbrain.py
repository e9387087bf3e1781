"""Scatterbrain: a low-rank estimate of exp(q.k) plus an exact sparse correction, one normaliser.

    out_i = (sum_j lowrank_ij v_j + sum_{j in support_i} (exp(q_i.k_j) - lowrank_ij) v_j)
            / (the same sums with v = 1)

so the implied weight equals exp(q.k) exactly on the support and the low-rank estimate
elsewhere (Chen, Dao et al. 2021, Algorithm 1). Every term of a row is divided by the row's
largest exponent ``r_i = max(log_scale_i, max_{j in support} q_i.k_j)`` before exp, so nothing
overflows; the factor cancels in the normalisation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops.documents import Documents
from attnspec.ops.linear import accumulation_dtype, apply_normalizer, linear_attention
from attnspec.ops.support import Support


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """``x[b, h, index[b, h, i, s]]``: ``x`` (B, H, L, D), ``index`` (B, H, L, S) -> (B, H, L, S, D)."""
    B, H, L, S = index.shape
    flat = index.reshape(B, H, L * S, 1).expand(B, H, L * S, x.shape[-1])
    return torch.gather(x, 2, flat).view(B, H, L, S, x.shape[-1])


def _check_inputs(q, k, v, q_features, k_features, support, q_log_scale) -> None:
    """Every wrong shape, dtype or index is a :class:`~attnspec.errors.ShapeError` naming the argument,
    raised before any computation (support indices are checked in eager calls: a check of values would
    break a compiled graph, and compiled models build their supports themselves)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("q_features", q_features), ("k_features", k_features)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ShapeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    B, H, L, _ = q.shape
    if k.shape != q.shape:
        raise ShapeError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != (B, H, L):
        raise ShapeError(f"v must have shape (B, H, L, Dv) = ({B}, {H}, {L}, Dv), got {tuple(v.shape)}")
    if q_features.shape[:3] != (B, H, L) or k_features.shape != q_features.shape:
        raise ShapeError(f"q_features and k_features must be (B, H, L, m) with (B, H, L) = ({B}, {H}, {L}); got "
                         f"{tuple(q_features.shape)}, {tuple(k_features.shape)}")
    if q_log_scale is not None and (not isinstance(q_log_scale, Tensor) or q_log_scale.shape != (B, H, L)):
        raise ShapeError(f"q_log_scale must have shape (B, H, L) = ({B}, {H}, {L}), got "
                         f"{tuple(getattr(q_log_scale, 'shape', ())) or type(q_log_scale).__name__}")
    index, valid = support
    if not isinstance(index, Tensor) or not isinstance(valid, Tensor) or index.dim() != 4 \
            or index.shape[:3] != (B, H, L) or valid.shape != index.shape:
        raise ShapeError(f"support must have shape (B, H, L, S) = ({B}, {H}, {L}, S), got "
                         f"{tuple(getattr(index, 'shape', ()))} and {tuple(getattr(valid, 'shape', ()))}")
    if index.dtype not in (torch.int64, torch.int32) or valid.dtype != torch.bool:
        raise ShapeError(f"support.index must be int64 (or int32) and support.valid bool, got {index.dtype} and "
                         f"{valid.dtype}")
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and index.numel() \
            and (int(index.min()) < 0 or int(index.max()) >= L):
        raise ShapeError(f"support.index must hold key positions in [0, {L}), got values from {int(index.min())} to "
                         f"{int(index.max())} (mark unused slots with valid=False and any position in range)")


def scatterbrain_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_features: Tensor,
    k_features: Tensor,
    support: Support,
    *,
    q_log_scale: Tensor | None = None,
    causal: bool = True,
    scale: float = 1.0,
    eps: float = 1e-6,
    mode: str = "chunk",
    chunk_size: int = 64,
    max_length: int | None = None,
    backend: str = "auto",
    documents: Documents | None = None,
    row_max: bool = False,
    sparse_log_weight: Tensor | None = None,
) -> Tensor:
    """Scatterbrain attention.

    Args:
        q, k: ``(B, H, L, Dk)`` raw queries and keys (the exact part uses ``exp(scale * q.k)``).
        v: ``(B, H, L, Dv)``.
        q_features, k_features: ``(B, H, L, m)`` non-negative low-rank features such that
            ``exp(q_log_scale_i) * q_features_i . k_features_j`` estimates ``exp(scale * q_i.k_j)``.
        support: candidate keys per query (:mod:`attnspec.ops.support`); each pair listed once.
        q_log_scale: ``(B, H, L)`` log scale of the query features (Performer); None means 0.
        causal: only j <= i (the support must respect it too; it is re-checked here).
        scale: multiplier on ``q.k`` in the exact part.
        eps: lower clamp of the joint normaliser, on its true scale.
        mode, chunk_size, max_length, backend: execution of the low-rank part (see ``linear_attention``;
            half-precision inputs reach it in float32).
        documents: packed documents (:mod:`attnspec.ops.documents`): the low-rank part resets at each
            document's start (runs within each, non-causal too) and the sparse part pairs positions
            of one document only, so each computes as it would alone.
        row_max: the exact terms are exp(scale q_i.k_j - m_i), m_i the row's largest score on its support
            (LoLCATs'), rather than exp(scale q_i.k_j).
        sparse_log_weight: ``(H,)`` the log of a weight per head on the exact terms (LoLCATs' window factors),
            or None.

    Returns:
        ``(B, H, L, Dv)``.
    """
    _check_inputs(q, k, v, q_features, k_features, support, q_log_scale)
    B, H, L, _ = q.shape
    out_dtype = v.dtype
    # half-precision inputs are computed in float32: the exact part's exponentials and the joint
    # normaliser need its range and digits
    q, k, v, q_features, k_features = (t.to(accumulation_dtype(t.dtype)) for t in (q, k, v, q_features, k_features))
    log_scale = q_log_scale.to(q.dtype) if q_log_scale is not None else q.new_zeros(B, H, L)
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # numerator and normaliser together
    lowrank = linear_attention(q_features, k_features, v1, causal=causal, mode=mode, chunk_size=chunk_size,
                               max_length=max_length, backend=backend,
                               starts=None if documents is None else documents.starts)
    valid = support.valid
    if documents is not None:  # a key of another document is no candidate
        ids = documents.ids.view(B, 1, L, 1).expand(B, H, L, 1)
        valid = valid & (_gather_rows(ids, support.index)[..., 0] == ids)
    if causal:
        valid = valid & (support.index <= torch.arange(L, device=q.device).view(1, 1, L, 1))
    logits = scale * (q.unsqueeze(-2) * _gather_rows(k, support.index)).sum(-1)  # (B, H, L, S)
    logits = logits.masked_fill(~valid, float("-inf"))
    if row_max:  # (a row without a candidate keeps -inf: its exact part is empty)
        peak = logits.amax(dim=-1, keepdim=True)
        logits = logits - torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    if sparse_log_weight is not None:
        logits = logits + sparse_log_weight.to(logits.dtype).view(1, H, 1, 1)
    reference = torch.maximum(log_scale, logits.amax(dim=-1) if logits.shape[-1] else log_scale).detach()
    exact = torch.exp(logits - reference.unsqueeze(-1))
    estimate = (q_features.unsqueeze(-2) * _gather_rows(k_features, support.index)).sum(-1)
    lowrank_scale = torch.exp(log_scale - reference)
    correction = exact - (lowrank_scale.unsqueeze(-1) * estimate).masked_fill(~valid, 0.0)
    sparse = (correction.unsqueeze(-1) * _gather_rows(v1, support.index)).sum(-2)
    total = lowrank * lowrank_scale.unsqueeze(-1) + sparse
    # the stored sums are the true ones times exp(-reference)
    return apply_normalizer(total, eps, reference).to(out_dtype)
