"""Mamba-1's IR: the selective state space model (Gu and Dao 2023), as Mamba, Falcon-Mamba and Jamba ship it."""

from __future__ import annotations

import math
from typing import ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.convs import Conv, ShortConv
from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs, NATIVE_CPU, TRITON, linear_costs
from attnspec.spec.nodes import Count
from attnspec.spec.transitions import InitRange
from attnspec.spec.mixers.base import MixerComponent

class MambaMixer(MixerComponent):
    """Mamba-1's selective scan. Per channel c of ``d_inner`` and position t, from the block input u_t:

        x_t, z_t = W_in u_t                               (d_inner each)
        x_t = silu(conv(x)_t)                             (a causal depthwise convolution, `conv`)
        Δ_t = softplus(W_Δ W_r x_t + dt_bias)            (per channel; W_r of rank `dt_rank`)
        B_t, C_t = W_B x_t, W_C x_t                       (width N = `d_qk`, shared by every channel)
        h_t[c] = exp(Δ_t[c] A[c]) ⊙ h_(t-1)[c] + Δ_t[c] x_t[c] B_t,   A = -exp(A_log) of (d_inner, N)
        y_t[c] = C_t · h_t[c] + D[c] x_t[c],   out_t = W_out (y_t ⊙ silu(z_t))

    Each channel is gated linear attention with one value (``d_v`` 1), keys Δ_t[c] B_t, queries C_t and
    a decay per key channel: the modes are the linear family's ops run on d_inner such heads. Its
    decoding state is h (d_inner x N) and the convolution's last width - 1 inputs."""

    kind: Literal["mamba"]
    not_applicable: ClassVar[tuple[str, ...]] = ("kv_heads", "qk_groups", "qk_norm", "qk_norm_after_rope", "qkv_clip",
                                                 "query_scale_beta", "output_gate", "gate_per_head", "group_norm",
                                                 "norm_span", "norm_center", "gate_before_norm", "shared_norm_weight",
                                                 "skip")
    """Its output gate silu(z) and D skip are fixed; the rest are the attention-like families' parts."""
    single_stream: ClassVar[str] = "Mamba's scan"
    d_inner: Count(limits.MAX_INNER) | None = None
    """Channels of the scan (Mamba's `intermediate_size`); unset: 2 d_model."""
    dt_rank: Count(limits.MAX_HEAD_WIDTH) | None = None
    """Rank of Δ's projection W_Δ W_r; unset: ceil(d_model / 16) (Mamba's `auto`)."""
    dt_init: InitRange = Field(default_factory=lambda: [0.001, 0.1])
    """Range of Δ = softplus(dt_bias) at zero input, log-uniform per channel (Mamba: [0.001, 0.1],
    floored at 1e-4). A starts at S4D-real, A[c, n] = -(n + 1)."""
    selection_norm: Literal["none", "rms", "rmsnorm"] = "none"
    """RMS-normalise the selection inputs (W_r x_t, B_t and C_t, each over its width, eps `norm_eps`):
    `rms` without a weight (Falcon-Mamba), `rmsnorm` with a learnt one each (Jamba)."""
    conv: Conv = Field(default_factory=lambda: ShortConv(kind="short", projections=["v"], activation="silu",
                                                         bias=True))
    """The causal depthwise convolution of x (`projections: [v]`, x being the values); `none` removes it."""

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "recurrent", "scan", "quadratic")

    def resolved_widths(self, d_model: int) -> dict[str, int]:
        """d_qk is the state width N (16 unset), d_v 1 (a channel's value), and d_inner and dt_rank
        are filled in."""
        return {"d_qk": self.d_qk or 16, "d_v": 1, "d_inner": self.d_inner or 2 * d_model,
                "dt_rank": self.dt_rank or math.ceil(d_model / 16)}

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return linear_costs(L, self.d_inner or 1, self.d_qk or 16, 1, self.chunk_size, True, False)

    def backends(self, mode: str) -> tuple[Backend, ...]:
        return (TRITON, NATIVE_CPU, GRAPH) if mode == "chunk" else (GRAPH,)

    def kernel_inputs(self, mode: str) -> KernelInputs:
        return KernelInputs(mode, self.causal, "channel", self.d_qk or 16)

    @property
    def has_step(self) -> bool:
        return True

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.heads != 1:
            yield ("heads",), ("a mamba mixer has one state per channel, not heads: set its width with `d_inner` "
                               "and remove `heads`")
        if self.d_v not in (None, 1):
            yield ("d_v",), f"each of a mamba mixer's d_inner channels holds one value: d_v is 1, got {self.d_v}"

    def parts(self) -> list[tuple[str, str]]:
        rows = [("channels", f"{self.d_inner} (state {self.d_qk}, Δ rank {self.dt_rank})")]
        return rows + [row for row in super().parts()[1:] if row[0] not in ("scale", "d_inner", "dt_rank")]

    def describe(self) -> str:
        norm = "" if self.selection_norm == "none" else f", {self.selection_norm} on Δ B C"
        return f"mamba[state {self.d_qk or 16}{norm}] on {self.d_inner or '2 d_model'} channels"


__all__ = ["MambaMixer"]
