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
no recompile for a new length. Eager code runs the chunks one after another without forming M or N,
``S_C = diag(exp(g_C)) S_0 + K_endᵀ (W - Y S_0)``: two small products a chunk rather than the scan's
n log n (about 10x faster at L = 4096, H 8, D 64) and two fewer chunk-sized ones than composing the
maps (1.3x at L = 8192); the compile test checks that both agree.
Padding positions have beta = 0 and a = 1: they change nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.ops.linear.common import LOG_ZERO, batched_matmul, batched_matmul_add


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
    traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    # Traced, as in the linear chunk mode: n = ceil(L / C) + 1 chunks, written as one floor division,
    # padding always applied and never a single chunk, so shapes never specialise on L. Eager: ceil(L / C).
    n = (L + 2 * C - 1) // C if traced else -(-L // C)
    pad = n * C - L
    q, k, v = (F.pad(t, [0, 0, 0, pad]).reshape(B, H, n, C, t.shape[-1]) for t in (q, k, v))
    beta = F.pad(beta, [0, pad]).reshape(B, H, n, C)
    log_a = None if log_a is None else F.pad(log_a, [0, 0, 0, pad]).reshape(B, H, n, C, log_a.shape[-1])
    forms = _within_chunks(q, k, v, beta, log_a)
    if state is None:
        state = q.new_zeros(B, H, Dk, Dv)
    if traced:
        # a fixed number of doublings: one graph for every length up to max_length
        levels = max(1, math.ceil(math.log2(max(2, (max_length + 2 * C - 1) // C if max_length else n))))
        prefix_m, prefix_n = _inclusive_scan(*_chunk_maps(forms), levels)  # (B, H, n, Dk, Dk), (B, H, n, Dk, Dv)
        after = batched_matmul(prefix_m, state.unsqueeze(2).expand(B, H, n, Dk, Dv)) + prefix_n
        entering, final = torch.cat([state.unsqueeze(2), after[:, :, :-1]], dim=2), after[:, :, -1]
    else:
        # eager: the chunks one after another, each writing its values u = W - Y S into the state
        entering, final = _states_in_order(forms, state)
    out = batched_matmul_add(forms.writes, forms.reads, entering, beta=scale, alpha=scale)  # (B, H, n, C, Dv)
    out = out.reshape(B, H, n * C, Dv).narrow(2, 0, L) if not traced else \
        out.reshape(B, H, n * C, Dv).index_select(2, torch.arange(L, device=q.device))
    return out, final


def quadratic(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None, state: Tensor | None,
              scale: float) -> tuple[Tensor, Tensor]:
    """The parallel form: the UT transform over the whole sequence as one chunk (an L x L solve)."""
    B, H, L, Dk = q.shape
    one = lambda t: t.unsqueeze(2)  # noqa: E731  a single chunk of L positions
    forms = _within_chunks(one(q), one(k), one(v), one(beta), None if log_a is None else one(log_a))
    entering = torch.zeros(B, H, 1, Dk, v.shape[-1], dtype=q.dtype, device=q.device) if state is None \
        else state.unsqueeze(2)
    out = batched_matmul_add(forms.writes, forms.reads, entering, beta=scale, alpha=scale)
    m, n_ = _chunk_maps(forms)
    final = batched_matmul_add(n_, m, entering)
    return out.squeeze(2), final.squeeze(2)


class _ChunkForms(NamedTuple):
    """What each chunk computes from its own inputs, ``(B, H, n, C, ...)`` (module doc): the outputs'
    dependence on the entering state, ``O = scale (reads S_0 + writes)``, and the pieces of its state
    map, ``S_C = D S_0 + K_endᵀ (W - Y S_0)`` with ``D = diag(to_end)`` (None: no decay, D = I)."""

    reads: Tensor  # Q⁺ - QK Y  (.., C, Dk)
    writes: Tensor  # QK W      (.., C, Dv)
    w: Tensor  # T V            (.., C, Dv)
    y: Tensor  # T K⁺           (.., C, Dk)
    k_end: Tensor  # k ⊙ exp(g_C - g)  (.., C, Dk)
    to_end: Tensor | None  # exp(g_C)  (.., 1 or Dk): the decay across the chunk


def _within_chunks(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_a: Tensor | None) -> _ChunkForms:
    """Per chunk, from ``(B, H, n, C, D)`` inputs, its :class:`_ChunkForms`."""
    C = q.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if log_a is None:
        qk = batched_matmul(q, k.transpose(-1, -2)).masked_fill(~causal, 0.0)
        kk = batched_matmul(k, k.transpose(-1, -2))
        k_plus, q_plus, k_end, to_end = k, q, k, None
    else:
        # float64 cumulative log-decays, and their pairwise differences g_r - g_s (never exp(-g) alone):
        # both are sums and differences of large numbers. A difference is exact enough in the working
        # dtype once formed (its exp then errs by |g_r - g_s| u, for the decays that are not ~0 at most
        # 30 u in float32), so the exp runs in it; above the diagonal it is -inf, the decay 0.
        g = torch.cumsum(log_a.to(torch.float64).clamp_min(LOG_ZERO), dim=-2)  # (.., C, Dd)
        if log_a.shape[-1] == 1:  # per head: (.., r, s), formed without a trailing axis of 1 (3x faster)
            g_head = g.squeeze(-1)
            pairwise = (g_head.unsqueeze(-1) - g_head.unsqueeze(-2)).to(q.dtype)  # [.., r, s] = g_r - g_s
            decay = pairwise.masked_fill_(~causal, float("-inf")).exp_()
            qk = batched_matmul(q, k.transpose(-1, -2)).mul_(decay)
            kk = batched_matmul(k, k.transpose(-1, -2)).mul_(decay)
        else:  # per key channel: (.., r, s, Dk)
            pairwise = (g.unsqueeze(-2) - g.unsqueeze(-3)).to(q.dtype)
            decay = pairwise.masked_fill_(~causal.unsqueeze(-1), float("-inf")).exp_()
            qk = (q.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)
            kk = (k.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)
        k_plus, q_plus = k * torch.exp(g).to(q.dtype), q * torch.exp(g).to(q.dtype)
        k_end = k * torch.exp(g[..., -1:, :] - g).to(q.dtype)
        to_end = torch.exp(g[..., -1, :]).to(q.dtype)  # (.., Dd): the decay across the chunk
    # T = (I + A)⁻¹ diag(beta) with A = beta kk strictly below the diagonal: a unit lower-triangular solve
    # reads only the strict lower triangle, so A is neither masked nor given its identity
    transform = torch.linalg.solve_triangular(beta.unsqueeze(-1) * kk, torch.diag_embed(beta), upper=False,
                                              unitriangular=True)
    w = batched_matmul(transform, v)  # T V: the values written, before the entering state's recall
    y = batched_matmul(transform, k_plus)  # T K⁺: how the entering state's recall changes them
    reads = batched_matmul_add(q_plus, qk, y, alpha=-1.0)
    writes = batched_matmul(qk, w)
    return _ChunkForms(reads, writes, w, y, k_end, to_end)


def _chunk_maps(forms: _ChunkForms) -> tuple[Tensor, Tensor]:
    """Each chunk's affine state map ``(M (.., Dk, Dk), N (.., Dk, Dv))``, ``S_C = M S_0 + N``."""
    Dk, to_end = forms.y.shape[-1], forms.to_end
    identity = torch.eye(Dk, dtype=forms.y.dtype, device=forms.y.device)
    decay_diag = identity if to_end is None else torch.diag_embed(to_end.expand(*to_end.shape[:-1], Dk))
    k_end_t = forms.k_end.transpose(-1, -2)
    m = batched_matmul_add(decay_diag.expand(*forms.y.shape[:-2], Dk, Dk), k_end_t, forms.y, alpha=-1.0)
    return m, batched_matmul(k_end_t, forms.w)


def _states_in_order(forms: _ChunkForms, state: Tensor) -> tuple[Tensor, Tensor]:
    """The states entering each chunk ``(B, H, n, Dk, Dv)`` and the final state, chunk after chunk from
    ``state``: ``u = W - Y S`` (the chunk's values after recalling S), ``S <- D S + K_endᵀ u``. Two small
    products a chunk, and neither M nor N is formed (the traced scan composes those instead)."""
    entering = []
    to_end = [None] * forms.w.shape[2] if forms.to_end is None else forms.to_end.unbind(2)
    # unbind, not indexing: the backward of n indexings would write n full-size gradients (quadratic in L)
    for w_c, y_c, k_end_c, to_end_c in zip(forms.w.unbind(2), forms.y.unbind(2), forms.k_end.unbind(2), to_end):
        entering.append(state)
        u = torch.baddbmm(w_c.flatten(0, 1), y_c.flatten(0, 1), state.flatten(0, 1), alpha=-1.0)
        kept = state if to_end_c is None else to_end_c.unsqueeze(-1) * state
        state = torch.baddbmm(kept.flatten(0, 1), k_end_c.flatten(0, 1).transpose(-1, -2), u).view_as(state)
    return torch.stack(entering, dim=2), state


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
