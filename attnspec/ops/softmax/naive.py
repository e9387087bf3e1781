"""The float64 reference of :func:`attnspec.ops.softmax.softmax_attention`, written with loops (slow,
obvious): explicit scores, the causal mask or the decay bias summed position by position, softmax."""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_reference(q: Tensor, k: Tensor, v: Tensor, log_a: Tensor | None = None, *, causal: bool = True,
                      scale: float | None = None, window: int | None = None, softcap: float | None = None,
                      sinks: Tensor | None = None) -> Tensor:
    """``softmax(scale q kᵀ + bias) v`` with ``bias[i, j] = sum_{s=j+1..i} log_a[s]`` (by loops) for j <= i.

    Args:
        q: ``(B, H, L, Dk)``; k: ``(B, H_kv, L, Dk)``; v: ``(B, H_kv, L, Dv)`` (head h reads h // (H / H_kv));
        log_a: ``(B, H, L)`` or None.
        causal: mask j > i (implied by ``log_a``).
        scale: default ``Dk ** -0.5``.
        window: also mask j <= i - window.
        softcap: each scaled score s becomes ``softcap * tanh(s / softcap)`` before the masks and bias.
        sinks: ``(H,)``: gpt-oss's attention sinks, a column of each head's sink logit appended to the scores
            before the softmax and its weight dropped after it.

    Returns:
        ``(B, H, L, Dv)``.
    """
    L, H = q.shape[2], q.shape[1]
    k = torch.stack([k[:, h * k.shape[1] // H] for h in range(H)], 1)  # the key head each query head reads
    v = torch.stack([v[:, h * v.shape[1] // H] for h in range(H)], 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if window is not None:
        for i in range(L):
            scores[:, :, i, : max(0, i - window + 1)] = float("-inf")
    if log_a is not None:
        bias = torch.full_like(scores, float("-inf"))
        for i in range(L):
            for j in range(i + 1):
                bias[:, :, i, j] = log_a[:, :, j + 1: i + 1].sum(-1)
        scores = scores + bias
    elif causal:
        scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    if sinks is not None:
        column = sinks.view(1, H, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1] @ v
    return torch.softmax(scores, dim=-1) @ v
