"""Sequence mixers built from IR nodes: ``linear``, ``softmax``, ``scatterbrain`` and ``delta``.

Every mixer maps ``x`` of shape (B, L, d_model) to (B, L, d_model). ``forward(x, mode=None)``
runs the whole sequence in ``self.mode`` (set by the compiler's plan) or the given mode.
``self.backend`` (the plan's too) names what runs the mode where a family has kernels.
Mixers with a recurrent form (``has_step``) also provide ``init_state(batch)`` and
``step(x_t, state, position)`` for one-token decoding, with the state as a tuple of plain
tensors so the step can be exported.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.errors import ShapeError
from attnspec.nn.positions import build_position
from attnspec.nn.registry import build, register
from attnspec.ops.delta import delta_rule, delta_step
from attnspec.ops.linear import Decay, PairState, combine_decays, linear_attention, recurrent_step
from attnspec.ops.scatterbrain import scatterbrain_attention
from attnspec.ops.softmax import empty_cache, softmax_attention, softmax_step


def _full_precision(t: Tensor) -> Tensor:
    """bf16/fp16 activations (under autocast) enter the attention kernels as float32: the projections
    run in half precision, the sums over positions and the normaliser in float32."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _autocast_dtype(t: Tensor) -> Tensor:
    """``t`` in the autocast dtype when autocast is on for its device, else unchanged. Feature maps run
    in float32 (:func:`_full_precision`); the attention op then takes its inputs in the training
    dtype because it accumulates states, decays and normalisers in float32 itself, and its Triton
    kernels read half the bytes and multiply on tensor cores."""
    device = t.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return t.to(torch.get_autocast_dtype(device))
    return t


class Mixer(nn.Module):
    """Common parts: q/k/v/output projections, the position scheme (rotary q/k or a decay), short
    convolutions, output gate and per-head output norm. The modes and whether there is a decoding
    step are the IR node's facts (``node.modes()``, ``node.has_step``)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__()
        self.kind = node.kind
        self.modes: tuple[str, ...] = node.modes()
        self.reference_mode = node.reference_mode  # what verification holds the other modes to
        self.has_step = node.has_step
        self.heads, self.d_qk, self.d_v = node.heads, node.d_qk, node.d_v
        self.causal, self.scale, self.max_len, self.d_model = node.causal, node.scale, max_len, d_model
        self.chunk_size = node.chunk_size
        self.mode = node.mode if node.mode != "auto" else self.modes[0]
        self.backend = "graph"  # what runs the mode: the plan's choice (Model.set_modes), the graph path until then
        # heads of distinct queries, keys and values: `qk_groups` share q and k, `kv_heads` k and v by groups of heads
        self.q_heads, self.k_heads, self.v_heads = node.query_heads, node.key_heads, node.value_heads
        bias = node.qkv_bias
        self.q_proj = nn.Linear(d_model, self.q_heads * self.d_qk, bias=bias)
        self.k_proj = nn.Linear(d_model, self.k_heads * self.d_qk, bias=bias)
        self.v_proj = nn.Linear(d_model, self.v_heads * self.d_v, bias=bias)
        # RMSNorm of each q and k head before positions (Qwen3's q_norm/k_norm: one weight shared by the heads)
        self.qk_norm = nn.ParameterDict({"q": nn.Parameter(torch.ones(self.d_qk)),
                                         "k": nn.Parameter(torch.ones(self.d_qk))}) if node.qk_norm != "none" else None
        self.cache_capacity = node.cache_capacity(max_len)  # positions a key/value decoding cache holds, or None
        self.window = getattr(node, "window", None)  # softmax attention's sliding window
        self.out_proj = nn.Linear(self.heads * self.d_v, d_model, bias=node.out_bias)
        self.gate = nn.Linear(d_model, self.heads * self.d_v, bias=bias) if node.output_gate != "none" else None
        self.gate_kind = node.output_gate
        norm_width = self.d_v if node.shared_norm_weight else self.heads * self.d_v
        self.norm_weight = nn.Parameter(torch.ones(norm_width)) if node.group_norm else None
        self.norm_eps, self.gate_before_norm = node.norm_eps, node.gate_before_norm
        self.D = nn.Parameter(torch.ones(self.heads)) if node.skip else None  # Mamba2's skip, D v_t
        self.init_scale = node.init_scale
        with torch.no_grad():  # `init_scale` multiplies PyTorch's default initialisation
            for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj, self.gate):
                if projection is not None:
                    projection.weight.mul_(node.init_scale)
        self.position = build_position(node.position, heads=self.heads, d_qk=self.d_qk, d_model=d_model,
                                       max_len=max_len)
        self.conv = build("conv", node.conv, channels={"x": d_model, "q": self.q_heads * self.d_qk,
                                                        "k": self.k_heads * self.d_qk, "v": self.v_heads * self.d_v})

    def projections(self) -> list[nn.Linear]:
        """The linear maps from and to the model width (the spec's ``init.projection_std`` draws them);
        ``out_proj`` writes into the residual stream."""
        found = [self.q_proj, self.k_proj, self.v_proj, self.gate, getattr(self, "beta_proj", None), self.out_proj]
        return [projection for projection in found if projection is not None]

    def state_size(self, length: int) -> int:
        """Numbers one sequence carries from its past at ``length``: the decoding state of a mixer
        with a recurrent form, else the keys and values of the positions it attends to
        (``min(length, window) * kv_heads * (d_qk + d_v)``)."""
        if self.has_step and self.cache_capacity is None:
            return sum(t.numel() for t in self.init_state(1))
        seen = min(length, self.cache_capacity or length)
        return seen * (self.k_heads * self.d_qk + self.v_heads * self.d_v)

    def _backend_for(self, mode: str) -> str:
        """The plan's backend for the planned mode; any other mode a caller asks for takes the graph path."""
        return self.backend if mode == self.mode else "graph"

    def _checked_mode(self, mode: str | None) -> str:
        """``mode`` (or the planned ``self.mode`` when None), refused unless this mixer has it."""
        if mode is None:
            return self.mode
        if mode not in self.modes:
            raise ShapeError(f"a {self.kind} mixer runs in {', '.join(self.modes)}, not in mode {mode!r}")
        return mode

    def _heads(self, y: Tensor, width: int, heads: int | None = None, expand: bool = True) -> Tensor:
        """(B, L, heads * width) -> (B, heads, L, width), then, with ``expand``, shared heads repeated to
        (B, H, L, width): a group's head serves H / heads consecutive heads (head h reads group
        h // (H / heads), as Mamba2's B and C and grouped-query attention's keys and values)."""
        B, L = y.shape[:2]
        y = y.view(B, L, heads or self.heads, width).transpose(1, 2)
        return self._expand(y) if expand else y

    def _normalized(self, t: Tensor, name: str) -> Tensor:
        """``qk_norm``: RMSNorm over each head's channels with the stream's weight (eps ``norm_eps``)."""
        if self.qk_norm is None:
            return t
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.qk_norm[name].to(t.dtype)

    def _project(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None,
                 expand: bool = True) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
        """q, k (B, H, L, d_qk) normalised (``qk_norm``) and rotated at positions offset.., v (B, H, L, d_v),
        and the convolutions' new state (one tensor per stream; ``conv_state`` continues a sequence,
        None starts one). ``expand=False`` leaves shared keys and values at their own head counts."""
        past = dict(zip(self.conv.widths, conv_state)) if conv_state is not None else {}
        new_state = {}
        x, new_state["x"] = self.conv("x", x, past.get("x"))
        streams = {}
        for name, projection in (("q", self.q_proj), ("k", self.k_proj), ("v", self.v_proj)):
            streams[name], new_state[name] = self.conv(name, projection(x), past.get(name))
        q, k, v = (_full_precision(streams[name]) for name in ("q", "k", "v"))
        q = self._normalized(self._heads(q, self.d_qk, self.q_heads), "q")
        k = self._normalized(self._heads(k, self.d_qk, self.k_heads, expand), "k")
        q, k = self.position.rotate(q, k, offset)
        return q, k, self._heads(v, self.d_v, self.v_heads, expand), tuple(new_state[name] for name in self.conv.widths)

    def _decay(self, x: Tensor) -> Decay | None:
        """The transition's decay joined with the position scheme's (ALiBi), in full precision."""
        decay = combine_decays(self.transition(x), self.position.decay(x))
        if decay is None:
            return None
        return Decay(_full_precision(decay.log_mag), None if decay.phase is None else _full_precision(decay.phase))

    def _output(self, o: Tensor, x: Tensor, v: Tensor | None = None) -> Tensor:
        """The output stages: D skip (needs the values ``v``), per-head RMS norm, merge heads, output gate
        (or the gate then a norm per q/k group: ``gate_before_norm``), output projection:
        o, v (B, H, L, Dv), x (B, L, d_model) -> (B, L, d_model)."""
        if self.D is not None:
            o = o + self.D.to(o.dtype).view(1, -1, 1, 1) * v
        normalize_heads = self.norm_weight is not None and not self.gate_before_norm
        if normalize_heads:
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        B, H, L, Dv = o.shape
        o = o.transpose(1, 2).reshape(B, L, H * Dv)
        if normalize_heads:  # a shared weight (Dv,) repeats over the heads
            o = o * (self.norm_weight if self.norm_weight.shape[0] == H * Dv else self.norm_weight.repeat(H))
        if self.gate is not None:
            g = self.gate(x)
            o = o * (torch.sigmoid(g) if self.gate_kind == "sigmoid" else F.silu(g))
        if self.gate_before_norm:  # Mamba2: RMSNorm(y silu(z)) over each group of H / qk_groups heads
            groups = o.view(B, L, self.q_heads, -1)
            o = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.norm_eps)).view(B, L, H * Dv)
            o = o * self.norm_weight
        return self.out_proj(o)

    def _expand(self, t: Tensor) -> Tensor:
        """Shared heads (B, heads, ...) repeated to (B, H, ...) (see :meth:`_heads`)."""
        return t if t.shape[1] == self.heads else t.repeat_interleave(self.heads // t.shape[1], dim=1)

    def _softmax_attention(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Softmax attention with the mixer's (real, per-head) decay as log-bias and its window, and the
        values: (B, L, d) -> (B, H, L, Dv) twice. Shared keys and values stay shared (GQA)."""
        q, k, v, _ = self._project(x, expand=False)
        decay = self._decay(x)
        log_a = None if decay is None else decay.log_mag[..., 0]
        o = softmax_attention(q, k, v, log_a, causal=self.causal, scale=self.scale, window=self.window)
        return o, self._expand(v)

    # -- prefill: a prompt in one pass, and the state the step continues from
    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x (B, L, d_model) -> (y (B, L, d_model), the decoding state after position L - 1). This default
        steps through the positions; the families build the state from their full-sequence mode."""
        state = self.init_state(x.shape[0], x.dtype, x.device)
        outputs = []
        for t in range(x.shape[1]):
            y, state = self.step(x[:, t], state, torch.full((x.shape[0],), t, dtype=torch.long, device=x.device))
            outputs.append(y)
        return torch.stack(outputs, 1), state

    # -- decoding by recomputing the prefix (causal mixers with neither a recurrent form nor a cache)
    def _init_prefix(self, batch: int, dtype: torch.dtype, device) -> tuple[Tensor, ...]:
        """The mixer's inputs so far: (batch, max_len, d_model), zeros where nothing is written yet."""
        return (torch.zeros(batch, self.max_len, self.d_model, dtype=dtype, device=device),)

    def _prefix_prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt; the state holds its inputs."""
        inputs = torch.zeros(x.shape[0], self.max_len, self.d_model, dtype=x.dtype, device=x.device)
        return self.forward(x), (torch.cat([x, inputs[:, x.shape[1]:]], dim=1),)

    def _prefix_step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Write ``x_t`` (B, d_model) at ``position`` (B,) and run the planned mode over all max_len inputs:
        causal, the output there sees the written positions only. Exact, O(a full pass) per token."""
        if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and int(position.max()) >= self.max_len:
            raise ShapeError(f"decoding keeps max_len = {self.max_len} inputs; position {int(position.max())} is "
                             "past it (raise max_len)")
        B = x_t.shape[0]
        where = position.view(B, 1, 1).expand(B, 1, self.d_model)
        inputs = state[0].scatter(1, where, x_t.unsqueeze(1).to(state[0].dtype))
        return self.forward(inputs).gather(1, where)[:, 0], (inputs,)

    # -- decoding through a key/value cache (softmax attention and the exp kernel)
    def _init_cache(self, batch: int, dtype: torch.dtype, device) -> tuple[Tensor, ...]:
        """Empty cache: keys (batch, kv heads, C, d_qk), values (batch, kv heads, C, d_v), decay bias
        (batch, H, C), then one (batch, w - 1, C) tensor per convolved stream; C = :attr:`cache_capacity`."""
        cache = empty_cache(batch, self.heads, self.k_heads, self.v_heads, self.cache_capacity, self.d_qk, self.d_v,
                            dtype, device)
        return cache + self.conv.init_state(batch, dtype, device)

    def _cache_prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Softmax attention over the prompt (planned mode), and the cache of its last C positions: slot
        p % C holds position p's key and value, and the decay bias sum_{s=p+1..L-1} log a_s (a suffix sum,
        accurate however long the prompt)."""
        q, k, v, conv_state = self._project(x, expand=False)
        decay = self._decay(x)
        log_a = None if decay is None else decay.log_mag[..., 0]
        o = softmax_attention(q, k, v, log_a, causal=self.causal, scale=self.scale, window=self.window)
        keys, values, bias = self._init_cache(x.shape[0], x.dtype, x.device)[:3]
        L, C = x.shape[1], self.cache_capacity
        kept = min(L, C)
        slots = torch.arange(L - kept, L, device=x.device) % C
        keys = keys.index_copy(2, slots, k[:, :, L - kept:].to(keys.dtype))
        values = values.index_copy(2, slots, v[:, :, L - kept:].to(values.dtype))
        if log_a is not None:
            suffix = torch.flip(torch.cumsum(torch.flip(log_a, [-1]), -1), [-1])  # sum_{s=p..L-1} log a_s
            after = torch.cat([suffix[..., 1:], torch.zeros_like(suffix[..., :1])], -1)  # sum_{s=p+1..L-1}
            bias = bias.index_copy(2, slots, after[..., L - kept:].to(bias.dtype))
        return self._output(o, x, self._expand(v)), (keys, values, bias) + conv_state

    def _cache_step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token through the cache: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t (B, d_model), new state)."""
        if self.window is None and not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) \
                and int(position.max()) >= self.cache_capacity:
            raise ShapeError(f"full softmax attention caches max_len = {self.cache_capacity} positions; position "
                             f"{int(position.max())} is past it (raise max_len, or give the mixer a `window`)")
        x = x_t.unsqueeze(1)
        q, k, v, conv_state = self._project(x, position, state[3:], expand=False)
        decay = self._decay(x)
        log_a = None if decay is None else decay.log_mag[:, :, 0, 0]
        o, cache = softmax_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], state[:3], position, log_a=log_a, scale=self.scale)
        y = self._output(o.unsqueeze(2), x, self._expand(v))
        return y[:, 0], cache + conv_state

    def regularization_loss(self) -> Tensor | None:
        return None


@register("mixer", "linear")
class LinearMixer(Mixer):
    """The gated linear family: feature map, cos re-weighting, transition, normaliser (DESIGN sec. 4)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        self.softmax_kernel = node.softmax_kernel  # exp features: computed as softmax attention
        self.features = build("feature_map", node.feature_map, dim=self.d_qk, heads=self.heads, scale=self.scale,
                              seed=seed)
        self.feature_scale = 1.0 if node.feature_map.consumes_scale else self.scale
        self.reweighting = build("reweighting", node.reweighting)
        self.transition = build("transition", node.transition, d_model=d_model, heads=self.heads, d_qk=self.d_qk)
        self.normalize, self.eps = node.normalize, node.eps
        self.state_width = node.feature_map.width(self.d_qk) * node.reweighting.width_factor

    # -- shared by forward and step
    def _prepare(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None):
        """q~, k~ (B, H, L, m), v (B, H, L, Dv), Decay or None, the per-query log scale of the kernel
        (B, H, L) or None, and the convolutions' new state, for positions offset .. offset+L-1."""
        q, k, v, conv_state = self._project(x, offset, conv_state)
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

    def forward(self, x: Tensor, mode: str | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        if self.softmax_kernel:
            o, v = self._softmax_attention(x)
            return self._output(o, x, v)
        q, k, v, decay, log_scale, _ = self._prepare(x)
        q, k, v = _autocast_dtype(q), _autocast_dtype(k), _autocast_dtype(v)
        o = linear_attention(q, k, v, decay, causal=self.causal, normalize=self.normalize, eps=self.eps,
                             log_scale=log_scale, mode=mode, chunk_size=self.chunk_size, backend=self._backend_for(mode),
                             max_length=self.max_len if self.causal else None)
        return self._output(o, x, v)

    # -- decoding
    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt, and its final state in the step's layout."""
        if self.softmax_kernel:
            return self._cache_prefill(x)
        q, k, v, decay, log_scale, conv_state = self._prepare(x)
        q, k, v = _autocast_dtype(q), _autocast_dtype(k), _autocast_dtype(v)
        o, final = linear_attention(q, k, v, decay, causal=True, normalize=self.normalize, eps=self.eps,
                                    log_scale=log_scale, mode=self.mode, chunk_size=self.chunk_size,
                                    backend=self.backend, max_length=self.max_len, return_state=True)
        if self.normalize:  # the step keeps the normaliser z as the state's last value column
            final = torch.cat([final[0], final[1].unsqueeze(-1)], dim=-1)
        pair = (final.real, final.imag) if final.is_complex() else (final,)
        return self._output(o, x, v), tuple(t.to(x.dtype) for t in pair) + conv_state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Zero state: (S_re,) or (S_re, S_im), each (batch, H, m, Dv [+1]), then one (batch, w - 1, C)
        tensor per convolved stream; exp features (softmax attention) keep a key/value cache instead."""
        if self.softmax_kernel:
            return self._init_cache(batch, dtype, device)
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


@register("mixer", "softmax")
class SoftmaxMixer(Mixer):
    """Softmax attention; a real per-head decay becomes an additive log-bias (GateLoop sec. 3.4)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        self.transition = build("transition", node.transition, d_model=d_model, heads=self.heads, d_qk=self.d_qk)

    def forward(self, x: Tensor, mode: str | None = None) -> Tensor:
        self._checked_mode(mode)
        o, v = self._softmax_attention(x)
        return self._output(o, x, v)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """The key/value cache (:meth:`Mixer._init_cache`)."""
        return self._init_cache(batch, dtype, device)

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Attention over the prompt and the cache it leaves (:meth:`Mixer._cache_prefill`)."""
        return self._cache_prefill(x)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token through the cache: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t (B, d_model), new state)."""
        return self._cache_step(x_t, state, position)


@register("mixer", "scatterbrain")
class ScatterbrainMixer(Mixer):
    """Low-rank (Performer or a linear feature map) plus an exact sparse correction on a support."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        features = node.lowrank.features()
        self.features = build("feature_map", features, dim=self.d_qk, heads=self.heads, scale=self.scale, seed=seed)
        self.sqrt_scale = 1.0 if features.consumes_scale else math.sqrt(self.scale)
        self.sparse = build("sparse", node.sparse, d_qk=self.d_qk, seed=seed, causal=self.causal)
        self.eps = node.eps

    def forward(self, x: Tensor, mode: str | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        q, k, v, _ = self._project(x)
        q_features, log_scale = self.features(q * self.sqrt_scale, True)
        k_features, _ = self.features(k * self.sqrt_scale, False)
        o = scatterbrain_attention(q, k, v, q_features, k_features, self.sparse(q, k), q_log_scale=log_scale,
                                   causal=self.causal, scale=self.scale, eps=self.eps, mode=mode,
                                   chunk_size=self.chunk_size, max_length=self.max_len if self.causal else None)
        return self._output(o, x, v)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """The inputs so far (:meth:`Mixer._init_prefix`): the sparse support needs every earlier key."""
        return self._init_prefix(batch, dtype, device)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token by recomputing the prefix: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t, new state)."""
        return self._prefix_step(x_t, state, position)

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt; the state holds its inputs (:meth:`Mixer._prefix_prefill`)."""
        return self._prefix_prefill(x)

    def regularization_loss(self) -> Tensor | None:
        return self.features.regularization_loss()


@register("mixer", "delta")
class DeltaMixer(Mixer):
    """The delta rule (DeltaNet, Gated DeltaNet, KDA) on unit-norm q and k; see the IR's DeltaMixer."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        self.features = build("feature_map", node.feature_map, dim=self.d_qk, heads=self.heads, scale=self.scale,
                              seed=seed)
        self.beta_scale = 2.0 if node.beta == "2sigmoid" else 1.0
        self.beta_proj = nn.Linear(d_model, self.heads, bias=False)
        self.transition = build("transition", node.transition, d_model=d_model, heads=self.heads, d_qk=self.d_qk)

    def _inputs(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None):
        """q, k (B, H, L, d_qk) unit-norm, v (B, H, L, d_v), beta (B, H, L), log_a (B, H, L[, d_qk]) or None,
        and the convolutions' new state."""
        q, k, v, conv_state = self._project(x, offset, conv_state)
        q, k = self.features(q, True)[0], self.features(k, False)[0]
        beta = self.beta_scale * torch.sigmoid(_full_precision(self.beta_proj(x))).transpose(1, 2)
        decay = self._decay(x)
        log_a = None
        if decay is not None:  # (B, H, L, 1) per head -> (B, H, L); per channel (B, H, L, d_qk)
            log_a = decay.log_mag if self.transition.per_channel else decay.log_mag[..., 0]
        return q, k, v, beta, log_a, conv_state

    def forward(self, x: Tensor, mode: str | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        q, k, v, beta, log_a, _ = self._inputs(x)
        o = delta_rule(q, k, v, beta, log_a, mode=mode, scale=self.scale, chunk_size=self.chunk_size,
                       max_length=self.max_len)
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
