"""Scan mode: every per-position state at once by a Hillis-Steele prefix scan over positions.

The GateLoop operator ``(a1, S1) . (a2, S2) = (a1 a2, a2 S1 + S2)`` materialises every state
(small states only). torch's ``associative_scan`` is not used: on CPU it supports only
``combine_mode="generic"``, recompiles per length and cannot be exported with a dynamic length.
Traced (compile, export), the number of steps is fixed by ``max_length``, so one graph serves every
length; eager code takes the ``ceil(log2 L)`` steps its length needs. (The steps past L shift in only
zeros, but each is a full pass over the states: at ``max_len`` 1024, L 64 took 10 steps where 6 do,
and training's scan mode cost twice the recurrent mode the cost model ranked it against.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnspec.ops.linear.common import Decay, PairState, _add, _at_first, _decay_state, _shift, wrap_phase

def scan_steps(n: int, max_length: int | None = None, unit: int = 1) -> int:
    """Number of Hillis-Steele steps for ``n`` elements (or for ``ceil(max_length / unit)`` if given)."""
    count = -(-max_length // unit) if max_length is not None else n
    return max(0, math.ceil(math.log2(max(int(count), 1))))


def inclusive_scan(log_mag: Tensor, phase: Tensor | None, state: PairState, dim: int, steps: int) -> PairState:
    """Prefix "sums" of ``(a_t, U_t)`` under ``(a1, U1) . (a2, U2) = (a1 a2, a2 U1 + U2)`` along ``dim``.

    ``log_mag``/``phase``: ``(..., T, Dk')`` with ``Dk'`` 1 or Dk; ``state``: ``(..., T, Dk, Dv)``; ``dim`` is
    the T axis of ``state`` (negative, counted from the end). Hillis-Steele: ``steps`` rounds of
    shift-by-2^s and combine, so the result is exact whenever ``2**steps >= T``.
    """
    assert dim < 0
    decay_dim = dim + 1
    # The phase of the segment ending at t is a difference of float64 prefix sums, rounded once:
    # doubling it in the input dtype would add one rounding per level, growing with the segment.
    phase_prefix = None if phase is None else torch.cumsum(phase.to(torch.float64), dim=decay_dim)
    for s in range(steps):
        shift = 1 << s
        prev = PairState(_shift(state.re, shift, dim), None if state.im is None else _shift(state.im, shift, dim))
        prev_mag = _shift(log_mag, shift, decay_dim)  # padded with log 1 = 0
        if phase_prefix is not None:  # where t < shift the previous state is 0, so the phase there is moot
            phase = wrap_phase(phase_prefix - _shift(phase_prefix, shift, decay_dim)).to(log_mag.dtype)
        state = _add(_decay_state(prev, log_mag, phase), state)
        log_mag = log_mag + prev_mag
    return state


def _scan_mode(q: Tensor, k: Tensor, v: Tensor, decay: Decay | None, initial: PairState | None,
               max_length: int | None):
    """Every per-position state at once by a parallel prefix scan over (a_t, k_t^T v_t)."""
    L = q.shape[2]
    traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    writes = PairState(k.unsqueeze(-1) * v.unsqueeze(-2), None)  # (B, H, L, Dk, Dv)
    if decay is None:
        states = PairState(torch.cumsum(writes.re, dim=2), None)
        if initial is not None:
            states = _add(states, PairState(initial.re.unsqueeze(2), None))
    else:
        if initial is not None:  # fold S0 into the first write: S_1 = a_1 S0 + W_1
            first = _decay_state(initial, decay.log_mag[:, :, 0], None if decay.phase is None else decay.phase[:, :, 0])
            writes = _add(writes, PairState(_at_first(first.re, L), None if first.im is None else _at_first(first.im, L)))
        steps = scan_steps(L, max_length if traced else None)
        states = inclusive_scan(decay.log_mag, decay.phase, writes, dim=-3, steps=steps)
    out = (q.unsqueeze(-2) @ states.re).squeeze(-2)
    final_re = states.re[:, :, -1]
    if states.im is not None:
        final_im = states.im[:, :, -1]
    else:  # a complex decay whose scan took no step (L = 1, no S0) leaves a real state: its phase part is 0
        final_im = None if decay is None or decay.phase is None else torch.zeros_like(final_re)
    return out, PairState(final_re, final_im)

