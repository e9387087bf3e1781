"""Short causal convolutions inside a mixer (a slot): none, short, token shift."""

from __future__ import annotations

from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component


class ConvComponent(Component):
    """Causal depthwise convolutions inside a mixer: ``streams()`` names what is convolved and with
    which width; each stream keeps its last width - 1 inputs as decoding state."""

    def streams(self) -> dict[str, int]:
        """Stream (``x``: the mixer input, ``q``/``k``/``v``: the projections) -> kernel width."""
        return {}

    def starts_as_mean(self) -> bool:
        """Whether each filter starts as the mean of its window (token shift), else as PyTorch's
        Conv1d default (uniform in +-1/sqrt(width))."""
        return False

    def output_activation(self) -> str:
        """Applied to each convolved stream: ``none`` or ``silu``."""
        return "none"

    def has_bias(self) -> bool:
        """A learnt bias per channel."""
        return False

    def problems(self) -> Iterator[tuple[tuple, str]]:
        return iter(())


class NoConv(ConvComponent):
    """No convolution."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


class ShortConv(ConvComponent):
    """Short causal depthwise convolutions on the projected q, k and/or v (H3, Based, Mamba)."""

    kind: Literal["short"]
    width: Annotated[int, Field(ge=2, le=limits.MAX_CONV_WIDTH)] = 4
    """Kernel width: each output sees its own position and the width - 1 before it."""
    projections: Annotated[list[Literal["q", "k", "v"]], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: ["q", "k", "v"])
    """Which projections are convolved."""
    activation: Literal["none", "silu"] = "none"
    """Applied to each convolved stream (Mamba2 and flash-linear-attention's layers: silu)."""
    bias: bool = False
    """A learnt bias per channel (Mamba2's conv1d has one)."""

    def streams(self) -> dict[str, int]:
        return {name: self.width for name in self.projections}

    def output_activation(self) -> str:
        return self.activation

    def has_bias(self) -> bool:
        return self.bias

    def problems(self) -> Iterator[tuple[tuple, str]]:
        if len(set(self.projections)) != len(self.projections):
            yield ("projections",), f"each of q, k, v may be named once, got {self.projections}"


class TokenShift(ConvComponent):
    """Token shift (RWKV): the q/k/v projections see mu * x_(t-1) + (1 - mu) * x_t per channel, a
    width-2 causal depthwise convolution of the mixer input, initialised to mu = 1/2 (the transition
    and the output gate see x_t itself)."""

    kind: Literal["shift"]

    def streams(self) -> dict[str, int]:
        return {"x": 2}

    def starts_as_mean(self) -> bool:
        return True


Conv = declare("conv", NoConv, ShortConv, TokenShift, base=ConvComponent)


__all__ = ["ConvComponent", "NoConv", "ShortConv", "TokenShift", "Conv"]
