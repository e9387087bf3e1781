"""The delta rule (DeltaNet, Gated DeltaNet, KDA) on unit-norm q and k, in every mode of
:func:`attnspec.ops.delta.delta_rule`, decoded through its recurrent state."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnspec.nn.mixers.base import full_precision
from attnspec.nn.mixers.parts import ProjectedMixer
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents
from attnspec.ops.delta import delta_rule, delta_step


@register("mixer", "delta")
class DeltaMixer(ProjectedMixer):
    """The delta rule (DeltaNet, Gated DeltaNet, KDA) on unit-norm q and k; see the IR's DeltaMixer."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        self.features = build("feature_map", node.feature_map, dim=self.d_qk, heads=self.heads, scale=self.scale,
                              seed=seed)
        self.beta_scale = 2.0 if node.beta == "2sigmoid" else 1.0
        self.beta_proj = nn.Linear(self.d_in, self.heads, bias=False)
        self.transition = build("transition", node.transition, d_model=self.d_in, heads=self.heads, d_qk=self.d_qk)

    def projections(self) -> list[nn.Linear]:
        """The projections, with beta's before the output projection (the order ``init`` draws them in)."""
        found = [self.q_proj, self.k_proj, self.v_proj, self.gate, self.beta_proj, self.out_proj]
        return [projection for projection in found if projection is not None]

    def _inputs(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None,
                documents: Documents | None = None):
        """q, k (B, H, L, d_qk) unit-norm, v (B, H, L, d_v), beta (B, H, L), log_a (B, H, L[, d_qk]) or None,
        and the convolutions' new state."""
        q, k, v, conv_state = self._project(x, offset, conv_state, documents=documents)
        q, k = self.features(q, True)[0], self.features(k, False)[0]
        beta = self.beta_scale * torch.sigmoid(full_precision(self.beta_proj(x))).transpose(1, 2)
        decay = self._decay(x)
        log_a = None
        if decay is not None:  # (B, H, L, 1) per head -> (B, H, L); per channel (B, H, L, d_qk)
            log_a = decay.log_mag if self.transition.per_channel else decay.log_mag[..., 0]
        return q, k, v, beta, log_a, conv_state

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        q, k, v, beta, log_a, _ = self._inputs(x, documents=documents)
        o = delta_rule(q, k, v, beta, log_a, mode=mode, scale=self.scale, chunk_size=self.chunk_size,
                       max_length=self.max_len, starts=None if documents is None else documents.starts)
        return self._output(o, x, v)

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt, and the delta state after it."""
        q, k, v, beta, log_a, conv_state = self._inputs(x)
        o, final = delta_rule(q, k, v, beta, log_a, mode=self.mode, scale=self.scale, chunk_size=self.chunk_size,
                              max_length=self.max_len, return_state=True)
        return self._output(o, x, v), (final.to(x.dtype),) + conv_state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Zero state: the delta state (batch, H, d_qk, d_v), then one (batch, w - 1, C) tensor per convolved stream."""
        zeros = torch.zeros(batch, self.heads, self.d_qk, self.d_v, dtype=dtype, device=device)
        return (zeros,) + self.conv.init_state(batch, dtype, device)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token: ``x_t`` (B, d_model), ``position`` (B,) 0-based -> (y_t (B, d_model), new state)."""
        x = x_t.unsqueeze(1)
        q, k, v, beta, log_a, conv_state = self._inputs(x, position, state[1:])
        o, delta_state = delta_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0],
                                    None if log_a is None else log_a[:, :, 0], state[0], scale=self.scale)
        y = self._output(o.unsqueeze(2), x, v)
        return y[:, 0], (delta_state,) + conv_state
