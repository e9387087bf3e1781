"""The gated linear family's IR: feature map, re-weighting, transition, normaliser."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec.components import SLOTS
from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs, NATIVE_CPU, TRITON, softmax_cost
from attnspec.spec.nodes import PositiveFloat
from attnspec.spec.features import Elu1Features, FeatureMap
from attnspec.spec.reweightings import NoReweighting, Reweighting
from attnspec.spec.transitions import NoTransition, Transition
from attnspec.spec.mixers.base import MixerComponent, _linear_family_costs, _softmax_decay_problems


class LinearMixer(MixerComponent):
    """The gated linear family: q~ = rho(t) phi(q), S_t = diag(a_t) S_(t-1) + k~_t^T v_t, y_t = Re(q~_t S_t)."""

    projects_input: ClassVar[bool] = True
    kind: Literal["linear"]
    feature_map: FeatureMap = Field(default_factory=lambda: Elu1Features(kind="elu1"))
    reweighting: Reweighting = Field(default_factory=lambda: NoReweighting(kind="none"))
    transition: Transition = Field(default_factory=lambda: NoTransition(kind="none"))
    normalize: bool = True
    """Divide by the same recurrence run on k~ alone (needs a non-negative feature map)."""
    eps: PositiveFloat = 1e-6
    """Lower clamp of the normaliser."""
    value_activation: Literal["none", "silu"] = "none"
    """An activation of the values, after their projection and convolution (MiniMax's SiLU on q, k and v:
    `feature_map: silu` with `value_activation: silu`)."""

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "recurrent", "scan", "quadratic") if self.feature_map.finite else ("quadratic",)

    @property
    def scales_input(self) -> bool:
        return not self.softmax_kernel

    def mode_costs(self, L: int) -> dict[str, Cost]:
        if self.softmax_kernel:
            return {"quadratic": softmax_cost(L, self.heads, self.d_qk, self.d_v)}
        return _linear_family_costs(self, L, self.d_v + (1 if self.normalize else 0), self.transition)

    def backends(self, mode: str) -> tuple[Backend, ...]:
        return (TRITON, NATIVE_CPU, GRAPH) if mode == "chunk" else (GRAPH,)

    def kernel_inputs(self, mode: str) -> KernelInputs:
        decay = "none" if self.transition.is_identity else "channel" if self.transition.per_channel else "head"
        return KernelInputs(mode, self.causal, decay, self.feature_width())

    def mode_problem(self, mode: str) -> str:
        return (f"{self.feature_map.kind} features (the softmax kernel) have no finite feature expansion, so the "
                f"mixer can only be computed quadratically; mode '{mode}' is impossible: use `mode: quadratic` or "
                "`auto`, or a finite feature map such as performer")

    @property
    def has_step(self) -> bool:
        return self.causal  # exp features decode as softmax attention does, through a key/value cache

    @property
    def decode_mode(self) -> str | None:
        return None if not self.causal else "recurrent" if self.feature_map.finite else "cache"

    def cache_capacity(self, max_len: int) -> int | None:
        return max_len if self.causal and not self.feature_map.finite else None

    @property
    def softmax_kernel(self) -> bool:
        return not self.feature_map.finite

    def feature_width(self) -> int:
        return self.feature_map.width(self.d_qk) * self.reweighting.width_factor

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        fmap = self.feature_map
        if self.normalize and not fmap.non_negative:
            positive = sorted(kind for kind, cls in SLOTS["feature_map"].items() if cls.non_negative and cls.finite)
            yield ("feature_map",), (
                f"normalised linear attention divides by q~.z, which needs a non-negative feature map, but "
                f"'{fmap.kind}' features are signed; use one of {', '.join(positive)} "
                "or set `normalize: false` (as GateLoop does)")
        if not fmap.finite:
            yield from _softmax_decay_problems(self.transition)
            if not self.normalize:
                yield ("normalize",), ("exp features are the softmax kernel and are computed as softmax attention, "
                                       "which is normalised; set `normalize: true` (or use performer features)")
            if self.value_activation != "none":
                yield ("value_activation",), ("exp features are computed as softmax attention over the projected "
                                              "values; remove value_activation (or use a finite feature map)")
            if self.reweighting.width_factor != 1:
                yield ("reweighting",), (f"{self.reweighting.kind} re-weighting needs finite features; with exp "
                                         "features use `reweighting: none`, or relu/performer features")
        for below, message in fmap.problems(d_qk):
            yield ("feature_map", *below), message
        for below, message in self.reweighting.problems(causal=self.causal, max_len=max_len):
            yield ("reweighting", *below), message

    def describe(self) -> str:
        parts = [f"linear[{self.feature_map.kind}"]
        if self.reweighting.kind != "none":
            parts.append(self.reweighting.kind)
        if not self.transition.is_identity:
            parts.append(f"{self.transition.kind} transition")
        return ", ".join(parts) + f"] {self.on_heads()}"
