"""The gated short convolution (:class:`attnspec.spec.mixers.conv.GatedConvMixer` states it): W_in's three
streams, the causal depthwise convolution of b ⊙ x (:mod:`attnspec.nn.convs`, stream ``v``), the gate c."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents


@register("mixer", "gated_conv")
class GatedConvMixer(Mixer):
    """out = W_out (c ⊙ conv(b ⊙ x)) with [b, c, x] = W_in u: (B, L, d_model) -> (B, L, d_model)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        channels = node.d_v  # d_model unless the spec sets another width
        self.in_proj = nn.Linear(d_model, 3 * channels, bias=node.qkv_bias)  # rows: b | c | x
        self.conv = build("conv", node.conv, channels={"v": channels})
        self.out_proj = nn.Linear(channels, d_model, bias=node.out_bias)
        with torch.no_grad():
            for projection in (self.in_proj, self.out_proj):
                projection.weight.mul_(node.init_scale)

    def projections(self) -> list[nn.Linear]:
        return [self.in_proj, self.out_proj]

    def _mix(self, u: Tensor, state: Tensor | None, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        b, c, x = self.in_proj(u).chunk(3, dim=-1)
        h, state = self.conv("v", b * x, state, positions)
        return self.out_proj(c * h), state

    takes_documents = True

    def forward(self, u: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        self._checked_mode(mode)
        return self._mix(u, None, None if documents is None else documents.positions)[0]

    def prefill(self, u: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        y, state = self._mix(u, None)
        return y, (state,)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """The last width - 1 products b ⊙ x: (batch, width - 1, channels)."""
        return self.conv.init_state(batch, dtype, device)

    def step(self, u_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        y, new = self._mix(u_t.unsqueeze(1), state[0])
        return y[:, 0], (new,)
