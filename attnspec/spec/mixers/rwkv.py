"""RWKV-4's IR (Peng et al. 2023; transformers' `rwkv`): its time mixing (the WKV operator) and its channel mixing,
each a mixer, since each looks back one position (token shift)."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from attnspec.spec import limits
from attnspec.spec.family import BYTES, Cost
from attnspec.spec.nodes import Count
from attnspec.spec.mixers.base import MixerComponent

SHARED_FIELDS = ("heads", "kv_heads", "qk_groups", "qk_norm", "qk_norm_after_rope", "qkv_clip", "query_scale_beta",
                 "output_gate", "gate_per_head", "gate_rank", "group_norm", "norm_span", "norm_center",
                 "gate_before_norm", "shared_norm_weight", "skip", "qkv_bias", "out_bias", "conv", "norm_eps")
"""The attention families' fields, which neither RWKV mixer has."""


class RwkvMixer(MixerComponent):
    """RWKV-4's time mixing. From the block input x_t and the one before it (zeros before the first), per channel of
    `width`:

        k_t = W_k (μ_k x_t + (1 - μ_k) x_(t-1)),  v_t = W_v (μ_v x_t + ...),  r_t = σ(W_r (μ_r x_t + ...))
        wkv_t = (Σ_{i<t} e^{k_i - (t-1-i) w} v_i + e^{u + k_t} v_t) / (Σ_{i<t} e^{k_i - (t-1-i) w} + e^{u + k_t})
        out_t = W_o (r_t ⊙ wkv_t)

    with μ_k, μ_v, μ_r learnt per input channel (`time_mix_*`, the token shift), w = exp(time_decay) the channel's
    decay rate and u = time_first its bonus for the current position, both learnt. WKV is a member of the linear
    family in all but arithmetic: normalised linear attention with one key and one value per channel, the feature
    map exp, a query of ones, a decay e^{-w} and a diagonal term (e^{u + w} - 1) e^{k_t}; since e^{k_t} of a trained
    key overflows, its modes (:mod:`attnspec.ops.rwkv`) work in log space with a running maximum instead. Decoding
    keeps (numerator, denominator, maximum) per channel and the last input. Packed documents are not taken."""

    kind: Literal["rwkv"]
    not_applicable: ClassVar[tuple[str, ...]] = SHARED_FIELDS
    single_stream: ClassVar[str] = "RWKV's time mixing"
    width: Count(limits.MAX_INNER) | None = None
    """Channels of the keys, values and receptance (`attention_hidden_size`); unset: d_model."""

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "quadratic", "recurrent")

    def resolved_widths(self, d_model: int) -> dict[str, int]:
        return {"d_qk": 1, "d_v": 1, "width": self.width or d_model}

    def mode_costs(self, L: int) -> dict[str, Cost]:
        C, T = self.width or 1, self.chunk_size
        n = -(-L // T)
        state = 3 * C * BYTES
        return {"recurrent": Cost(macs=12 * L * C, bytes=8 * L * C * BYTES, state_bytes=state, sequential_steps=L),
                "quadratic": Cost(macs=4 * L * L * C, bytes=4 * L * L * C * BYTES, state_bytes=state,
                                  sequential_steps=6),
                "chunk": Cost(macs=4 * L * (T + n) * C, bytes=4 * L * (T + n) * C * BYTES, state_bytes=state,
                              sequential_steps=10)}

    @property
    def has_step(self) -> bool:
        return True

    def parts(self) -> list[tuple[str, str]]:
        return [("channels", str(self.width))] + [row for row in super().parts()[1:] if row[0] not in ("width",)]

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.d_qk not in (None, 1) or self.d_v not in (None, 1):
            yield ("d_qk",), "each WKV channel is its own key and value of one number: d_qk and d_v are 1"
        if self.chunk_size & (self.chunk_size - 1):
            yield ("chunk_size",), f"the chunk length must be a power of two, got {self.chunk_size}"

    def describe(self) -> str:
        return f"rwkv[width {self.width or 'd_model'}]"


class RwkvChannelMixer(MixerComponent):
    """RWKV-4's channel mixing, a mixer since it looks back one position (an RWKV layer is two attnspec blocks: its
    time mixing, then this, each with its own LayerNorm and residual):

        out_t = σ(W_r (μ_r x_t + (1 - μ_r) x_(t-1))) ⊙ W_v ReLU(W_k (μ_k x_t + (1 - μ_k) x_(t-1)))²

    with μ_k, μ_r learnt per channel, W_k of `hidden` outputs (`intermediate_size`). Its one mode is this (named
    `quadratic` as a windowed form, as the gated convolution's); decoding keeps the last input."""

    kind: Literal["rwkv_channel"]
    not_applicable: ClassVar[tuple[str, ...]] = SHARED_FIELDS
    single_stream: ClassVar[str] = "RWKV's channel mixing"
    hidden: Count(limits.MAX_INNER) | None = None
    """Width of W_k's output (`intermediate_size`); unset: 4 d_model."""

    def modes(self) -> tuple[str, ...]:
        return ("quadratic",)

    def resolved_widths(self, d_model: int) -> dict[str, int]:
        return {"d_qk": 1, "d_v": 1, "hidden": self.hidden or 4 * d_model}

    def mode_costs(self, L: int) -> dict[str, Cost]:
        # per position, W_k and W_v (hidden x d each) and W_r (d x d); d_model is not known here, so the maps are
        # counted per model channel (the cost ranks this family's one mode, and a block's sum, not absolute time)
        hidden = self.hidden or 1
        return {"quadratic": Cost(macs=3 * L * hidden, bytes=2 * L * hidden * BYTES, state_bytes=0,
                                  sequential_steps=3)}

    @property
    def has_step(self) -> bool:
        return True

    def parts(self) -> list[tuple[str, str]]:
        return [("hidden", str(self.hidden))] + [row for row in super().parts()[1:] if row[0] not in ("hidden",)]

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.d_qk not in (None, 1) or self.d_v not in (None, 1):
            yield ("d_qk",), "RWKV's channel mixing has no heads: leave d_qk and d_v unset"

    def describe(self) -> str:
        return f"rwkv_channel[hidden {self.hidden or '4 d_model'}]"


__all__ = ["RwkvChannelMixer", "RwkvMixer"]
