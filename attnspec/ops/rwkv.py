"""RWKV-4's WKV operator (Peng et al. 2023, eq. 14-16): per channel, a softmax over the positions so far whose logits
need no query,

    wkv_t = (Σ_{i<t} e^{k_i - (t-1-i) w} v_i + e^{u + k_t} v_t) / (Σ_{i<t} e^{k_i - (t-1-i) w} + e^{u + k_t})

with w > 0 the channel's decay rate and u its bonus for the current position. It is normalised linear attention with
one key and one value per channel, the feature map exp, a query of ones, a decay e^{-w} and a diagonal correction
(e^{u + w} - 1) e^{k_t} (:mod:`attnspec.spec.mixers.rwkv` says so); computed as that it would overflow (e^k of a
trained key), so every mode here works in log space with a running maximum, as RWKV's own kernels do:

- ``quadratic``: the (L x L) logits per channel, one softmax each;
- ``chunk``: within chunks of T positions the (T x T) logits; each earlier chunk enters as one logit and its
  normalised sums (numerator, denominator) at its end; (L x (T + L / T)) per channel, no loop;
- ``recurrent``: the defining recurrence over (numerator, denominator, maximum), one position at a time, which
  :func:`wkv_step` is one step of (decoding).

Shapes: ``w``, ``u`` (C,); ``k``, ``v`` (B, L, C); the result (B, L, C). Computed in float32 at least (float64 stays);
returned in ``v``'s dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.errors import ShapeError

State = tuple[Tensor, Tensor, Tensor]
"""(numerator, denominator, maximum), each (B, C), float32 at least: the sums over the positions so far of
e^{k_i - (t-i) w - maximum} v_i and of e^{k_i - (t-i) w - maximum}, after position t."""

EMPTY = -1e38
"""The maximum of a state that has seen nothing (finite, so that differences with it stay numbers)."""


def _checked(w: Tensor, u: Tensor, k: Tensor, v: Tensor) -> torch.dtype:
    if k.dim() != 3 or v.shape != k.shape or w.shape != (k.shape[-1],) or u.shape != w.shape:
        raise ShapeError(f"k, v must be (B, L, C) and w, u (C,); got {tuple(k.shape)}, {tuple(v.shape)}, "
                         f"{tuple(w.shape)}, {tuple(u.shape)}")
    return torch.promote_types(v.dtype, torch.float32)


def initial_state(batch: int, channels: int, dtype: torch.dtype = torch.float32, device=None) -> State:
    """The state before any position: zero sums, the maximum at :data:`EMPTY`."""
    zeros = torch.zeros(batch, channels, dtype=dtype, device=device)
    return zeros, zeros.clone(), torch.full_like(zeros, EMPTY)


def wkv_step(w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: State) -> tuple[Tensor, State]:
    """One position: k, v (B, C) and the state after the positions before -> (wkv (B, C), the state after it)."""
    numerator, denominator, maximum = state
    wide = numerator.dtype
    k, v, w, u = k.to(wide), v.to(wide), w.to(wide), u.to(wide)
    top = torch.maximum(maximum, u + k)  # the output's: the past, and this position with its bonus
    past, now = torch.exp(maximum - top), torch.exp(u + k - top)
    out = (past * numerator + now * v) / (past * denominator + now)
    top = torch.maximum(maximum - w, k)  # the state's: the past one step further, and this position
    past, now = torch.exp(maximum - w - top), torch.exp(k - top)
    return out, (past * numerator + now * v, past * denominator + now, top)


def wkv_recurrent(w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: State | None = None
                  ) -> tuple[Tensor, State]:
    """The recurrence over the positions in order, from ``state`` (None: :func:`initial_state`) -> (wkv, the state
    after the last position)."""
    wide = _checked(w, u, k, v)
    state = initial_state(k.shape[0], k.shape[2], wide, k.device) if state is None else state
    outputs = []
    for t in range(k.shape[1]):
        out, state = wkv_step(w, u, k[:, t], v[:, t], state)
        outputs.append(out)
    return torch.stack(outputs, 1).to(v.dtype), state


def _pair_logits(w: Tensor, u: Tensor, k: Tensor) -> Tensor:
    """Logits of key i for query t within one span: k (..., T, C) -> (..., T_t, T_i, C): k_i - (t-1-i) w below
    the diagonal, u + k_t on it, -inf above."""
    T = k.shape[-2]
    t = torch.arange(T, device=k.device)
    distance = (t.view(-1, 1) - 1 - t.view(1, -1)).to(k.dtype)  # t - 1 - i
    logits = k.unsqueeze(-3) - distance.unsqueeze(-1) * w
    diagonal = (t.view(-1, 1) == t.view(1, -1)).unsqueeze(-1)
    logits = torch.where(diagonal, (u + k).unsqueeze(-3), logits)
    return logits.masked_fill((t.view(-1, 1) < t.view(1, -1)).unsqueeze(-1), float("-inf"))


def wkv_quadratic(w: Tensor, u: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Every (query, key) logit of a channel at once and a softmax over the keys: (B, L, L, C) numbers."""
    wide = _checked(w, u, k, v)
    logits = _pair_logits(w.to(wide), u.to(wide), k.to(wide))
    return (torch.softmax(logits, dim=2) * v.to(wide).unsqueeze(1)).sum(2).to(v.dtype)


def wkv_chunk(w: Tensor, u: Tensor, k: Tensor, v: Tensor, chunk: int) -> Tensor:
    """Chunks of ``chunk`` positions: the logits within each, and each earlier chunk c' as one logit
    m_c' - ((c - c' - 1) T + t) w with its sums at its end, normalised by m_c' (their maximum logit there)."""
    wide = _checked(w, u, k, v)
    B, L, C = k.shape
    T = chunk
    n = -(-L // T)
    w, u = w.to(wide), u.to(wide)
    k = torch.nn.functional.pad(k.to(wide), (0, 0, 0, n * T - L)).view(B, n, T, C)
    v = torch.nn.functional.pad(v.to(wide), (0, 0, 0, n * T - L)).view(B, n, T, C)
    within = _pair_logits(w, u, k)  # (B, n, T, T, C)
    local = torch.arange(T, device=k.device)
    at_end = k - (T - 1 - local).to(wide).view(1, 1, T, 1) * w  # each key's logit at its chunk's last position
    top = at_end.amax(2, keepdim=True)
    scaled = torch.exp(at_end - top)
    sums, weights = (scaled * v).sum(2), scaled.sum(2)  # (B, n, C) each, normalised by top
    c = torch.arange(n, device=k.device)
    gap = (c.view(-1, 1) - c.view(1, -1) - 1).to(wide)  # chunks between query chunk c and key chunk c'
    distance = gap.view(1, n, 1, n, 1) * T + local.to(wide).view(1, 1, T, 1, 1)  # (c - c' - 1) T + t
    earlier = top.squeeze(2).view(B, 1, 1, n, C) - distance * w
    earlier = earlier.masked_fill((c.view(-1, 1) <= c.view(1, -1)).view(1, n, 1, n, 1), float("-inf"))
    # the result does not depend on the shift: no gradient goes through it
    shift = torch.maximum(within.amax(3), earlier.amax(3)).detach().unsqueeze(3)  # (B, n, T, 1, C)
    within, earlier = torch.exp(within - shift), torch.exp(earlier - shift)
    numerator = (within * v.unsqueeze(2)).sum(3) + (earlier * sums.view(B, 1, 1, n, C)).sum(3)
    denominator = within.sum(3) + (earlier * weights.view(B, 1, 1, n, C)).sum(3)
    out = (numerator / denominator).view(B, n * T, C)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():  # a gather: a slice would make the program
        out = out.index_select(1, torch.arange(L, device=out.device))  # prove L <= T ceil(L / T), which it cannot
    else:
        out = out[:, :L]
    return out.to(v.dtype)


def final_state(w: Tensor, k: Tensor, v: Tensor) -> State:
    """The state after the last of positions k, v (B, L, C): from their logits at the end, k_i - (L-1-i) w."""
    wide = torch.promote_types(v.dtype, torch.float32)
    L = k.shape[1]
    logits = k.to(wide) - (L - 1 - torch.arange(L, device=k.device)).to(wide).view(1, L, 1) * w.to(wide)
    top = logits.amax(1)
    scaled = torch.exp(logits - top.unsqueeze(1))
    return (scaled * v.to(wide)).sum(1), scaled.sum(1), top


MODES = {"quadratic": wkv_quadratic, "chunk": wkv_chunk}

__all__ = ["EMPTY", "State", "final_state", "initial_state", "wkv_chunk", "wkv_quadratic", "wkv_recurrent",
           "wkv_step"]
