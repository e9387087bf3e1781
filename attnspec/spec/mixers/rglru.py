"""The RG-LRU recurrent block's IR (Griffin and Hawk, De et al. 2024; RecurrentGemma's recurrent layers)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.channel import Activation
from attnspec.spec.convs import Conv, ShortConv
from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs, NATIVE_CPU, TRITON, linear_costs
from attnspec.spec.nodes import Count
from attnspec.spec.transitions import UnitRange
from attnspec.spec.mixers.base import MixerComponent


class RglruMixer(MixerComponent):
    """Griffin's recurrent block around the Real-Gated Linear Recurrent Unit. Per channel of `width`:

        y_t = act(W_y u_t),   x_t = conv(W_x u_t)
        i_t = sigmoid(W_i x_t + b_i),   r_t = sigmoid(W_a x_t + b_a)    (block-diagonal: one block per head)
        log a_t = -gate_scale r_t softplus(Λ)
        h_t = a_t ⊙ h_(t-1) + sqrt(1 - a_t²) ⊙ (i_t ⊙ x_t)          (the sqrt is 1 at position 0)
        out_t = W_out (h_t ⊙ y_t)

    Each channel is gated linear attention with one key and one value (d_qk = d_v = 1) and a decay of its
    own: the modes are the linear family's ops on `width` such heads. Its decoding state is h and the
    convolution's last width - 1 inputs. `qkv_bias` puts biases on W_x and W_y, `out_bias` on W_out
    (RecurrentGemma has both)."""

    kind: Literal["rglru"]
    not_applicable: ClassVar[tuple[str, ...]] = ("kv_heads", "qk_groups", "qk_norm", "qk_norm_after_rope", "qkv_clip",
                                                 "query_scale_beta", "output_gate", "gate_per_head", "group_norm",
                                                 "norm_span", "norm_center", "gate_before_norm", "shared_norm_weight",
                                                 "skip", "gate_rank")
    single_stream: ClassVar[str] = "the RG-LRU"
    width: Count(limits.MAX_INNER) | None = None
    """Channels of the recurrence (RecurrentGemma's `lru_width`); unset: d_model. `heads` divides it into
    the gates' blocks."""
    gate_scale: Annotated[float, Field(gt=0, le=100)] = 8.0
    """c in log a_t = -c r_t softplus(Λ) (the paper's 8)."""
    a_init: UnitRange = Field(default_factory=lambda: [0.9, 0.999])
    """Range of a^c = exp(-c softplus(Λ)) at initialisation, uniform in a^2 as Griffin draws it."""
    activation: Activation = "gelu_tanh"
    """Of the multiplicative branch y."""
    conv: Conv = Field(default_factory=lambda: ShortConv(kind="short", projections=["v"], bias=True))
    """The causal depthwise convolution of x (`projections: [v]`), or `none`."""

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "recurrent", "scan", "quadratic")

    indivisible: ClassVar[str] = "so the gate blocks cannot split its channels equally; choose heads dividing it"

    def resolved_widths(self, d_model: int) -> dict[str, int] | None:
        if self.width is None and d_model % self.heads:  # an explicit width is checked in problems()
            return None
        return {"d_qk": 1, "d_v": 1, "width": self.width or d_model}

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return linear_costs(L, self.width or 1, 1, 1, self.chunk_size, False, False)

    def backends(self, mode: str) -> tuple[Backend, ...]:
        return (TRITON, NATIVE_CPU, GRAPH) if mode == "chunk" else (GRAPH,)

    def kernel_inputs(self, mode: str) -> KernelInputs:
        return KernelInputs(mode, self.causal, "head", 1)

    @property
    def has_step(self) -> bool:
        return True

    def parts(self) -> list[tuple[str, str]]:
        rows = [("channels", f"{self.width} in {self.heads} gate blocks")]
        return rows + [row for row in super().parts()[1:] if row[0] not in ("scale", "width")]

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.width is not None and self.width % self.heads:
            yield ("heads",), f"{self.heads} gate blocks cannot divide width {self.width} equally"
        if self.d_qk not in (None, 1) or self.d_v not in (None, 1):
            yield ("d_qk",), "each RG-LRU channel is its own state of one number: d_qk and d_v are 1"
        low, high = self.a_init
        if low > high:
            yield ("a_init",), f"a_init is [lo, hi] with lo <= hi, got [{low}, {high}]"

    def describe(self) -> str:
        return f"rglru[width {self.width or 'd_model'}] {self.on_heads()}"


__all__ = ["RglruMixer"]
