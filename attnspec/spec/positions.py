"""Position schemes (a slot): none, learned, sinusoidal, rotary, ALiBi."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
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
    """Fixed sinusoids added to the token embeddings: channels [0, d/2) hold sin(t f_i), channels [d/2, d)
    cos(t f_i) (Vaswani et al.'s, halves rather than interleaved), an odd d's last channel none."""

    kind: Literal["sinusoidal"]
    base: Annotated[float, Field(gt=1, le=1e9)] = 10000.0
    spacing: Literal["half", "half_minus_one"] = "half"
    """The frequencies f_i = base^(-i/s), i < d/2: s = d/2 (`half`, attnspec's), or d/2 - 1 (`half_minus_one`:
    tensor2tensor's, which fairseq, XGLM and transformers' other fairseq ports use)."""
    offset: Annotated[int, Field(ge=0, le=1 << 16)] = 0
    """Position t of the first token: fairseq's tables start after its padding index (XGLM: 2)."""
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
    interleaved: bool = False
    """Pair adjacent channels (2i, 2i + 1) instead of (i, i + r/2) (GPT-J's layout; DeepSeek-V3's
    `rope_interleave`)."""
    proportional: bool = False
    """Gemma 4's proportional RoPE: the r = rotary_fraction * d_qk rotated channels spread over the whole head, pairs
    (i, i + d_qk/2) for i < r/2, turned by t / base^(2i/d_qk) (the head's own frequencies, not the rotated width's:
    the first r/2 of a whole-head RoPE); the other channels pass unrotated."""
    reverse: bool = False
    """Turn each pair the other way, by -t / base^(2i/r) (nanochat's rotate_half is [x2, -x1]): scores depend on
    the offset between positions all the same."""
    scaling: Literal["none", "linear", "llama3", "yarn", "dynamic"] = "none"
    """How the frequencies f_i = base^(-2i/r) are stretched for contexts past the trained one:
    `linear` f_i / factor (position interpolation); `llama3` f_i / factor for wavelengths past
    original_max_len / low_freq_factor, unchanged below original_max_len / high_freq_factor, a smooth
    blend between (Llama 3.1); `yarn` a blend of f_i and f_i / factor ramped over the dimensions that
    turn between beta_slow and beta_fast times in original_max_len positions, with cos and sin scaled
    by `attention_factor` (YaRN); `dynamic` (dynamic NTK) the base itself grown with the length n a
    call reaches, base (factor n / original_max_len - factor + 1)^(r / (r - 2)) once n is past
    original_max_len: a sequence is rotated with its whole length's base, while a decoding step rotates
    its token with its own position's and the cached keys keep theirs (as transformers' `generate`), so
    past original_max_len decoding a sequence and computing it at once differ. transformers' `rope_type`
    of the same names."""
    factor: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """The stretch of a scaled rope."""
    original_max_len: Annotated[int, Field(gt=0, le=limits.MAX_LEN)] | None = None
    """The context the model was trained at (`original_max_position_embeddings`; llama3, yarn and dynamic)."""
    low_freq_factor: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """llama3: wavelengths past original_max_len / low_freq_factor are divided by factor."""
    high_freq_factor: Annotated[float, Field(gt=0, le=1e6)] = 4.0
    """llama3: wavelengths below original_max_len / high_freq_factor are kept."""
    beta_fast: Annotated[float, Field(gt=0, le=1e6)] = 32.0
    """yarn: dimensions turning more than this many times in original_max_len positions are kept."""
    beta_slow: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """yarn: dimensions turning fewer times than this are divided by factor."""
    truncate: bool = True
    """yarn: round the ramp's ends to whole dimensions (transformers' default)."""
    attention_factor: Annotated[float, Field(gt=0, le=100)] | None = None
    """yarn: the multiplier on cos and sin (default 0.1 ln(factor) + 1; DeepSeek's mscale ratio)."""
    acts_on: ClassVar[str] = "qk"

    @property
    def cos_sin_scale(self) -> float:
        """The multiplier on the rotation's cos and sin (YaRN's attention factor; 1 otherwise)."""
        if self.scaling != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0

    def rotary_width(self, d_qk: int) -> int:
        """How many channels of a d_qk-wide head are rotated."""
        return int(d_qk * self.rotary_fraction + 1e-9)  # (a fraction written as 2a / d may round below 2a)

    def problems(self, *, causal: bool, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if self.scaling in ("llama3", "yarn", "dynamic") and self.original_max_len is None:
            yield ("original_max_len",), f"{self.scaling} scaling needs the trained context: set original_max_len"
        if self.scaling == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            yield ("high_freq_factor",), "llama3 scaling blends between low_freq_factor and a larger high_freq_factor"
        if self.scaling == "none" and (self.factor != 1.0 or self.original_max_len is not None):
            yield ("scaling",), ("factor and original_max_len stretch a scaled rope: set scaling (linear, llama3, yarn, "
                                 "dynamic)")
        if self.proportional and (self.interleaved or self.scaling not in ("none", "linear")):
            yield ("proportional",), ("proportional RoPE pairs channel i with i + d_qk/2 and stretches linearly at "
                                      "most: remove `interleaved`, and use `scaling: none` or `linear`")
        if self.proportional and d_qk is not None and d_qk % 2:
            yield ("proportional",), f"proportional RoPE pairs channel i with i + d_qk/2, so d_qk must be even, got {d_qk}"
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
