"""The float64 reference of the delta rule: the defining recurrence, written plainly (a Python loop
over positions, nothing shared with the modes it checks); slow and obvious on purpose."""

from __future__ import annotations

import torch
from torch import Tensor


def delta_rule_reference(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None = None, *,
                         scale: float = 1.0, initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``S_t = (I - beta_t k_t k_tᵀ) diag(a_t) S_(t-1) + beta_t k_t v_tᵀ``, ``o_t = scale q_tᵀ S_t``, in float64.

    Args:
        q, k: ``(B, H, L, Dk)``; v: ``(B, H, L, Dv)``; beta: ``(B, H, L)``.
        log_a: None (a = 1), ``(B, H, L)`` (per head) or ``(B, H, L, Dk)`` (per key channel).
        initial_state: ``(B, H, Dk, Dv)`` or None (zeros).

    Returns:
        ``(out (B, H, L, Dv), final state (B, H, Dk, Dv))``, float64.
    """
    q, k, v, beta = (t.to(torch.float64) for t in (q, k, v, beta))
    B, H, L, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float64) if initial_state is None \
        else initial_state.to(torch.float64).clone()
    outs = []
    for t in range(L):
        if log_a is not None:
            a = torch.exp(log_a[:, :, t].to(torch.float64))
            S = (a.unsqueeze(-1) if a.dim() == 2 else a).unsqueeze(-1) * S  # diag(a_t) S
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t]
        read = (kt.unsqueeze(-2) @ S).squeeze(-2)  # k_tᵀ S: what the state recalls for this key
        S = S + bt[..., None, None] * kt.unsqueeze(-1) * (vt - read).unsqueeze(-2)
        outs.append(scale * (q[:, :, t].unsqueeze(-2) @ S).squeeze(-2))
    return torch.stack(outs, dim=2), S
