"""Quadratic mode: all L x L pairs at once, with pairwise decays exp(segment sums of log a)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.ops.linear.common import (Decay, PairState, _add, _decay_state, _phase_cumsum, _phase_segsum,
                                        _read_state, _rotate, _segsum, wrap_phase)

def _noncausal(q: Tensor, k: Tensor, v: Tensor, mode: str) -> Tensor:
    if mode == "quadratic":
        return (q @ k.transpose(-1, -2)) @ v
    return q @ (k.transpose(-1, -2) @ v)


def _quadratic(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None):
    """All pairs at once: scores (L x L) times the pairwise decay exp(segment sums), masked."""
    L = q.shape[2]
    if decay is None:
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0)
        out = scores @ v
        final_re = k.transpose(-1, -2) @ v
        final = PairState(final_re + (initial.re if initial is not None else 0), None)
        if initial is not None:
            out = out + q @ initial.re
        return out, final
    rel_mag = _segsum(decay.log_mag)  # (B, H, L, L, Dk')
    rel_phase = None if decay.phase is None else _phase_segsum(decay.phase)
    pair = torch.exp(rel_mag)
    if rel_phase is not None:
        pair = pair * torch.cos(rel_phase)
    if decay.log_mag.shape[-1] == 1:
        scores = (q @ k.transpose(-1, -2)) * pair.squeeze(-1)
    else:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3) * pair).sum(-1)  # per-channel decays: (.., i, j, Dk)
    out = scores @ v
    # Decay from each position to the end (sum_{s > j} log a_s), and from the start to each position.
    to_end = _reverse_exclusive_cumsum(decay.log_mag)
    to_end_phase = None if decay.phase is None else _reverse_exclusive_cumsum(decay.phase.to(torch.float64))
    to_end_phase = None if to_end_phase is None else wrap_phase(to_end_phase).to(decay.phase.dtype)
    k_re, k_im = _rotate(k, to_end, to_end_phase)
    final = PairState(k_re.transpose(-1, -2) @ v, None if k_im is None else k_im.transpose(-1, -2) @ v)
    if initial is not None:
        from_start = torch.cumsum(decay.log_mag, dim=2)
        from_start_phase = None if decay.phase is None else _phase_cumsum(decay.phase, dim=2)
        q_re, q_im = _rotate(q, from_start, from_start_phase)
        out = out + _read_state(q_re, q_im, initial)
        total_mag = from_start[:, :, -1]
        final = _add(final, _decay_state(initial, total_mag, None if from_start_phase is None else from_start_phase[:, :, -1]))
    return out, final


def _reverse_exclusive_cumsum(x: Tensor, dim: int = -2) -> Tensor:
    """``out[j] = sum_{s > j} x[s]`` along ``dim``, accumulated directly (no subtraction)."""
    shifted = torch.cat([x.narrow(dim, 1, x.shape[dim] - 1), torch.zeros_like(x.narrow(dim, 0, 1))], dim=dim)
    return torch.flip(torch.cumsum(torch.flip(shifted, dims=[dim]), dim=dim), dims=[dim])

