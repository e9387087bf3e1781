"""No sequence mixer (``mixer: none``): the block skips its mixer sub-layer (:class:`attnspec.nn.model.Block`
reads ``is_identity``); this module is what the plan, decoding and the state layout see of it."""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.nn.mixers.base import Mixer
from attnspec.nn.registry import register


@register("mixer", "none")
class NoMixer(Mixer):
    """Nothing: its output is zero, its decoding state empty, and it has no weights (no ``out_proj``)."""

    is_identity = True

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents=None) -> Tensor:
        self._checked_mode(mode)
        return torch.zeros_like(x)

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        return torch.zeros_like(x), ()

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        return ()

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        return torch.zeros_like(x_t), ()
