"""Scatterbrain: a low-rank part (Performer or linear features) plus an exact sparse correction on a
support, one joint normaliser (:func:`attnspec.ops.scatterbrain.scatterbrain_attention`); decoded by
rerunning over the inputs so far (the sparse support needs every earlier key)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.mixers.base import full_precision
from attnspec.nn.mixers.parts import PrefixRerun, ProjectedMixer
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents
from attnspec.ops.scatterbrain import scatterbrain_attention


@register("mixer", "scatterbrain")
class ScatterbrainMixer(PrefixRerun, ProjectedMixer):
    """Low-rank (Performer or a linear feature map) plus an exact sparse correction on a support."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        features = node.lowrank.features()
        self.features = build("feature_map", features, dim=self.d_qk, heads=self.heads, scale=self.scale, seed=seed)
        unscaled = features.consumes_scale or not getattr(node.lowrank, "scaled_inputs", True)
        self.sqrt_scale = 1.0 if unscaled else math.sqrt(self.scale)
        self.sparse = build("sparse", node.sparse, d_qk=self.d_qk, seed=seed, causal=self.causal)
        self.eps = node.eps
        # LoLCATs' window factors: a learnt weight per head on the exact terms (its logit; sigmoid is the weight)
        self.sparse_weight = nn.Parameter(torch.full((self.heads,), node.sparse_weight_init)) \
            if node.sparse_weight else None
        self.row_max = node.sparse_scale == "row_max"

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        q, k, v, _ = self._project(x, documents=documents)
        q_features, log_scale = self.features(q * self.sqrt_scale, True)
        k_features, _ = self.features(k * self.sqrt_scale, False)
        # what runs the low-rank part, on the features (the op widens half-precision inputs to float32
        # first, which the family's kernel_inputs state)
        backend = self.kernel_for(mode, q_features, k_features, v)
        o = scatterbrain_attention(q, k, v, q_features, k_features, self.sparse(q, k), q_log_scale=log_scale,
                                   causal=self.causal, scale=self.scale, eps=self.eps, mode=mode,
                                   chunk_size=self.chunk_size, max_length=self.max_len if self.causal else None,
                                   backend=backend, documents=documents, row_max=self.row_max,
                                   sparse_log_weight=None if self.sparse_weight is None
                                   else F.logsigmoid(full_precision(self.sparse_weight)))
        return self._output(o, x, v)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        """The inputs so far (:meth:`PrefixRerun._init_prefix`): the sparse support needs every earlier key."""
        return self._init_prefix(batch, dtype, device, capacity)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token by recomputing the prefix: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t, new state)."""
        return self._prefix_step(x_t, state, position)

    def prefill(self, x: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt; the state holds its inputs (:meth:`PrefixRerun._prefix_prefill`)."""
        return self._prefix_prefill(x, capacity)

    def regularization_loss(self) -> Tensor | None:
        return self.features.regularization_loss()
