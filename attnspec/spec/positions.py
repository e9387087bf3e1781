"""Position schemes (a slot): none, learned, sinusoidal, rotary, ALiBi."""

from __future__ import annotations

from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec.components import declare
from attnspec.spec.nodes import Component


class PositionComponent(Component):
    """Position information. ``acts_on`` says where: added to the token embeddings (a model-level
    choice), rotating each mixer's q and k before the feature map, or a fixed decay that shares the
    transition's path. Written at the model level, a q/k or decay scheme applies to every mixer that
    does not name its own; written on a mixer, it applies to that mixer only."""

    acts_on: ClassVar[Literal["nothing", "embedding", "qk", "decay"]] = "nothing"
    no_weight_decay: ClassVar[bool] = True  # a position table is an embedding
    bounded: ClassVar[bool] = False
    """It holds max_len positions (a table), so decoding cannot go past them."""

    def problems(self, *, causal: bool, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this scheme inside a mixer, as (path below it, message)."""
        return iter(())


class NoPosition(PositionComponent):
    """No position information (the mixer may still order positions through its transition)."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


class LearnedPosition(PositionComponent):
    """A learned absolute position table (max_len x d_model) added to the token embeddings (GPT-2)."""

    kind: Literal["learned"]
    acts_on: ClassVar[str] = "embedding"
    bounded: ClassVar[bool] = True


class SinusoidalPosition(PositionComponent):
    """Fixed sinusoids sin/cos(t / base^(2i/d)) added to the token embeddings (Vaswani et al.)."""

    kind: Literal["sinusoidal"]
    base: Annotated[float, Field(gt=1, le=1e9)] = 10000.0
    acts_on: ClassVar[str] = "embedding"


class RotaryPosition(PositionComponent):
    """RoPE: rotate pairs (i, i + d/2) of q and k by t / base^(2i/d) before the feature map, so a
    softmax score depends on the offset between positions. Decoding rotates at the cache position."""

    kind: Literal["rope"]
    base: Annotated[float, Field(gt=1, le=1e9)] = 10000.0
    """The frequency base (transformers' `rope_theta`)."""
    rotary_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Rotate only the first fraction of each head's channels, r = fraction * d_qk of them, pairs
    (i, i + r/2) by t / base^(2i/r) (Qwen3-Next: 0.25); the rest pass unrotated."""
    acts_on: ClassVar[str] = "qk"

    def rotary_width(self, d_qk: int) -> int:
        """How many channels of a d_qk-wide head are rotated."""
        return int(d_qk * self.rotary_fraction)

    def problems(self, *, causal: bool, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if d_qk is not None and self.rotary_fraction == 1 and d_qk % 2:
            yield (), f"rope rotates pairs of query/key channels, so d_qk must be even, got {d_qk}"
        elif d_qk is not None and (self.rotary_width(d_qk) % 2 or self.rotary_width(d_qk) == 0):
            yield (), (f"rope rotates pairs of query/key channels, so rotary_fraction * d_qk must be a positive even "
                       f"number, got {self.rotary_fraction} * {d_qk}")


class AlibiPosition(PositionComponent):
    """ALiBi: score bias -m_h (t - s) with head slopes m_h = 2^(-8 (h+1) / H), i.e. a fixed real decay
    a = exp(-m_h) per head, applied through the transition's decay path (so linear mixers take it too)."""

    kind: Literal["alibi"]
    acts_on: ClassVar[str] = "decay"

    def problems(self, *, causal: bool, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if not causal:
            yield (), "alibi is a decay over past positions, so it needs `causal: true`; use rope for non-causal"


Position = declare("position", NoPosition, LearnedPosition, SinusoidalPosition, RotaryPosition, AlibiPosition,
                   base=PositionComponent)


__all__ = ["PositionComponent", "NoPosition", "LearnedPosition", "SinusoidalPosition", "RotaryPosition",
           "AlibiPosition", "Position"]
