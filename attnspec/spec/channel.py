"""Norms and channel mixers (two slots): LayerNorm, RMSNorm, none; the MLP, the GLU MLP, none."""

from __future__ import annotations

from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component, Count


class NormComponent(Component):
    """A normalisation over the model width."""

    no_weight_decay: ClassVar[bool] = True


class LayerNormNode(NormComponent):
    """LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias (eps: torch's default, 1e-5)."""

    kind: Literal["layernorm"]
    eps: Annotated[float, Field(gt=0, le=1)] = 1e-5
    bias: bool = True
    """false: no bias, the weight alone (Cohere's)."""
    affine: bool = True
    """false: neither weight nor bias, the normalisation alone (OLMo 1's)."""


class RmsNormNode(NormComponent):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight."""

    kind: Literal["rmsnorm"]
    eps: Annotated[float, Field(gt=0, le=1)] = 1e-6
    affine: bool = True
    """false: no weight, the normalisation alone (nanochat's norms)."""


class NoNorm(NormComponent):
    """No normalisation."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


Norm = declare("norm", LayerNormNode, RmsNormNode, NoNorm, base=NormComponent)


Activation = Literal["gelu", "gelu_10", "gelu_tanh", "mish", "quick_gelu", "relu", "relu2", "relu6", "silu", "tanh"]
"""An MLP's activation: GELU (exact, or its tanh approximation: Gemma, GPT-2's `gelu_new`; or its sigmoid
approximation x σ(1.702 x), `quick_gelu`: CLIP's, GPT-OSS's experts; or exact and clipped to [-10, 10],
`gelu_10`), ReLU (or clipped at 6, `relu6`), squared ReLU (Nemotron-H, Primer), SiLU, Mish x tanh(softplus(x))
or tanh: transformers' `ACT2FN` names (`gelu_accurate` and `gelu_python` import as `gelu_tanh` and `gelu`)."""

MlpActivation = Literal["gelu", "gelu_10", "gelu_tanh", "mish", "quick_gelu", "relu", "relu2", "relu6", "silu", "tanh",
                        "xielu"]
"""A dense MLP's activation: those of `Activation`, or xIELU (Huang 2024; Apertus): x > 0: a_p x² + β x,
else a_n (expm1(min(x, ε)) - x) + β x, with a_p = softplus(α_p) and a_n = β + softplus(α_n) learnt (one α_p and
one α_n per MLP, starting at a_p = a_n = 0.8), β = 0.5 and ε = -1e-6 held beside them as fixed tensors."""


class ChannelMixerComponent(Component):
    """The channel mixer after the sequence mixer (the block's MLP)."""

    def problems(self) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this MLP alone, as (path below it, message)."""
        return iter(())


class _Feedforward(ChannelMixerComponent):
    expansion: Count(limits.MAX_EXPANSION) = 4
    """Hidden width = expansion * d_model (unless `hidden` is given)."""
    hidden: Count(limits.MAX_EXPANSION * limits.MAX_D_MODEL) | None = None
    """Hidden width, when it is not a multiple of d_model (Llama's intermediate_size 11008 at d_model
    4096); it replaces `expansion`."""
    bias: bool = True
    """Biases on the projections (Llama-family MLPs have none: `bias: false`)."""
    activation: MlpActivation = "gelu"
    gated: ClassVar[bool] = False
    """A third projection multiplies the activation (GLU)."""
    glu_limit: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """A clamped GLU (GPT-OSS's): W2 (act(min(W1 x, limit)) * (clamp(W3 x, -limit, limit) + 1)). Needs a GLU."""
    inner_norm: Norm = Field(default_factory=lambda: NoNorm(kind="none"))
    """A norm of the hidden width before W2: W2 norm(act(W1 x) * W3 x) (BitNet's `ffn_sub_norm`); `none`: no norm."""

    def problems(self) -> Iterator[tuple[tuple, str]]:
        if self.glu_limit is not None and not self.gated:
            yield ("glu_limit",), "glu_limit clamps a GLU's two branches: use `kind: glu` or remove it"


class Mlp(_Feedforward):
    """W2 act(W1 x)."""

    kind: Literal["mlp"] = "mlp"
    """The default kind: `mlp: {expansion: 2}` needs no kind."""


class GluMlp(_Feedforward):
    """W2 (act(W1 x) * W3 x)."""

    kind: Literal["glu"]
    gated: ClassVar[bool] = True


class MoeMlp(ChannelMixerComponent):
    """A mixture of experts: a router scores the experts per token (softmax or sigmoid over
    ``W_r x``), the ``top_k`` best are chosen (by score plus a learnt correction bias where
    ``score_bias``), their weights are the chosen scores (renormalised to sum 1 with ``normalize``,
    then times ``routed_scale``), and the output is the weighted sum of the chosen experts (each a GLU
    or plain MLP of width ``hidden``) plus ``shared`` always-on experts (width ``shared_hidden``;
    times sigmoid(w_s . x) with ``shared_gate``). Qwen3-Next/Qwen3.5-MoE: softmax, normalize, shared
    gate; DeepSeek-V3/Kimi: sigmoid, score_bias, normalize, routed_scale; Mixtral: softmax, normalize.
    The load-balancing loss (Switch Transformer's E sum_e f_e P_e) is what ``attnspec train``'s
    ``moe_aux_loss`` weight adds."""

    kind: Literal["moe"]
    experts: Count(limits.MAX_EXPERTS)
    """Routed experts."""
    zero_experts: Annotated[int, Field(ge=0, le=limits.MAX_EXPERTS)] = 0
    """Zero-computation experts beside them (LongCat-Flash's `zero_expert_num`): the router scores experts +
    zero_experts choices, and a token that chooses one of the last zero_experts passes through it unchanged, w x."""
    top_k: Count(limits.MAX_EXPERTS) = 2
    """Experts each token is routed to."""
    hidden: Count(limits.MAX_EXPANSION * limits.MAX_D_MODEL)
    """Hidden width of one routed expert (transformers' `moe_intermediate_size`)."""
    activation: Activation = "silu"
    gated: bool = True
    """Experts are GLU MLPs, W2 (act(W1 x) * W3 x), as every released MoE's; false: W2 act(W1 x)."""
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    """Router scores: a softmax over the experts' logits, or a sigmoid of each."""
    normalize: bool = True
    """Renormalise the chosen scores to sum 1 (transformers' `norm_topk_prob`)."""
    routed_scale: Annotated[float, Field(gt=0, le=1000)] = 1.0
    """Multiplier on the routed experts' weights (`routed_scaling_factor`)."""
    score_bias: bool = False
    """A learnt per-expert bias added to the scores to choose the experts, not to weight them
    (DeepSeek-V3's `e_score_correction_bias`)."""
    score_bias_on_logits: bool = False
    """Add the correction bias to the router's logits rather than its scores to choose (Kolibri's router: top-k of
    logits + bias, weighted by the chosen logits' sigmoid). Needs `score_bias`."""
    groups: Count(limits.MAX_EXPERTS) = 1
    """Group-limited routing (DeepSeek-V3's `n_group`): the experts form this many equal groups, and each
    token chooses its experts from the `top_groups` groups ranked highest (`group_score`)."""
    top_groups: Count(limits.MAX_EXPERTS) | None = None
    """Groups each token chooses from (`topk_group`); unset: every group."""
    group_score: Literal["top2_sum", "max"] = "top2_sum"
    """How a group is ranked: the sum of its two best choosing scores (DeepSeek-V3's), or its best one
    (DeepSeek-V2's `group_limited_greedy`)."""
    shared: Annotated[int, Field(ge=0, le=limits.MAX_EXPERTS)] = 0
    """Shared experts every token passes through (as one MLP of width `shared_hidden`, gated as the
    routed experts are)."""
    shared_hidden: Count(limits.MAX_EXPANSION * limits.MAX_D_MODEL) | None = None
    """Hidden width of the shared experts together (default shared * hidden)."""
    shared_gate: bool = False
    """Scale the shared experts' output by sigmoid(w_s . x) (Qwen's `shared_expert_gate`)."""
    router_bias: bool = False
    """A learnt bias on the router's logits, which chooses and weights alike (GPT-OSS's router)."""
    weight_inputs: bool = False
    """Each chosen expert reads its input times its weight, E(w x), rather than its output being weighted, w E(x)
    (Llama 4's experts)."""
    router_softcap: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """Cap the router's logits smoothly, cap * tanh(logits / cap), before they are scored (Laguna's
    `moe_router_logit_softcapping`); unset: no cap."""
    expert_bias: bool = False
    """Biases on the routed experts' projections (GPT-OSS's)."""
    output_bias: bool = False
    """One learnt bias added to the mixture's output, whichever experts a token chose (JetMoE's)."""
    glu_limit: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """Clamped GLU experts (GPT-OSS's `swiglu_limit`): W2 (act(min(W1 x, limit)) * (clamp(W3 x, -limit, limit) +
    1)), the shared experts too. Needs `gated: true`."""

    def problems(self) -> Iterator[tuple[tuple, str]]:
        if self.glu_limit is not None and not self.gated:
            yield ("glu_limit",), "glu_limit clamps a GLU's two branches: remove it or keep `gated: true`"
        if self.score_bias_on_logits and not self.score_bias:
            yield ("score_bias_on_logits",), "score_bias_on_logits places the correction bias: set `score_bias: true`"
        if self.top_k > self.experts + self.zero_experts:
            yield ("top_k",), (f"top_k = {self.top_k} chooses more experts than the {self.experts + self.zero_experts} "
                               "there are")
        if self.zero_experts and self.groups != 1:
            yield ("zero_experts",), "zero-computation experts join no group: remove `groups` or `zero_experts`"
        if self.experts % self.groups:
            yield ("groups",), f"{self.experts} experts cannot form {self.groups} equal groups; use a divisor"
        elif self.top_groups is not None and self.top_groups > self.groups:
            yield ("top_groups",), f"top_groups = {self.top_groups} is more than the {self.groups} groups there are"
        elif self.top_groups is not None and self.top_groups * self.experts // self.groups < self.top_k:
            yield ("top_groups",), (f"{self.top_groups} groups of {self.experts // self.groups} experts hold fewer than "
                                    f"top_k = {self.top_k}")
        elif self.groups > 1 and self.experts // self.groups < 2 and self.group_score == "top2_sum":
            yield ("groups",), "a group is scored by its two best experts: groups need at least 2 experts each"
        if not self.shared and (self.shared_hidden is not None or self.shared_gate):
            yield ("shared",), "shared_hidden and shared_gate describe shared experts: set `shared` to their number"


class NoMlp(ChannelMixerComponent):
    """No channel mixer."""

    kind: Literal["none"]
    is_identity: ClassVar[bool] = True


ChannelMixer = declare("mlp", Mlp, GluMlp, MoeMlp, NoMlp, default="mlp", base=ChannelMixerComponent)


__all__ = ["NormComponent", "LayerNormNode", "RmsNormNode", "NoNorm", "Norm", "ChannelMixerComponent", "Mlp",
           "GluMlp", "MoeMlp", "NoMlp", "ChannelMixer"]
