"""Norms and channel mixers (two slots): LayerNorm, RMSNorm, none; the MLP, the GLU MLP, none."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component, Count


class NormComponent(Component):
    """A normalisation over the model width."""

    no_weight_decay: ClassVar[bool] = True


class LayerNormNode(NormComponent):
    """LayerNorm: (x - mean) / std * weight + bias."""

    kind: Literal["layernorm"]


class RmsNormNode(NormComponent):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight."""

    kind: Literal["rmsnorm"]
    eps: Annotated[float, Field(gt=0, le=1)] = 1e-6


class NoNorm(NormComponent):
    """No normalisation."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


Norm = declare("norm", LayerNormNode, RmsNormNode, NoNorm, base=NormComponent)


class ChannelMixerComponent(Component):
    """The channel mixer after the sequence mixer (the block's MLP)."""


class _Feedforward(ChannelMixerComponent):
    expansion: Count(limits.MAX_EXPANSION) = 4
    """Hidden width = expansion * d_model (unless `hidden` is given)."""
    hidden: Count(limits.MAX_EXPANSION * limits.MAX_D_MODEL) | None = None
    """Hidden width, when it is not a multiple of d_model (Llama's intermediate_size 11008 at d_model
    4096); it replaces `expansion`."""
    bias: bool = True
    """Biases on the projections (Llama-family MLPs have none: `bias: false`)."""
    activation: Literal["gelu", "relu", "silu"] = "gelu"
    gated: ClassVar[bool] = False
    """A third projection multiplies the activation (GLU)."""


class Mlp(_Feedforward):
    """W2 act(W1 x)."""

    kind: Literal["mlp"] = "mlp"
    """The default kind: `mlp: {expansion: 2}` needs no kind."""


class GluMlp(_Feedforward):
    """W2 (act(W1 x) * W3 x)."""

    kind: Literal["glu"]
    gated: ClassVar[bool] = True


class NoMlp(ChannelMixerComponent):
    """No channel mixer."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


ChannelMixer = declare("mlp", Mlp, GluMlp, NoMlp, default="mlp", base=ChannelMixerComponent)


__all__ = ["NormComponent", "LayerNormNode", "RmsNormNode", "NoNorm", "Norm", "ChannelMixerComponent", "Mlp",
           "GluMlp", "NoMlp", "ChannelMixer"]
