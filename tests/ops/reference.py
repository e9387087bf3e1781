"""Independent float64 references, written with loops (slow, obvious). The linear-attention reference lives
in the package, beside the modes: :mod:`attnspec.ops.linear.naive`."""

from __future__ import annotations

import torch

from attnspec.ops.linear.naive import linear_attention_reference  # noqa: F401  (re-exported for the tests)


def softmax_reference(q, k, v, log_a=None, *, causal=True, scale=None):
    """Explicit scores, mask, decay bias sum_{s=j+1..i} log a_s (by loops), softmax."""
    L = q.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = scale * q @ k.transpose(-1, -2)
    if log_a is not None:
        bias = torch.full_like(scores, float("-inf"))
        for i in range(L):
            for j in range(i + 1):
                bias[:, :, i, j] = log_a[:, :, j + 1: i + 1].sum(-1)
        scores = scores + bias
    elif causal:
        scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
