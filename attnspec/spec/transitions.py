"""State transitions a_t (a slot): none, fixed, data-controlled, Mamba's; real or complex, per head or
per channel."""

from __future__ import annotations

from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component, Count, PositiveFloat


class TransitionComponent(Component):
    """A diagonal state transition a_t, real or complex, per head or per key channel."""

    no_weight_decay: ClassVar[bool] = True  # GateLoop sec. 7.2 trains its transition projections without decay

    def problems(self) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this transition alone, as (path below it, message)."""
        return iter(())

    @property
    def is_complex(self) -> bool:
        return False

    @property
    def per_channel(self) -> bool:
        return False

    @property
    def scales_input(self) -> bool:
        """Whether the step scales what is written by Δ_t (Mamba2's ``scale_input``)."""
        return False






UnitRange = Annotated[list[Annotated[float, Field(gt=0, lt=1)]], Field(min_length=2, max_length=2)]
"""[lo, hi] with 0 < lo <= hi < 1."""
PhaseRange = Annotated[list[Annotated[float, Field(ge=-4, le=4)]], Field(min_length=2, max_length=2)]
"""[lo, hi] in radians, within [-4, 4]."""


def _range_problems(magnitude, phase, is_complex: bool) -> Iterator[tuple[tuple, str]]:
    """Initialisation ranges must be ordered; a phase range needs a complex transition."""
    for name, value in (("magnitude_init", magnitude), ("phase_init", phase)):
        if value is not None and value[0] > value[1]:
            yield (name,), f"{name} is [lo, hi] with lo <= hi, got [{value[0]}, {value[1]}]"
    if phase is not None and not is_complex:
        yield ("phase_init",), "phase_init only applies to a complex transition (`complex: true`); remove it"


class NoTransition(TransitionComponent):
    """a_t = 1: plain (causal) linear attention."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


class FixedTransition(TransitionComponent):
    """A learnable but input-independent diagonal transition (RetNet, LRU, S4D-Lin)."""

    kind: Literal["fixed"]
    init: Literal["retnet", "lru", "s4d_lin", "alibi"] = "retnet"
    """`retnet`: |a| = 1 - 2^(-5-i); `lru`: |a| = exp(-exp(nu)) uniform in [0.9, 0.999];
    `s4d_lin`: ZOH discretisation of -1/2 + i pi k with a log-uniform step in [1e-3, 1e-1];
    `alibi`: |a_h| = exp(-m_h) with ALiBi's slopes m_h = 2^(-8 (h + 1) / H) (MiniMax's lightning
    attention), one per head."""
    complex: bool = False
    """Complex transition (magnitude and phase) or real (magnitude only)."""
    per: Literal["head", "channel"] = "head"
    """One transition per head, or one per key channel."""
    magnitude_init: UnitRange | None = None
    """Override the recipe's magnitudes: |a| of channel c of C is lo + (hi - lo) c / (C - 1)."""
    phase_init: PhaseRange | None = None
    """Override the recipe's phases (complex only): theta of channel c spread the same way over [lo, hi]."""
    learnable: bool = True
    """Train the transition (a parameter), or keep it as initialised (a buffer: MiniMax's decays)."""

    @property
    def is_complex(self) -> bool:
        return self.complex

    def problems(self) -> Iterator[tuple[tuple, str]]:
        yield from _range_problems(self.magnitude_init, self.phase_init, self.is_complex)
        if self.init == "alibi" and (self.per_channel or self.complex):
            yield ("init",), ("`alibi` gives one real decay per head (ALiBi's slopes); use `per: head` and "
                              "`complex: false`, or another init")

    @property
    def per_channel(self) -> bool:
        return self.per == "channel"


class DataTransition(TransitionComponent):
    """GateLoop: a_t = f(W_gamma x_t) * exp(i g(W_theta x_t)), data-controlled."""

    kind: Literal["data"]
    magnitude: Literal["sigmoid", "stable_exp"] = "sigmoid"
    """Magnitude activation f: sigmoid (the paper) or exp(-exp(x)) (LRU-style)."""
    phase: Literal["identity", "none"] = "identity"
    """Phase activation g: identity gives a complex transition, none a real one."""
    per: Literal["head", "channel"] = "channel"
    """One transition per head, or one per key channel."""
    magnitude_init: UnitRange = Field(default_factory=lambda: [0.9, 0.999])
    """|a| at zero input, spread over the channels (lo + (hi - lo) c / (C - 1) for channel c of C) by
    the bias of W_gamma. The default keeps the state alive over ~10-1000 steps at initialisation:
    with PyTorch's default bias, mean |a| is about 0.5 and nothing survives from a key to its query
    (associative recall stays at chance). GateLoop learns to close the gate where it must forget."""
    phase_init: PhaseRange = Field(default_factory=lambda: [0.0, 0.1])
    """theta at zero input (radians, the bias of W_theta), spread over the channels the same way;
    small phases start the complex transition near a real decay, as RetNet's 10000^(-c/n) does."""
    lr_multiplier: ClassVar[float] = 0.8  # GateLoop sec. 7.2: transition lr 1e-4 vs base 1.25e-4

    @property
    def is_complex(self) -> bool:
        return self.phase != "none"

    def problems(self) -> Iterator[tuple[tuple, str]]:
        yield from _range_problems(self.magnitude_init, self.phase_init if self.is_complex else None, True)

    @property
    def per_channel(self) -> bool:
        return self.per == "channel"


InitRange = Annotated[list[PositiveFloat], Field(min_length=2, max_length=2)]


class MambaTransition(TransitionComponent):
    """Mamba's gate: a_t = exp(-exp(A_log) Δ_t) with the step Δ_t = softplus(W_Δ x_t + dt_bias), real,
    per head (Mamba2, Gated DeltaNet) or per key channel (KDA). With `scale_input` the step also
    scales what is written to the state (Mamba2's Δ_t x_t: k_t is multiplied by Δ_t)."""

    kind: Literal["mamba"]
    per: Literal["head", "channel"] = "head"
    """One gate per head, or one per key channel."""
    a_init: InitRange = Field(default_factory=lambda: [1.0, 16.0])
    """Range of A = exp(A_log) at initialisation, uniform (Mamba2: [1, 16])."""
    dt_init: InitRange = Field(default_factory=lambda: [0.001, 0.1])
    """Range of Δ = softplus(dt_bias) at zero input, log-uniform (Mamba2: [0.001, 0.1], floored at 1e-4)."""
    shared_a: bool = False
    """One A per head, shared by the head's channels, with Δ per channel (Kimi Linear's A_log); needs
    `per: channel`."""
    rank: Count(limits.MAX_HEAD_WIDTH) | None = None
    """A low-rank W_Δ = W_up W_down of this inner width (KDA's gate projection); full rank when unset."""
    scale_input: bool = False
    """Multiply the written input by Δ_t (Mamba2's discretisation, with the D skip taking x_t unscaled)."""
    dt_min: Annotated[float, Field(ge=0, le=1e4)] | None = None
    """Δ_t clamped below at this value after the softplus (Mamba2's `time_step_limit[0]`; Nemotron-H
    clamps at its `time_step_min`). Unset: no clamp."""
    dt_max: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """Δ_t clamped above at this value (`time_step_limit[1]`). Unset: no clamp."""

    @property
    def per_channel(self) -> bool:
        return self.per == "channel"

    @property
    def scales_input(self) -> bool:
        return self.scale_input

    def problems(self) -> Iterator[tuple[tuple, str]]:
        for name in ("a_init", "dt_init"):
            low, high = getattr(self, name)
            if low > high:
                yield (name,), f"{name} is a range [low, high]; got low {low} above high {high}"
        if self.dt_min is not None and self.dt_max is not None and self.dt_min > self.dt_max:
            yield ("dt_min",), f"dt_min {self.dt_min} is above dt_max {self.dt_max}"
        if self.shared_a and not self.per_channel:
            yield ("shared_a",), "shared_a shares one A among a head's channels: it needs `per: channel`"
        if self.scale_input and self.per_channel:
            yield ("scale_input",), "scale_input multiplies the input by one Δ_t per head (Mamba2); use `per: head`"


Transition = declare("transition", NoTransition, FixedTransition, DataTransition, MambaTransition,
                     base=TransitionComponent)


__all__ = ["TransitionComponent", "UnitRange", "PhaseRange", "NoTransition", "FixedTransition", "DataTransition",
           "InitRange", "MambaTransition", "Transition"]
