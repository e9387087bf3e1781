"""The delta rule's execution modes: recurrent (a step per position), chunk (the WY/UT transform
inside chunks, an associative scan of the chunks' affine maps across them) and quadratic (the same
transform over the whole sequence: the parallel form for short sequences).

Notation, per batch and head, inside a chunk of C positions r = 1..C entered with state S_0:
``g_r = sum_{s <= r} log a_s`` (float64, per head ``(C, 1)`` or per key channel ``(C, Dk)``),
``K⁺ = k ⊙ exp(g)``. In the rescaled state ``S̃_r = Γ_r⁻¹ S_r`` (``Γ_r = diag(exp(g_r))``) the delta
rule is a sum of rank-one writes, ``S̃_r = S_0 + sum_{s <= r} (k_s ⊙ exp(-g_s)) u_sᵀ``, whose values

    u = T (V - K⁺ S_0),   T = (I + A)⁻¹ diag(beta),   A_rs = beta_r sum_c k_rc k_sc exp(g_rc - g_sc)  (s < r)

come from one unit lower-triangular solve (the UT transform). Every decay is ``exp`` of a difference
``g_r - g_s <= 0`` (never ``exp(-g)`` alone), so gates at exactly 0 or 1 give no overflow and no NaN.
Writing ``W = T V`` and ``Y = T K⁺``:

    outputs   O = scale ((Q⁺ - QK Y) S_0 + QK W),   QK_rs = sum_c q_rc k_sc exp(g_rc - g_sc)  (s <= r)
    chunk map S_C = M S_0 + N,  M = diag(exp(g_C)) - K_endᵀ Y,  N = K_endᵀ W,  K_end = k ⊙ exp(g_C - g)

The maps of successive chunks compose associatively, ``(M2, N2) ∘ (M1, N1) = (M2 M1, M2 N1 + N2)``,
so in compiled and exported code the states entering every chunk come from an inclusive scan over
chunks with a number of levels fixed by ``max_length``: no Python loop over positions or chunks, and
no recompile for a new length. Eager code applies the same maps chunk after chunk (n small products
rather than the scan's n log n: about 10x faster at L = 4096, H 8, D 64); the compile test checks
that both agree.
Padding positions have beta = 0 and a = 1: they change nothing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.ops.linear.common import LOG_ZERO, batched_matmul


def recurrent_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None, state: Tensor,
                   scale: float) -> tuple[Tensor, Tensor]:
    """One position: q, k ``(B, H, Dk)``, v ``(B, H, Dv)``, beta ``(B, H)``, log_a ``(B, H, 1 or Dk)`` or
    None, state ``(B, H, Dk, Dv)`` -> ``(out (B, H, Dv), new state)``. The decoding step."""
    if log_a is not None:
        state = torch.exp(log_a.clamp_min(LOG_ZERO)).unsqueeze(-1) * state
    read = torch.einsum("bhk,bhkv->bhv", k, state)
    state = state + (beta.unsqueeze(-1) * k).unsqueeze(-1) * (v - read).unsqueeze(-2)
    return scale * torch.einsum("bhk,bhkv->bhv", q, state), state


def recurrent(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None, state: Tensor,
              scale: float) -> tuple[Tensor, Tensor]:
    """:func:`recurrent_step` at every position, in order: ``(out (B, H, L, Dv), final state)``."""
    outs = []
    for t in range(q.shape[2]):
        out, state = recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t],
                                    None if log_a is None else log_a[:, :, t], state, scale)
        outs.append(out)
    return torch.stack(outs, dim=2), state


def chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None, state: Tensor | None,
            scale: float, chunk_size: int, max_length: int | None) -> tuple[Tensor, Tensor]:
    """Chunk mode (see the module doc): ``(out (B, H, L, Dv), final state (B, H, Dk, Dv))``."""
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    C = chunk_size
    # As in the linear chunk mode: n = ceil(L / C) + 1 chunks, written as one floor division, padding
    # always applied and never a single chunk, so shapes never specialise on L.
    n = (L + 2 * C - 1) // C
    pad = n * C - L
    q, k, v = (F.pad(t, [0, 0, 0, pad]).reshape(B, H, n, C, t.shape[-1]) for t in (q, k, v))
    beta = F.pad(beta, [0, pad]).reshape(B, H, n, C)
    log_a = None if log_a is None else F.pad(log_a, [0, 0, 0, pad]).reshape(B, H, n, C, log_a.shape[-1])
    out_weights, (m, n_) = _within_chunks(q, k, v, beta, log_a)
    if state is None:
        state = q.new_zeros(B, H, Dk, Dv)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        # a fixed number of doublings: one graph for every length up to max_length
        levels = max(1, math.ceil(math.log2(max(2, (max_length + 2 * C - 1) // C if max_length else n))))
        prefix_m, prefix_n = _inclusive_scan(m, n_, levels)  # (B, H, n, Dk, Dk), (B, H, n, Dk, Dv)
        after = batched_matmul(prefix_m, state.unsqueeze(2).expand(B, H, n, Dk, Dv)) + prefix_n
    else:
        # eager: the same maps applied chunk after chunk, n small products instead of n log n
        after = _apply_in_order(m, n_, state)
    entering = torch.cat([state.unsqueeze(2), after[:, :, :-1]], dim=2)
    reads, writes = out_weights
    out = scale * (batched_matmul(reads, entering) + writes)  # (B, H, n, C, Dv)
    out = out.reshape(B, H, n * C, Dv).index_select(2, torch.arange(L, device=q.device))
    return out, after[:, :, -1]


def quadratic(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None, state: Tensor | None,
              scale: float) -> tuple[Tensor, Tensor]:
    """The parallel form: the UT transform over the whole sequence as one chunk (an L x L solve)."""
    B, H, L, Dk = q.shape
    one = lambda t: t.unsqueeze(2)  # noqa: E731  a single chunk of L positions
    (reads, writes), (m, n_) = _within_chunks(one(q), one(k), one(v), one(beta), None if log_a is None else one(log_a))
    entering = torch.zeros(B, H, 1, Dk, v.shape[-1], dtype=q.dtype, device=q.device) if state is None \
        else state.unsqueeze(2)
    out = scale * (batched_matmul(reads, entering) + writes)
    final = batched_matmul(m, entering) + n_
    return out.squeeze(2), final.squeeze(2)


def _within_chunks(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None):
    """Per chunk, from ``(B, H, n, C, D)`` inputs: the outputs' dependence on the entering state
    ``(reads (.., C, Dk), writes (.., C, Dv))`` with ``O = scale (reads S_0 + writes)``, and the
    chunk's affine map ``(M (.., Dk, Dk), N (.., Dk, Dv))`` with ``S_C = M S_0 + N``."""
    C, Dk = q.shape[-2], q.shape[-1]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    if log_a is None:
        qk = batched_matmul(q, k.transpose(-1, -2))
        kk = batched_matmul(k, k.transpose(-1, -2))
        k_plus, q_plus, k_end, to_end = k, q, k, None
    else:
        # float64 cumulative log-decays; every decay below is exp of a difference (module doc)
        g = torch.cumsum(log_a.to(torch.float64).clamp_min(LOG_ZERO), dim=-2)  # (.., C, Dd)
        pairwise = g.unsqueeze(-2) - g.unsqueeze(-3)  # [.., r, s, :] = g_r - g_s
        decay = torch.exp(torch.where(causal.unsqueeze(-1), pairwise, float("-inf"))).to(q.dtype)
        if log_a.shape[-1] == 1:
            qk = batched_matmul(q, k.transpose(-1, -2)) * decay.squeeze(-1)
            kk = batched_matmul(k, k.transpose(-1, -2)) * decay.squeeze(-1)
        else:  # per key channel: (.., r, s, Dk)
            qk = (q.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)
            kk = (k.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)
        k_plus, q_plus = k * torch.exp(g).to(q.dtype), q * torch.exp(g).to(q.dtype)
        k_end = k * torch.exp(g[..., -1:, :] - g).to(q.dtype)
        to_end = torch.exp(g[..., -1, :]).to(q.dtype)  # (.., Dd): the decay across the chunk
    qk = qk.masked_fill(~causal, 0.0)
    a = (beta.unsqueeze(-1) * kk).masked_fill(~strict, 0.0)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    transform = torch.linalg.solve_triangular(eye + a, torch.diag_embed(beta), upper=False, unitriangular=True)
    w = batched_matmul(transform, v)  # T V: the values written, before the entering state's recall
    y = batched_matmul(transform, k_plus)  # T K⁺: how the entering state's recall changes them
    reads = q_plus - batched_matmul(qk, y)
    writes = batched_matmul(qk, w)
    identity = torch.eye(Dk, dtype=q.dtype, device=q.device)
    decay_diag = identity if to_end is None else torch.diag_embed(to_end.expand(*to_end.shape[:-1], Dk))
    m = decay_diag - batched_matmul(k_end.transpose(-1, -2), y)
    n_ = batched_matmul(k_end.transpose(-1, -2), w)
    return (reads, writes), (m, n_)


def _apply_in_order(m: Tensor, n_: Tensor, state: Tensor) -> Tensor:
    """The state after each chunk, ``S_c = M_c S_(c-1) + N_c`` from ``state``, chunk by chunk: ``(B, H, n, Dk, Dv)``."""
    after = []
    # unbind, not m[:, :, c]: the backward of n indexings would write n full-size gradients (quadratic in L)
    for m_c, n_c in zip(m.unbind(2), n_.unbind(2)):
        state = torch.matmul(m_c, state) + n_c
        after.append(state)
    return torch.stack(after, dim=2)


def _inclusive_scan(m: Tensor, n_: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """Prefix compositions of affine maps along dim 2 (Hillis-Steele): after it, element c is
    ``map_c ∘ ... ∘ map_0``. ``levels`` doublings cover 2**levels chunks; shifts past the sequence
    compose with the identity, so a fixed ``levels`` serves every length up to the maximum."""
    count = m.shape[2]
    for level in range(levels):
        shift = 1 << level
        identity = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device).expand(*m.shape[:2], shift, *m.shape[-2:])
        before_m = torch.cat([identity, m], dim=2).narrow(2, 0, count)
        before_n = torch.cat([torch.zeros_like(n_[:, :, :1]).expand(-1, -1, shift, -1, -1), n_], dim=2).narrow(2, 0, count)
        m, n_ = batched_matmul(m, before_m), batched_matmul(m, before_n) + n_
    return m, n_
