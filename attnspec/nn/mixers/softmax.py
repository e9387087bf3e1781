"""Softmax attention: GQA, QK-norm, rotary or ALiBi positions, a real decay as additive log-bias, a
sliding window, a logit soft-cap, attention sinks and an output gate; decoded through a key/value cache (a ring buffer for a window)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnspec.nn.mixers.parts import KeyValueCache, ProjectedMixer
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents


@register("mixer", "softmax")
class SoftmaxMixer(KeyValueCache, ProjectedMixer):
    """Softmax attention; a real per-head decay becomes an additive log-bias (GateLoop sec. 3.4)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        self.window = node.window  # a sliding window: its cache is a ring buffer
        self.chunk = node.chunk  # chunked attention: its cache is a ring of one chunk
        self.softcap = node.softcap
        self.sinks = torch.nn.Parameter(torch.zeros(self.heads)) if node.sinks else None
        self.transition = build("transition", node.transition, d_model=self.d_in, heads=self.heads, d_qk=self.d_qk)

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        self._checked_mode(mode)
        o, v = self._softmax_attention(x, documents)
        return self._output(o, x, v)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        """The key/value cache (:meth:`KeyValueCache._init_cache`), of ``capacity`` positions if given."""
        return self._init_cache(batch, dtype, device, capacity)

    def prefill(self, x: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Attention over the prompt and the cache it leaves (:meth:`KeyValueCache._cache_prefill`)."""
        return self._cache_prefill(x, capacity)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token through the cache: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t (B, d_model), new state)."""
        return self._cache_step(x_t, state, position)
