"""Recurrent mode: the defining recurrence, one position at a time (decoding; the reference order).

    S_t = diag(a_t) S_(t-1) + k_t^T v_t,      o_t = Re(q_t S_t)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.ops.linear.common import (Decay, PairState, _add, _decay_state, _read_state, _zero_state,
                                        apply_normalizer)

def recurrent_step(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, state: PairState, *,
                   normalize: bool = False, eps: float = 1e-6,
                   log_scale: Tensor | None = None) -> tuple[Tensor, PairState]:
    """One position of the recurrence: ``S <- diag(a) S + k^T v``, ``o = Re(q S)``.

    Args:
        q, k: ``(B, H, Dk)`` (q already scaled). v: ``(B, H, Dv)``. decay: ``(B, H, 1 or Dk)``
            log-magnitude and phase, or None.
        state: ``(B, H, Dk, Dv)`` real part and imaginary part (None for real transitions); with
            ``normalize`` ``(B, H, Dk, Dv + 1)``, the last column being the normaliser state z.
        normalize, eps, log_scale: as in :func:`linear_attention` (``log_scale`` ``(B, H)``).

    Returns:
        ``(o, state)`` with ``o`` of shape ``(B, H, Dv)``. Plain tensors in and out, so the
        decoding step of a model can be exported.
    """
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if decay is not None:
        state = _decay_state(state, decay.log_mag, decay.phase)
    state = _add(state, PairState(k.unsqueeze(-1) * v.unsqueeze(-2), None))
    out = _read_state(q.unsqueeze(-2), None, state).squeeze(-2)
    return (apply_normalizer(out, eps, log_scale) if normalize else out), state


def _recurrent(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None):
    """The sequential reference: :func:`recurrent_step` at every position."""
    is_complex = decay is not None and decay.phase is not None
    state = initial if initial is not None else _zero_state(q, v, is_complex)
    outputs = []
    for t in range(q.shape[2]):
        step_decay = None if decay is None else Decay(decay.log_mag[:, :, t],
                                                      None if decay.phase is None else decay.phase[:, :, t])
        out, state = recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], step_decay, state)
        outputs.append(out)
    return torch.stack(outputs, dim=2), state

