"""RWKV-4's time mixing and channel mixing (:mod:`attnspec.spec.mixers.rwkv` states them): the token shift and the
projections here, the WKV operator in every mode of :mod:`attnspec.ops.rwkv`. The parameters carry RWKV's names
(``time_decay``, ``time_first``, ``time_mix_*``, ``key``, ``value``, ``receptance``, ``output``); each ``time_mix_*``
is held as (d_model,) (RWKV's (1, 1, d_model))."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer, full_precision
from attnspec.nn.registry import register
from attnspec.ops import rwkv as wkv


def _mix_init(d_model: int, power: float = 1.0) -> Tensor:
    """RWKV-4's token-shift initialisation at its first layer: μ_i = (i / d_model)^power."""
    return (torch.arange(d_model, dtype=torch.float32) / d_model) ** power


class _TokenShift:
    """The input one position back: x (B, L, d) and the last input before it (B, d), or None (zeros) -> the
    shifted inputs (B, L, d); and ``_mixed``, RWKV's per-channel interpolation μ x_t + (1 - μ) x_(t-1)."""

    @staticmethod
    def _shifted(x: Tensor, previous: Tensor | None) -> Tensor:
        before = x.new_zeros(x.shape[0], 1, x.shape[2]) if previous is None else previous.unsqueeze(1).to(x.dtype)
        return torch.cat([before, x[:, :-1]], dim=1)

    @staticmethod
    def _mixed(x: Tensor, shifted: Tensor, mix: Tensor) -> Tensor:
        mix = mix.to(x.dtype)
        return x * mix + shifted * (1 - mix)


@register("mixer", "rwkv")
class RwkvMixer(_TokenShift, Mixer):
    """(B, L, d_model) -> (B, L, d_model): W_o (σ(r) ⊙ WKV(k, v)) over the token-shifted inputs."""

    float32_parameters = ("time_decay", "time_first")
    """Kept in float32 in a bfloat16 or float16 model (as transformers keeps them): w = exp(time_decay) raises a
    rounding of the rate to the power of the distance."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        width = node.width
        self.width = width
        # RWKV-4's initialisation at its first layer (its later layers' depend on the depth)
        channel = torch.arange(width, dtype=torch.float32)
        self.time_decay = nn.Parameter(-5 + 8 * (channel / max(width - 1, 1)) ** 0.7)
        self.time_first = nn.Parameter(math.log(0.3) + ((channel + 1) % 3 - 1) * 0.5)
        self.time_mix_key = nn.Parameter(_mix_init(d_model))
        self.time_mix_value = nn.Parameter(_mix_init(d_model))
        self.time_mix_receptance = nn.Parameter(_mix_init(d_model, 0.5))
        self.key = nn.Linear(d_model, width, bias=False)
        self.value = nn.Linear(d_model, width, bias=False)
        self.receptance = nn.Linear(d_model, width, bias=False)
        self.output = nn.Linear(width, d_model, bias=False)
        with torch.no_grad():
            for projection in self.projections():
                projection.weight.mul_(node.init_scale)

    @property
    def out_proj(self) -> nn.Linear:
        return self.output  # what writes into the residual stream (Mixer's ``out_proj``)

    def projections(self) -> list[nn.Linear]:
        return [self.key, self.value, self.receptance, self.output]

    def _streams(self, x: Tensor, previous: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """x (B, L, d) -> the decay rate w and bonus u (C,), k, v (B, L, C) and σ(r) (B, L, C)."""
        shifted = self._shifted(x, previous)
        k = self.key(self._mixed(x, shifted, self.time_mix_key))
        v = self.value(self._mixed(x, shifted, self.time_mix_value))
        r = torch.sigmoid(self.receptance(self._mixed(x, shifted, self.time_mix_receptance)))
        return torch.exp(full_precision(self.time_decay)), full_precision(self.time_first), k, v, r

    def forward(self, x: Tensor, mode: str | None = None) -> Tensor:
        return self._mixed_output(self._checked_mode(mode), *self._streams(x))

    def _mixed_output(self, mode: str, w: Tensor, u: Tensor, k: Tensor, v: Tensor, r: Tensor) -> Tensor:
        """W_o (σ(r) ⊙ WKV(k, v)) with WKV computed in ``mode``: (B, L, C) streams -> (B, L, d_model)."""
        out = wkv.wkv_chunk(w, u, k, v, self.chunk_size) if mode == "chunk" else \
            wkv.wkv_quadratic(w, u, k, v) if mode == "quadratic" else wkv.wkv_recurrent(w, u, k, v)[0]
        return self.output(r * out)

    # -- decoding: the WKV state (numerator, denominator, maximum) and the last input
    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Nothing seen: the WKV state (batch, width) x 3 (float32 at least) and the last input (batch, d_model)."""
        wide = torch.promote_types(dtype, torch.float32)
        return wkv.initial_state(batch, self.width, wide, device) + (
            torch.zeros(batch, self.d_model, dtype=dtype, device=device),)

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        w, u, k, v, r = self._streams(x)
        return self._mixed_output(self.mode, w, u, k, v, r), wkv.final_state(w, k, v) + (x[:, -1],)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        w, u, k, v, r = self._streams(x_t.unsqueeze(1), state[3])
        out, new = wkv.wkv_step(w, u, k[:, 0], v[:, 0], state[:3])
        return self.output(r[:, 0] * out.to(r.dtype)), new + (x_t.to(state[3].dtype),)


@register("mixer", "rwkv_channel")
class RwkvChannelMixer(_TokenShift, Mixer):
    """(B, L, d_model) -> (B, L, d_model): σ(W_r r_t) ⊙ W_v ReLU(W_k k_t)² over the token-shifted inputs."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        self.time_mix_key = nn.Parameter(_mix_init(d_model))
        self.time_mix_receptance = nn.Parameter(_mix_init(d_model))
        self.key = nn.Linear(d_model, node.hidden, bias=False)
        self.receptance = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(node.hidden, d_model, bias=False)
        with torch.no_grad():
            for projection in self.projections():
                projection.weight.mul_(node.init_scale)

    @property
    def out_proj(self) -> nn.Linear:
        return self.value

    def projections(self) -> list[nn.Linear]:
        return [self.key, self.receptance, self.value]

    def _mix(self, x: Tensor, previous: Tensor | None = None) -> Tensor:
        shifted = self._shifted(x, previous)
        hidden = F.relu(self.key(self._mixed(x, shifted, self.time_mix_key))).square()
        return torch.sigmoid(self.receptance(self._mixed(x, shifted, self.time_mix_receptance))) * self.value(hidden)

    def forward(self, x: Tensor, mode: str | None = None) -> Tensor:
        self._checked_mode(mode)
        return self._mix(x)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Nothing seen: the last input (batch, d_model), zeros."""
        return (torch.zeros(batch, self.d_model, dtype=dtype, device=device),)

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        return self._mix(x), (x[:, -1],)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        return self._mix(x_t.unsqueeze(1), state[0])[:, 0], (x_t.to(state[0].dtype),)
