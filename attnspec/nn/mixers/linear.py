"""The gated linear family (DESIGN sec. 4): feature map, cos re-weighting, transition and normaliser, in
every mode of :func:`attnspec.ops.linear.linear_attention`, decoded through its recurrent state (or,
for exp features, computed and decoded as softmax attention with a key/value cache)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.nn.mixers.base import autocast_dtype
from attnspec.nn.mixers.parts import KeyValueCache, ProjectedMixer
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents
from attnspec.ops.linear import Decay, PairState, linear_attention, recurrent_step


@register("mixer", "linear")
class LinearMixer(KeyValueCache, ProjectedMixer):
    """The gated linear family: feature map, cos re-weighting, transition, normaliser (DESIGN sec. 4)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        self.softmax_kernel = node.softmax_kernel  # exp features: computed as softmax attention, cached to decode
        self.window = self.softcap = self.sinks = None
        self.features = build("feature_map", node.feature_map, dim=self.d_qk, heads=self.heads, scale=self.scale,
                              seed=seed)
        self.feature_scale = 1.0 if node.feature_map.consumes_scale else self.scale
        self.reweighting = build("reweighting", node.reweighting)
        self.transition = build("transition", node.transition, d_model=self.d_in, heads=self.heads, d_qk=self.d_qk)
        self.normalize, self.eps = node.normalize, node.eps
        self.value_activation = node.value_activation
        self.state_width = node.feature_map.width(self.d_qk) * node.reweighting.width_factor

    # -- shared by forward and step
    def _prepare(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None,
                 documents: Documents | None = None):
        """q~, k~ (B, H, L, m), v (B, H, L, Dv), Decay or None, the per-query log scale of the kernel
        (B, H, L) or None, and the convolutions' new state, for positions offset .. offset+L-1 (or the
        packed ``documents``' positions)."""
        q, k, v, conv_state = self._project(x, offset, conv_state, documents=documents)
        offset = offset if documents is None else documents.positions
        if self.value_activation == "silu":
            v = F.silu(v)
        q, log_scale = self.features(q, True)
        k, _ = self.features(k, False)
        if log_scale is not None and not self.normalize:  # the un-normalised estimate needs its true scale
            q, log_scale = q * torch.exp(log_scale).unsqueeze(-1), None
        # cosFormer's positions are 1-based (offset + 1 ..), the position schemes' 0-based
        q, k = self.reweighting(q, k, offset)
        step = self.transition.input_scale(x)  # Mamba2's Δ_t on what is written: Δ_t k_t v_tᵀ
        if step is not None:
            k = k * step.to(k.dtype)
        return q * self.feature_scale, k, v, self._decay(x), log_scale, conv_state

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        if self.softmax_kernel:
            o, _, v = self._softmax_attention(x, documents)
            return self._output(o, x, v)
        q, k, v, decay, log_scale, _ = self._prepare(x, documents=documents)
        q, k, v = autocast_dtype(q), autocast_dtype(k), autocast_dtype(v)
        backend = self.kernel_for(mode, q, k, v, *(decay or ()))
        o = linear_attention(q, k, v, decay, causal=self.causal, normalize=self.normalize, eps=self.eps,
                             log_scale=log_scale, mode=mode, chunk_size=self.chunk_size, backend=backend,
                             max_length=self.max_len if self.causal else None,
                             starts=None if documents is None else documents.starts)
        return self._output(o, x, v)

    # -- decoding
    def prefill(self, x: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt, and its final state in the step's layout (exp features: the
        key/value cache, of ``capacity`` positions if given)."""
        if self.softmax_kernel:
            return self._cache_prefill(x, capacity)[:2]
        q, k, v, decay, log_scale, conv_state = self._prepare(x)
        q, k, v = autocast_dtype(q), autocast_dtype(k), autocast_dtype(v)
        o, final = linear_attention(q, k, v, decay, causal=True, normalize=self.normalize, eps=self.eps,
                                    log_scale=log_scale, mode=self.mode, chunk_size=self.chunk_size,
                                    backend=self.kernel_for(self.mode, q, k, v, *(decay or ())),
                                    max_length=self.max_len, return_state=True)
        if self.normalize:  # the step keeps the normaliser z as the state's last value column
            final = torch.cat([final[0], final[1].unsqueeze(-1)], dim=-1)
        pair = (final.real, final.imag) if final.is_complex() else (final,)
        return self._output(o, x, v), tuple(t.to(x.dtype) for t in pair) + conv_state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        """Zero state: (S_re,) or (S_re, S_im), each (batch, H, m, Dv [+1]), then one (batch, w - 1, C)
        tensor per convolved stream; exp features (softmax attention) keep a key/value cache instead (of
        ``capacity`` positions if given)."""
        if self.softmax_kernel:
            return self._init_cache(batch, dtype, device, capacity)
        width = self.d_v + (1 if self.normalize else 0)
        zeros = torch.zeros(batch, self.heads, self.state_width, width, dtype=dtype, device=device)
        pair = (zeros, zeros.clone()) if self.transition.is_complex else (zeros,)
        return pair + self.conv.init_state(batch, dtype, device)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token: ``x_t`` (B, d_model), ``position`` (B,) 0-based -> (y_t (B, d_model), new state)."""
        if self.softmax_kernel:
            return self._cache_step(x_t, state, position)
        x = x_t.unsqueeze(1)
        pairs = 2 if self.transition.is_complex else 1
        q, k, v, decay, log_scale, conv_state = self._prepare(x, position, state[pairs:])
        step_decay = None if decay is None else Decay(decay.log_mag[:, :, 0],
                                                      None if decay.phase is None else decay.phase[:, :, 0])
        pair = PairState(state[0], state[1] if pairs > 1 else None)
        o, pair = recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], step_decay, pair, normalize=self.normalize,
                                 eps=self.eps, log_scale=None if log_scale is None else log_scale[:, :, 0])
        y = self._output(o.unsqueeze(2), x, v)
        new_state = (pair.re,) if pair.im is None else (pair.re, pair.im)
        return y[:, 0], new_state + conv_state

    def regularization_loss(self) -> Tensor | None:
        return self.features.regularization_loss()
