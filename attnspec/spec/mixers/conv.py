"""The gated short convolution's IR (LFM2's `conv` layers; the H3/Hyena-style operator at short width)."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec.convs import Conv, ShortConv
from attnspec.spec.family import BYTES, Cost
from attnspec.spec.mixers.base import MixerComponent


class GatedConvMixer(MixerComponent):
    """A gated short convolution. From the block input u_t, per channel:

        b_t, c_t, x_t = W_in u_t                  (d_v channels each; unset: d_model)
        h_t = conv(b ⊙ x)_t                       (causal depthwise, `conv.width` positions)
        out_t = W_out (c_t ⊙ h_t)

    Its one mode computes the windowed sum directly (a depthwise convolution, named `quadratic` as the
    windowed form of the other families is); its decoding state is the last width - 1 products b ⊙ x.
    `qkv_bias` and `out_bias` put biases on W_in and W_out (LFM2's `conv_bias` sets them and the
    convolution's together)."""

    kind: Literal["gated_conv"]
    not_applicable: ClassVar[tuple[str, ...]] = ("heads", "kv_heads", "qk_groups", "qk_norm", "qk_norm_after_rope",
                                                 "qkv_clip", "query_scale_beta", "output_gate", "gate_per_head",
                                                 "group_norm", "norm_span", "norm_center", "gate_before_norm",
                                                 "shared_norm_weight", "skip")
    single_stream: ClassVar[str] = "a gated convolution"
    conv_optional: ClassVar[bool] = False
    conv: Conv = Field(default_factory=lambda: ShortConv(kind="short", width=3, projections=["v"]))
    """The causal depthwise convolution of b ⊙ x: `short` with `projections: [v]` (width, bias)."""

    def modes(self) -> tuple[str, ...]:
        return ("quadratic",)

    def resolved_widths(self, d_model: int) -> dict[str, int]:
        width = self.d_v or self.d_qk or d_model
        return {"d_qk": width, "d_v": width}

    def mode_costs(self, L: int) -> dict[str, Cost]:
        width, channels = self.conv.streams().get("v", 1), self.d_v or 1
        return {"quadratic": Cost(macs=L * channels * (width + 2), bytes=L * channels * 4 * BYTES,
                                  state_bytes=channels * (width - 1) * BYTES, sequential_steps=2)}

    @property
    def has_step(self) -> bool:
        return True

    def parts(self) -> list[tuple[str, str]]:
        return [(name, text) for name, text in super().parts() if name not in ("heads", "scale")]

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.d_qk is not None and self.d_v is not None and self.d_qk != self.d_v:
            yield ("d_qk",), "a gated convolution has one width, its channels `d_v`: leave d_qk unset or equal"

    def describe(self) -> str:
        return f"gated_conv[width {self.conv.streams().get('v', '?')}]"


__all__ = ["GatedConvMixer"]
