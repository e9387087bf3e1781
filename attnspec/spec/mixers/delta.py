"""The delta rule's IR (DeltaNet, Gated DeltaNet, KDA): unit-norm q and k, beta, any real transition."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec.components import SLOTS
from attnspec.spec.family import Cost, delta_costs
from attnspec.spec.features import FeatureMap, L2NormFeatures
from attnspec.spec.transitions import NoTransition, Transition
from attnspec.spec.mixers.base import MixerComponent


class DeltaMixer(MixerComponent):
    """The delta rule: S_t = (I - beta_t k_t k_tᵀ) diag(a_t) S_(t-1) + beta_t k_t v_tᵀ, o_t = scale q_tᵀ S_t,
    with q and k of unit norm per head (`feature_map: l2norm`).

    DeltaNet has no transition; Gated DeltaNet a `mamba` transition per head; KDA one per key channel
    (any real transition works). beta_t = sigmoid(W_beta x_t), or 2 sigmoid (eigenvalues of
    I - beta k kᵀ down to -1: the state-tracking variant). Gated DeltaNet's output stage is
    `group_norm: true` with `output_gate: swish` (per-head RMSNorm, then the SiLU gate)."""

    projects_input: ClassVar[bool] = True
    kind: Literal["delta"]
    feature_map: FeatureMap = Field(default_factory=lambda: L2NormFeatures(kind="l2norm"))
    """Applied to q and k per head; it must give unit-norm keys (`l2norm`)."""
    transition: Transition = Field(default_factory=lambda: NoTransition(kind="none"))
    """The decay a_t: none (DeltaNet), `mamba` per head (Gated DeltaNet) or per channel (KDA), or any real one."""
    beta: Literal["sigmoid", "2sigmoid"] = "sigmoid"
    """The write strength: sigmoid (in [0, 1]) or 2 sigmoid (in [0, 2], negative eigenvalues)."""

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "recurrent", "quadratic")

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return delta_costs(L, self.heads, self.d_qk, self.d_v, self.chunk_size, self.transition.per_channel)

    @property
    def has_step(self) -> bool:
        return self.causal

    @property
    def softmax_temperature(self) -> bool:
        return True  # scale defaults to 1/sqrt(d_qk), as flash-linear-attention's delta-rule layers

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if not self.causal:
            yield ("causal",), "the delta rule is a recurrence in position order: it needs `causal: true`"
        if not self.feature_map.unit_norm:
            units = sorted(kind for kind, cls in SLOTS["feature_map"].items() if cls.unit_norm)
            yield ("feature_map",), (f"the delta rule's I - beta k kᵀ stays a contraction only for unit-norm keys, "
                                     f"but {self.feature_map.kind} features are not normalised; use "
                                     f"{' or '.join(units)}")
        if self.transition.is_complex:
            yield ("transition",), ("the delta rule's decay must be real; use a real transition (mamba, fixed with "
                                    "`complex: false`, data with `phase: none`)")
        for below, message in self.feature_map.problems(d_qk):
            yield ("feature_map", *below), message

    def describe(self) -> str:
        gate = "" if self.transition.is_identity else \
            f", {self.transition.kind} gate per {'channel' if self.transition.per_channel else 'head'}"
        return f"delta[beta {self.beta}{gate}] {self.on_heads()}"
