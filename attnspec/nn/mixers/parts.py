"""The parts mixer families opt into, so that each family's module reads top to bottom and no shared code
reads another family's fields:

- :class:`ProjectedMixer`: what attention-like families share (linear, softmax, Scatterbrain, delta):
  q/k/v projections with grouped heads and ``qk_norm``, the position scheme (rotary q/k or a decay),
  short convolutions, and the output stages (D skip, per-head norm, output gate, output projection);
- :class:`KeyValueCache`: softmax attention over the keys and values, and decoding through a
  key/value cache of ``cache_capacity`` positions (a ring buffer for a ``window``): the family sets
  ``self.window`` and ``self.softcap``;
- :class:`PrefixRerun`: decoding by keeping the inputs so far and rerunning the mixer over them
  (a family whose exact form needs every earlier key, as Scatterbrain's sparse support).

A family with a recurrent state writes its own ``init_state``/``step``/``prefill``; the parts above
are chosen by the family's ``decode_mode`` (the IR's fact) in its class definition.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer, check_position_held, check_prompt_fits, full_precision, positions_held
from attnspec.nn.positions import build_position, positions
from attnspec.nn.registry import build
from attnspec.ops.documents import Documents, same_document
from attnspec.ops.linear import Decay, combine_decays
from attnspec.ops.softmax import cache_of, empty_cache, softmax_attention, softmax_step


class ProjectedMixer(Mixer):
    """Common parts: q/k/v/output projections, the position scheme (rotary q/k or a decay), short
    convolutions, output gate and per-head output norm (created in this order, before the family's
    own parts: the order draws the random initialisation)."""

    float32_parameters = ("D",)
    """Kept in float32 in a bfloat16 or float16 model (:func:`attnspec.nn.model.cast_parameters`): Mamba2's
    skip D adds to the kernels' float32 output."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        d_in = self.d_in
        # heads of distinct queries, keys and values: `qk_groups` share q and k, `kv_heads` k and v by groups of heads
        self.q_heads, self.k_heads, self.v_heads = node.query_heads, node.key_heads, node.value_heads
        bias, self.qkv_clip = node.qkv_bias, node.qkv_clip
        self.query_scale = (node.query_scale_beta, node.query_scale_period, node.query_scale_offset) \
            if node.query_scale_beta else None
        self.q_proj = nn.Linear(d_in, self.q_heads * self.d_qk, bias=bias)
        # an attention reading another block's keys and values (`kv_from`) projects queries alone
        projects_kv = getattr(node, "projects_kv", True)
        self.borrows_kv = not projects_kv
        self.k_proj = nn.Linear(d_in, self.k_heads * self.d_qk, bias=bias) if projects_kv else None
        # values from the key projection (`values_from_keys`): no projection of their own
        self.v_proj = nn.Linear(d_in, self.v_heads * self.d_v, bias=bias) \
            if getattr(node, "projects_values", projects_kv) else None
        self.v_norm = getattr(node, "v_norm", False)  # each value head RMS-normalised, no weight (Gemma 3n/4)
        # RMSNorm of each q and k head before positions (Qwen3's q_norm/k_norm: one weight shared by the heads)
        # (`rmsnorm_full`: OLMo's, over the whole projection, a weight per channel of it; `layernorm`:
        # Persimmon's, centred and with a bias; `qk_norm_after_rope`: Hunyuan V1's, after the rotation)
        self.qk_norm_full = node.qk_norm == "rmsnorm_full"
        self.qk_norm_after_rope = node.qk_norm_after_rope
        widths = (self.q_heads * self.d_qk, self.k_heads * self.d_qk) if self.qk_norm_full else (self.d_qk, self.d_qk)
        normed = "qk" if projects_kv else "q"
        self.qk_norm = nn.ParameterDict({name: nn.Parameter(torch.ones(width)) for name, width in zip(normed, widths)}
                                        ) if node.qk_norm not in ("none", "rmsnorm_unweighted") else None
        self.qk_norm_unweighted = node.qk_norm == "rmsnorm_unweighted"
        self.qk_norm_bias = nn.ParameterDict({name: nn.Parameter(torch.zeros(self.d_qk)) for name in normed}
                                             ) if node.qk_norm == "layernorm" else None
        self.cache_capacity = node.cache_capacity(max_len)  # positions a key/value decoding cache holds, or None
        self.out_proj = nn.Linear(self.heads * self.d_v, d_model, bias=node.out_bias)
        gated = node.output_gate != "none"
        # a low-rank gate W_b W_a (`gate_rank`): gate_down is W_a, gate W_b
        self.gate_down = nn.Linear(d_in, node.gate_rank, bias=False) if gated and node.gate_rank else None
        gate_width = self.heads if node.gate_per_head else self.heads * self.d_v  # Laguna's: one value per head
        self.gate = nn.Linear(node.gate_rank or d_in, gate_width, bias=bias) if gated else None
        self.gate_kind = node.output_gate
        norm_width = self.d_v if node.shared_norm_weight else self.heads * self.d_v
        self.norm_weight = nn.Parameter(torch.ones(norm_width)) if node.group_norm else None
        self.norm_eps, self.gate_before_norm = node.norm_eps, node.gate_before_norm
        # the output norm's groups of channels: each head's, each q/k group's heads (Falcon-H1), or all (MiniMax)
        self.norm_groups = {"head": None, "group": node.query_heads, "full": 1}[node.norm_span]
        self.norm_center = node.norm_center  # a LayerNorm: the mean subtracted first (xLSTM)
        self.D = nn.Parameter(torch.ones(self.heads)) if node.skip else None  # Mamba2's skip, D v_t
        # output stages beyond the projection (they compute in float32 in a half-precision model)
        self.output_stages = self.D is not None or self.norm_weight is not None or self.gate is not None
        with torch.no_grad():  # `init_scale` multiplies PyTorch's default initialisation
            for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj, self.gate, self.gate_down):
                if projection is not None:
                    projection.weight.mul_(node.init_scale)
        self.position = build_position(node.position, heads=self.heads, d_qk=self.d_qk, d_model=d_model,
                                       max_len=max_len)
        self.conv = build("conv", node.conv, channels={"x": d_in, "q": self.q_heads * self.d_qk,
                                                        "k": self.k_heads * self.d_qk, "v": self.v_heads * self.d_v})

    def projections(self) -> list[nn.Linear]:
        """The linear maps from and to the model width (the spec's ``init.projection_std`` draws them);
        ``out_proj`` writes into the residual stream."""
        found = [self.q_proj, self.k_proj, self.v_proj, self.gate_down, self.gate, self.out_proj]
        return [projection for projection in found if projection is not None]

    def state_size(self, length: int) -> int:
        """Numbers one sequence carries from its past at ``length``: the decoding state of a mixer
        with a recurrent form, else the keys and values of the positions it attends to
        (``min(length, cache capacity) * kv_heads * (d_qk + d_v)``); none of its own for an attention reading
        another block's (`kv_from`)."""
        if self.borrows_kv:
            return 0
        if self.has_step and self.cache_capacity is None:
            return sum(t.numel() for t in self.init_state(1))
        seen = min(length, self.cache_capacity or length)
        return seen * (self.k_heads * self.d_qk + self.v_heads * self.d_v)

    def _heads(self, y: Tensor, width: int, heads: int | None = None, expand: bool = True) -> Tensor:
        """(B, L, heads * width) -> (B, heads, L, width), then, with ``expand``, shared heads repeated to
        (B, H, L, width): a group's head serves H / heads consecutive heads (head h reads group
        h // (H / heads), as Mamba2's B and C and grouped-query attention's keys and values)."""
        B, L = y.shape[:2]
        y = y.view(B, L, heads or self.heads, width).transpose(1, 2)
        return self._expand(y) if expand else y

    def _clipped(self, t: Tensor) -> Tensor:
        """A projection's output clamped to [-qkv_clip, qkv_clip] (DBRX), or as it is."""
        return t if self.qkv_clip is None else t.clamp(-self.qkv_clip, self.qkv_clip)

    def _normalized(self, t: Tensor | None, name: str, full: bool = False) -> Tensor | None:
        """``qk_norm``: RMSNorm over each head's channels with the stream's weight (eps ``norm_eps``), or
        for ``rmsnorm_full`` over the whole projection (B, L, heads * d_qk), called with ``full``; for
        ``layernorm`` the mean is subtracted first and the stream's bias added last (None: no keys, `kv_from`)."""
        if t is None:
            return None
        if self.qk_norm_unweighted and not full:
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        if self.qk_norm is None or full != self.qk_norm_full:
            return t
        if self.qk_norm_bias is not None:
            t = t - t.mean(-1, keepdim=True)
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.qk_norm[name].to(t.dtype)
        return t if self.qk_norm_bias is None else t + self.qk_norm_bias[name].to(t.dtype)

    def _project(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None,
                 expand: bool = True, documents: Documents | None = None, widen_values: bool = True
                 ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
        """q, k (B, H, L, d_qk) normalised (``qk_norm``) and rotated at positions offset.. (or rotated, then
        normalised: ``qk_norm_after_rope``), v (B, H, L, d_v) (k and v None for an attention without their
        projections: `kv_from`),
        and the convolutions' new state (one tensor per stream; ``conv_state`` continues a sequence,
        None starts one); in full precision (a half-precision model's widened), but v in the projection's
        dtype where not ``widen_values``. ``expand=False`` leaves shared keys and values at their own head
        counts. ``documents``: packed documents, whose positions restart at each (rotary positions,
        convolutions)."""
        past = dict(zip(self.conv.widths, conv_state)) if conv_state is not None else {}
        restart = None if documents is None else documents.positions
        offset = offset if restart is None else restart
        new_state = {}

        def convolved(name: str, t: Tensor) -> Tensor:  # a stream without a filter is not handed to the module
            if name not in self.conv.widths:  # (a module call is microseconds a layer in a decoding step)
                return t
            t, new_state[name] = self.conv(name, t, past.get(name), restart)
            return t

        x = convolved("x", x)
        streams = {name: convolved(name, self._clipped(projection(x)))
                   for name, projection in (("q", self.q_proj), ("k", self.k_proj), ("v", self.v_proj))
                   if projection is not None}
        if self.v_proj is None and self.k_proj is not None:  # `values_from_keys`: the keys' projection, as it is
            streams["v"] = streams["k"]
        q, k = (full_precision(streams[name]) if name in streams else None for name in "qk")
        v = streams.get("v")
        v = full_precision(v) if widen_values and v is not None else v
        q, k = self._normalized(q, "q", full=True), self._normalized(k, "k", full=True)
        q = self._heads(q, self.d_qk, self.q_heads)
        k = None if k is None else self._heads(k, self.d_qk, self.k_heads, expand)
        if not self.qk_norm_after_rope:
            q, k = self._normalized(q, "q"), self._normalized(k, "k")
        q, k = self.position.rotate(q, k, offset)
        if self.qk_norm_after_rope:
            q, k = self._normalized(q, "q"), self._normalized(k, "k")
        if self.query_scale is not None:  # Llama 4's: 1 + β ln(1 + floor((t + offset) / period)), (1 or B, 1, L, 1)
            beta, period, shift = self.query_scale
            t = positions(q.shape[2], offset, q.device, torch.float64) + shift
            scale = 1 + beta * torch.log1p(torch.floor(t / period))
            q = q * (scale.view(1, 1, -1, 1) if scale.dim() == 1 else scale.unsqueeze(1).unsqueeze(-1)).to(q.dtype)
        v = None if v is None else self._heads(v, self.d_v, self.v_heads, expand)
        if self.v_norm and v is not None:  # in float32 in a half-precision model, as transformers' norm
            wide = full_precision(v)
            v = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.norm_eps)).to(v.dtype)
        return q, k, v, tuple(new_state[name] for name in self.conv.widths)

    def _decay(self, x: Tensor) -> Decay | None:
        """The transition's decay joined with the position scheme's (ALiBi), in full precision."""
        decay = combine_decays(self.transition(x) if self.transition.decays else None, self.position.decay(x))
        if decay is None:
            return None
        return Decay(full_precision(decay.log_mag), None if decay.phase is None else full_precision(decay.phase))

    def _output(self, o: Tensor, x: Tensor, v: Tensor | None = None) -> Tensor:
        """The output stages: D skip (needs the values ``v``), per-head RMS norm (or one per q/k group of
        heads, or over the whole width: ``norm_span``), merge heads, output gate (or the gate then a norm per
        q/k group: ``gate_before_norm``), output projection:
        o (B, H, L, Dv), v (B, H or H_v, L, Dv), x (B, L, d_model) -> (B, L, d_model)."""
        if self.D is not None:  # shared value heads repeated here only: no other stage reads the values
            o = o + self.D.to(o.dtype).view(1, -1, 1, 1) * self._expand(v)
        normalize_heads = self.norm_weight is not None and not self.gate_before_norm
        if normalize_heads and self.norm_groups is None:
            o = self._rms_normalized(o)
        B, H, L, Dv = o.shape
        o = o.transpose(1, 2).reshape(B, L, H * Dv)
        if normalize_heads and self.norm_groups is not None:
            o = self._rms_normalized(o.view(B, L, self.norm_groups, -1)).view(B, L, H * Dv)
        if normalize_heads:  # a shared weight (Dv,) repeats over the heads
            o = o * (self.norm_weight if self.norm_weight.shape[0] == H * Dv else self.norm_weight.repeat(H))
        if self.gate is not None:
            g = self.gate(x if self.gate_down is None else self.gate_down(x))
            g = {"sigmoid": torch.sigmoid, "swish": F.silu, "softplus": F.softplus}[self.gate_kind](g)
            o = o * g if g.shape[-1] == o.shape[-1] else (o.view(B, L, H, Dv) * g.unsqueeze(-1)).view(B, L, H * Dv)
        if self.gate_before_norm:  # Mamba2: RMSNorm(y silu(z)) over each group of H / qk_groups heads
            o = self._rms_normalized(o.view(B, L, self.q_heads, -1)).view(B, L, H * Dv) * self.norm_weight
        return self.out_proj(o.to(x.dtype))  # the kernels' float32 back to a half-precision model's dtype

    def _rms_normalized(self, o: Tensor) -> Tensor:
        """The output norm without its weight over the last axis: RMS, or with ``norm_center`` LayerNorm's."""
        if self.norm_center:
            o = o - o.mean(-1, keepdim=True)
        return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps)

    def _expand(self, t: Tensor) -> Tensor:
        """Shared heads (B, heads, ...) repeated to (B, H, ...) (see :meth:`_heads`)."""
        return t if t.shape[1] == self.heads else t.repeat_interleave(self.heads // t.shape[1], dim=1)



class KeyValueCache:
    """Softmax attention and decoding through a key/value cache, for a :class:`ProjectedMixer` family
    that sets ``self.window`` (None, or a sliding window served by a ring buffer), ``self.softcap`` (None, or
    a tanh soft-cap on the scores) and ``self.sinks`` (None, or a sink logit per head: a parameter (H,)), and
    may set ``self.chunk`` (attention within chunks of that many positions, served by a ring of one chunk)."""

    chunk: int | None = None

    def _chunk_mask(self, L: int, device, documents: Documents | None = None) -> Tensor | None:
        """(B or 1, 1, L, L) bool: pair (i, j) within one chunk (positions counted from each document's start where
        ``documents`` are packed), None without chunks."""
        if self.chunk is None:
            return None
        positions = documents.positions if documents is not None else torch.arange(L, device=device).view(1, L)
        chunks = torch.div(positions, self.chunk, rounding_mode="floor")
        return (chunks.unsqueeze(-1) == chunks.unsqueeze(-2)).unsqueeze(1)

    @staticmethod
    def _joined(*masks: Tensor | None) -> Tensor | None:
        """The pairs every given mask allows (None: no mask), broadcast to (B, 1, L, L)."""
        present = [m for m in masks if m is not None]
        if not present:
            return None
        joined = present[0]
        for mask in present[1:]:
            joined = joined & mask
        return joined

    def _softmax_attention(self, x: Tensor, documents: Documents | None = None,
                           kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Softmax attention with the mixer's (real, per-head) decay as log-bias and its window: x (B, L, d)
        -> (o (B, H, L, Dv), the keys (B, H_k, L, Dk) and values (B, H_v, L, Dv) it read). Shared keys and
        values stay shared (GQA). ``documents``: each position attends within its own document. ``kv``: the
        keys and values another block lent (`kv_from`), read in place of this mixer's own."""
        q, k, v, _ = self._project(x, expand=False, documents=documents)
        k, v = (k, v) if kv is None else kv
        decay = self._decay(x)
        log_a = None if decay is None else decay.log_mag[..., 0]
        mask = self._joined(None if documents is None else same_document(documents.ids),
                            self._chunk_mask(x.shape[1], x.device, documents))
        if mask is not None:  # (1 or B, 1, L, L) to (B, ...): expanded always, so no graph guards the batch
            mask = mask.expand(x.shape[0], -1, -1, -1)
        o = softmax_attention(q, k, v, log_a, causal=self.causal, scale=self.scale, window=self.window,
                              mask=mask, softcap=self.softcap, sinks=self.sinks)
        return o, k, v

    # -- decoding through a key/value cache (softmax attention and the exp kernel)
    def _cache_positions(self, capacity: int | None) -> int:
        """C, the slots of the cache: a window's ring holds the window; a full cache holds
        :attr:`cache_capacity` (``max_len``) positions, or ``capacity`` of them where given (a generation
        of n tokens after a prompt of T needs T + n: a cache sized to it is allocated, filled and read
        at that size, not at ``max_len``)."""
        ring = self.window is not None or self.chunk is not None
        return self.cache_capacity if ring else positions_held(self.cache_capacity, capacity)

    def _init_cache(self, batch: int, dtype: torch.dtype, device, capacity: int | None = None) -> tuple[Tensor, ...]:
        """Empty cache: keys (batch, kv heads, C, d_qk), values (batch, kv heads, C, d_v), decay bias
        (batch, H, C), then one (batch, w - 1, C) tensor per convolved stream; C = :meth:`_cache_positions`.
        An attention reading another block's cache (`kv_from`) keeps only its own decay bias (where it has a
        decay: its positions' ALiBi or its transition's, which the lender's keys do not carry) and convolutions."""
        if self.borrows_kv:
            own = (torch.zeros(batch, self.heads, self._cache_positions(capacity), dtype=dtype, device=device),) \
                if self._decays else ()
            return own + self.conv.init_state(batch, dtype, device)
        cache = empty_cache(batch, self.heads, self.k_heads, self.v_heads, self._cache_positions(capacity), self.d_qk,
                            self.d_v, dtype, device)
        return cache + self.conv.init_state(batch, dtype, device)

    def _cache_prefill(self, x: Tensor, capacity: int | None = None, kv: tuple[Tensor, Tensor] | None = None
                       ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, Tensor] | None]:
        """Softmax attention over the prompt (planned mode), the cache of its last C positions
        (:meth:`_cache_positions`): slot p % C holds position p's key and value, and the decay bias
        sum_{s=p+1..L-1} log a_s (a suffix sum, accurate however long the prompt), and the keys and values
        (B, H_k, L, Dk), (B, H_v, L, Dv) for the blocks that read them (`lends_kv`). ``kv``: another block's,
        read in place of this mixer's own (`kv_from`): its cache is the lender's, so it keeps only its own
        decay bias (where it has a decay) beside its convolutions."""
        q, k, v, conv_state = self._project(x, expand=False)
        if kv is not None:
            k, v = kv
        decay = self._decay(x)
        log_a = None if decay is None else decay.log_mag[..., 0]
        mask = self._chunk_mask(x.shape[1], x.device)
        o = softmax_attention(q, k, v, log_a, causal=self.causal, scale=self.scale, window=self.window,
                              mask=None if mask is None else mask.expand(x.shape[0], -1, -1, -1), softcap=self.softcap,
                              sinks=self.sinks)
        C = self._cache_positions(capacity)
        if kv is not None:
            own = () if log_a is None else (self._cached_bias(log_a, C, x),)
            return self._output(o, x, v), own + conv_state, None
        if self.window is None and self.chunk is None:
            check_prompt_fits(x.shape[1], C)
        keys, values = cache_of(k, C).to(x.dtype), cache_of(v, C).to(x.dtype)
        if log_a is None:
            bias = torch.zeros(x.shape[0], self.heads, C, dtype=x.dtype, device=x.device)
        else:
            bias = self._cached_bias(log_a, C, x)
        return self._output(o, x, v), (keys, values, bias) + conv_state, (k, v)

    @property
    def _decays(self) -> bool:
        """Whether this attention has a decay (its transition's, or its positions': ALiBi)."""
        return bool(self.transition.decays) or self.position.decays

    @staticmethod
    def _cached_bias(log_a: Tensor, capacity: int, x: Tensor) -> Tensor:
        """The decay bias a cache of ``capacity`` slots holds after a prompt of log-decays ``log_a`` (B, H, L):
        slot p % C holds sum_{s=p+1..L-1} log a_s (a suffix sum, accurate however long the prompt): (B, H, C)."""
        suffix = torch.flip(torch.cumsum(torch.flip(log_a, [-1]), -1), [-1])  # sum_{s=p..L-1} log a_s
        after = torch.cat([suffix[..., 1:], torch.zeros_like(suffix[..., :1])], -1)  # sum_{s=p+1..L-1}
        return cache_of(after.unsqueeze(-1), capacity)[..., 0].to(x.dtype)

    def _cache_step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor,
                    kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token through the cache: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t (B, d_model), new state).
        ``kv``: another block's cache (keys, values), holding this position already (its lender stepped first):
        read, not written (`kv_from`); the state is then this attention's own decay bias (where it has a decay)
        and its convolutions'."""
        if kv is None:
            cache, conv_past = state[:3], state[3:]
        else:
            own = 1 if self._decays else 0
            cache, conv_past = kv + (state[0] if own else None,), state[own:]
        if self.window is None and self.chunk is None:  # a full cache: its capacity is its slots
            check_position_held(position, cache[0].shape[2], "full softmax attention", "give the mixer a `window`")
        x = x_t.unsqueeze(1)
        # The values only enter the cache, and the output comes out in the cache's dtype: widened to float32
        # only for a float32 cache (a prefilled one is the model's half dtype), and the output only for
        # stages that compute in float32. Equal to widening both always (bfloat16 widens exactly), with 4
        # conversions fewer per layer and token.
        q, k, v, conv_state = self._project(x, position, conv_past, expand=False, widen_values=False)
        v = v if v is None or v.dtype == cache[1].dtype else full_precision(v)
        decay = self._decay(x)
        log_a = None if decay is None else decay.log_mag[:, :, 0, 0]
        o, cache = softmax_step(q[:, :, 0], None if k is None else k[:, :, 0], None if v is None else v[:, :, 0],
                                cache, position, log_a=log_a, scale=self.scale, softcap=self.softcap, sinks=self.sinks,
                                chunked=self.chunk is not None)
        if self.output_stages:
            o = full_precision(o)
        y = self._output(o.unsqueeze(2), x, v)
        kept = cache if kv is None else cache[2:] if self._decays else ()
        return y[:, 0], kept + conv_state


class PrefixRerun:
    """Decoding by rerunning a :class:`ProjectedMixer` family's planned mode over the inputs so far."""

    # -- decoding by recomputing the prefix (causal mixers with neither a recurrent form nor a cache)
    def _init_prefix(self, batch: int, dtype: torch.dtype, device, capacity: int | None = None) -> tuple[Tensor, ...]:
        """The mixer's inputs so far: (batch, C, d_in), zeros where nothing is written yet
        (C: ``max_len``, or ``capacity``: :func:`positions_held`)."""
        return (torch.zeros(batch, positions_held(self.max_len, capacity), self.d_in, dtype=dtype, device=device),)

    def _prefix_prefill(self, x: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt; the state holds its inputs."""
        C = positions_held(self.max_len, capacity)
        check_prompt_fits(x.shape[1], C)
        return self.forward(x), (F.pad(x, (0, 0, 0, C - x.shape[1])),)

    def _prefix_step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Write ``x_t`` (B, d_model) at ``position`` (B,) in place and run the planned mode over all C kept
        inputs: causal, the output there sees the written positions only. Exact, O(a full pass) per token."""
        check_position_held(position, state[0].shape[1], "this mixer's decoding (its inputs kept)")
        B = x_t.shape[0]
        where = position.view(B, 1, 1)
        inputs = state[0].scatter_(1, where.expand(B, 1, self.d_in), x_t.unsqueeze(1).to(state[0].dtype))
        # (a half-precision model keeps its inputs in the float32 state: rounded back, they are x_t as it came)
        return self.forward(inputs.to(x_t.dtype)).gather(1, where.expand(B, 1, self.d_model))[:, 0], (inputs,)


__all__ = ["KeyValueCache", "PrefixRerun", "ProjectedMixer"]
