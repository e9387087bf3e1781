"""Performer positive random features with a stabiliser that works causally and in streaming.

``phi(x)_i = exp(w_i.x - |x|^2/2) / sqrt(m)`` is unbiased for ``exp(q.k)``. To keep exp finite
without a max over the sequence (which would break causality and streaming), we use the bound
``w_i.k - |k|^2/2 <= |w_i|^2/2``: key features are ``exp(w_i.k - |k|^2/2 - |w_i|^2/2) <= 1``
(a data-independent per-feature scale), and queries carry the compensating ``+|w_i|^2/2`` and
subtract their own row maximum ``m_q`` (a per-query quantity). Then

    phi(q).phi(k) = exp(log_scale_q) * (q_feat . k_feat),   log_scale_q = m_q - log m,

and every stored feature lies in (0, 1].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def random_projection(num_features: int, dim: int, *, orthogonal: bool, seed: int,
                      dtype: torch.dtype = torch.float32) -> Tensor:
    """Rows ``w_i`` of a Performer projection, ``(num_features, dim)``, reproducible from ``seed``.

    ``orthogonal``: blocks of ``dim`` orthogonal directions (a Haar-distributed orthogonal matrix:
    QR of a Gaussian matrix, signs fixed by R's diagonal) with norms drawn from the chi distribution
    of Gaussian rows, so each row is still marginally N(0, I).
    """
    generator = torch.Generator().manual_seed(int(seed))
    if not orthogonal:
        return torch.randn(num_features, dim, generator=generator, dtype=torch.float64).to(dtype)
    blocks = []
    for _ in range(-(-num_features // dim)):
        gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        qmat, rmat = torch.linalg.qr(gaussian)
        # QR's Q is Haar-distributed only with R's diagonal made positive; without this the
        # directions are biased (E[Q_00] = -0.2 at dim 16) and the estimate of exp(q.k) with them.
        qmat = qmat * torch.sign(torch.diagonal(rmat)).unsqueeze(0)
        blocks.append(qmat.T)
    directions = torch.cat(blocks, dim=0)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (directions * norms).to(dtype)


def performer_features(x: Tensor, projection: Tensor, *, query: bool) -> tuple[Tensor, Tensor | None]:
    """Stabilised positive random features of ``x``.

    Args:
        x: ``(B, H, L, d)`` (already multiplied by ``sqrt(scale)``).
        projection: ``(m, d)``, shared by all heads, or ``(H, m, d)`` per head.
        query: queries get a per-row log scale; keys get none.

    Returns:
        ``(features, log_scale)``: features ``(B, H, L, m)`` in (0, 1]; ``log_scale`` ``(B, H, L)``
        for queries (``None`` for keys) such that ``phi(q).phi(k) = exp(log_scale) * (q_feat . k_feat)``.
    """
    w = projection.to(x.dtype)
    wx = x @ (w.transpose(-1, -2) if w.dim() == 2 else w.transpose(-1, -2).unsqueeze(0))
    half_sq = 0.5 * (x * x).sum(-1, keepdim=True)
    half_w = 0.5 * (w * w).sum(-1)  # (m,) or (H, m)
    if w.dim() == 3:
        half_w = half_w.unsqueeze(-2)  # (H, 1, m) broadcasts over (B, H, L, m)
    if not query:
        return torch.exp(wx - half_sq - half_w), None
    logits = wx - half_sq + half_w
    row_max = logits.amax(dim=-1, keepdim=True).detach()  # any per-row constant is exact; detach keeps grads simple
    return torch.exp(logits - row_max), row_max.squeeze(-1) - math.log(w.shape[-2])
