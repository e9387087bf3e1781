"""The float64 reference of gated linear attention: the defining recurrence, written plainly.

Complex128 tensors and a Python loop over positions, nothing shared with the modes it checks (the
way flash-linear-attention keeps ``naive.py`` beside its kernels). Every mode of
:func:`attnspec.ops.linear.linear_attention` is tested against it; slow and obvious on purpose.
"""

from __future__ import annotations

import torch


def linear_attention_reference(q, k, v, log_a=None, *, normalize=False, scale=1.0, eps=1e-6, causal=True,
                               S0=None, z0=None):
    """The defining recurrence in complex128: S_t = diag(a_t) S_(t-1) + k_t^T v_t, o_t = Re(scale q_t S_t)."""
    q, k, v = (t.to(torch.complex128) for t in (q, k, v))
    B, H, L, Dk = q.shape
    if not causal:
        S = k.transpose(-1, -2) @ v
        z = k.sum(2)
        out = (scale * q @ S).real
        if normalize:
            out = out / (scale * q @ z.unsqueeze(-1)).real.clamp_min(eps)
        return out
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.complex128) if S0 is None else S0.to(torch.complex128)
    z = torch.zeros(B, H, Dk, dtype=torch.complex128) if z0 is None else z0.to(torch.complex128)
    outs = []
    for t in range(L):
        if log_a is not None:
            a = torch.exp(log_a[:, :, t].to(torch.complex128))
            a = a.unsqueeze(-1) if a.dim() == 2 else a
            S, z = a.unsqueeze(-1) * S, a * z
        S = S + k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        z = z + k[:, :, t]
        o = (scale * q[:, :, t].unsqueeze(-2) @ S).squeeze(-2).real
        if normalize:
            o = o / (scale * (q[:, :, t] * z).sum(-1)).real.clamp_min(eps).unsqueeze(-1)
        outs.append(o)
    return torch.stack(outs, dim=2), S, z
