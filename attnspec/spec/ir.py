"""The Spec IR: strict pydantic models describing a model built from sequence mixers.

The component types live one module per slot (:mod:`.features`, :mod:`.reweightings`,
:mod:`.transitions`, :mod:`.positions`, :mod:`.convs`, :mod:`.supports`, :mod:`.channel`) and the mixer
families one module each (:mod:`attnspec.spec.mixers`); this module holds the model around them
(blocks, groups, inputs, heads, initialisation, the spec) and re-exports every IR type. Together
they are the single source of truth for what a spec can say. The YAML and
grammar front-ends produce plain dicts that are validated here; the JSON Schema,
the generated reference docs and the compiler all read these classes. Nothing in
``attnspec/spec`` imports torch.

Components that have a ``kind`` (feature maps, transitions, mixers, ...) may be
written as a bare string when every other field keeps its default, so
``feature_map: relu`` means ``feature_map: {kind: relu}``. That is what makes an
ablation one edit (``--set layers[0].mixer.feature_map=relu``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from attnspec.spec import limits
from attnspec.spec.components import slot_fields_of
from attnspec.spec.nodes import Component, Count, Node, NonNegativeFloat, PositiveFloat, Seed, ShareName, fixed_union
from attnspec.spec.features import (AogluFeatures, Elu1Features, ExpFeatures, FeatureMap, FeatureMapComponent,
                                    GluFeatures, IdentityFeatures, L2NormFeatures, OgluFeatures, PerformerFeatures,
                                    ReluFeatures, SiluFeatures, SoftplusFeatures, SoftplusLinearFeatures)
from attnspec.spec.reweightings import CosReweighting, NoReweighting, Reweighting, ReweightingComponent
from attnspec.spec.transitions import (DataTransition, FixedTransition, InitRange, MambaTransition, NoTransition,
                                       PhaseRange, Transition, TransitionComponent, UnitRange)
from attnspec.spec.positions import (AlibiPosition, LearnedPosition, NoPosition, Position, PositionComponent,
                                     RotaryPosition, SinusoidalPosition)
from attnspec.spec.convs import Conv, ConvComponent, NoConv, ShortConv, TokenShift
from attnspec.spec.supports import (BlockSupport, LinearLowRank, LocalSupport, LowRank, LowRankComponent, LshSupport,
                                    PerformerLowRank, SparseComponent, SparseSupport, TopkSupport)
from attnspec.spec.mixers.base import MixerComponent, Mode, OutputGate
from attnspec.spec.mixers import (DeltaMixer, GatedConvMixer, LinearMixer, MambaMixer, Mixer, MlaMixer, MlstmMixer,
                                  NoMixer, ParallelMixer, RglruMixer, ScatterbrainMixer, SoftmaxMixer)
from attnspec.spec.channel import (ChannelMixer, ChannelMixerComponent, GluMlp, LayerNormNode, Mlp, NoMlp, NoNorm,
                                   Norm, NormComponent, RmsNormNode)
from attnspec.spec.walk import iter_blocks  # noqa: F401  (part of the IR's API)


class Residuals(Node):
    """Skip connections of a block's two sub-layers, separately (the rank-collapse paper's surgery:
    "SAN + MLP" is `{mixer: false, mlp: true}`)."""

    mixer: bool = True
    """x + mixer(...)"""
    mlp: bool = True
    """x + mlp(...)"""


Scale = Annotated[float, Field(gt=0, le=1e4)]


class SubLayerScales(Node):
    """A multiplier for each of a block's two sub-layers (MiniMax's attention and MLP factors differ)."""

    mixer: Scale = 1.0
    mlp: Scale = 1.0


class Block(Node):
    """One residual block: [norm] -> mixer -> [+x] -> [norm] -> mlp -> [+x]."""

    mixer: Mixer
    """The sequence mixer; `none`: the block is its MLP alone (no mixer sub-layer, no norm before it)."""
    mlp: ChannelMixer = Field(default_factory=lambda: Mlp(kind="mlp"))
    """`mlp` (the default kind), `glu` or `none`."""
    norm: Norm = Field(default_factory=lambda: LayerNormNode(kind="layernorm"))
    """`layernorm`, `rmsnorm` or `none`."""
    norm_placement: Literal["pre", "post", "sandwich", "output", "normed_residual"] = "pre"
    """`pre`: x + f(norm(x)); `post`: norm(x + f(x)); `sandwich`: x + norm'(f(norm(x))), a second norm of
    its own on each sub-layer's output (Gemma 2 and 3); `output`: x + norm(f(x)), the sub-layer's output
    normalised before the residual (OLMo 2); `normed_residual`: norm(x) + f(norm(x)), the skip carrying
    the normalised input (MiniMax)."""
    parallel: Literal["none", "shared_norm", "own_norms"] = "none"
    """The mixer and the MLP side by side on the block's input rather than one after the other:
    x + mixer(norm(x)) + mlp(norm(x)) with one norm (`shared_norm`: GPT-J, Phi, Cohere, Falcon's
    `parallel_attn`), x + mixer(norm(x)) + mlp(norm2(x)) with each its own (`own_norms`: GPT-NeoX's
    `use_parallel_residual`). Needs `pre` placement and both residuals, unscaled."""
    residual: bool | Residuals = True
    """Skip connections around the mixer and the MLP: `true`, `false` (the rank-collapse study's pure
    attention network), or each sub-layer's own: `{mixer: false, mlp: true}`."""
    residual_scale: Scale | SubLayerScales = 1.0
    """Multiplier β on each sub-layer's output before it is added to the residual stream, x + β f(x)
    (Granite's `residual_multiplier`); `{mixer: .., mlp: ..}` for each sub-layer its own."""
    skip_scale: Scale | SubLayerScales = 1.0
    """Multiplier α on the skip, α x + β f(x): with `post` placement DeepNorm's norm(α x + f(x)), with
    `normed_residual` MiniMax's α norm(x) + β f(norm(x)); `{mixer: .., mlp: ..}` for each its own."""
    output_scale: bool = False
    """A learnt scalar multiplying the block's output, the whole residual stream after it: y = s block(x)
    (Gemma 4's `layer_scalar`; parameter `output_scale`, (1,), 1 at initialisation). transformers holds Gemma 4's
    fixed: freeze it (`freeze: ["*.output_scale"]`) to train as it does."""
    shared: "SharedUse | None" = None
    """A call of one of the spec's `shared` blocks before this block's mixer (Zamba): the shared block's
    output, through this use's own map, is added to the mixer's input x + P S(..) before the norm (the
    residual stays x). Unset: none."""

    def residuals(self) -> tuple[bool, bool]:
        """(skip around the mixer, skip around the MLP)."""
        if isinstance(self.residual, Residuals):
            return self.residual.mixer, self.residual.mlp
        return self.residual, self.residual

    def scales(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """((α, β) of the mixer's sub-layer, (α, β) of the MLP's): the skip's and the output's multipliers."""
        def pair(value: float | SubLayerScales) -> tuple[float, float]:
            return (value.mixer, value.mlp) if isinstance(value, SubLayerScales) else (value, value)

        (skip_mixer, skip_mlp), (out_mixer, out_mlp) = pair(self.skip_scale), pair(self.residual_scale)
        return (skip_mixer, out_mixer), (skip_mlp, out_mlp)


class SharedUse(Node):
    """One block's call of a shared block (:class:`SharedBlock`), with the weights of this use alone: the
    `projection` and, where the shared block has `adapter_rank`, its low-rank adapters."""

    name: ShareName
    """The `name` of a block under the spec's `shared`."""
    projection: bool = True
    """Map the shared block's output by this use's own d_model x d_model matrix (no bias) before it is
    added (Zamba's per-use `linear`); false: add it as it is."""


AdapterTarget = Literal["q", "k", "v", "mlp"]


class SharedBlock(Node):
    """A block whose weights every use shares (Zamba's shared attention block): written once under the
    spec's `shared`, called by each block whose `shared` names it; each call reads its own input and
    keeps its own decoding state (a use is a layer of its own with tied weights)."""

    name: ShareName
    """What blocks call it by (`shared: {name: ...}`)."""
    reads: Literal["hidden", "hidden_and_embeddings"] = "hidden"
    """Its input: `hidden`, the calling block's input (width d_model); `hidden_and_embeddings`, that and
    the token embeddings concatenated (width 2 d_model: Zamba's), which its mixer's input norm and
    projections read (a family that `projects_input`: softmax, linear, delta, mlstm, scatterbrain)."""
    block: Block
    """Its mixer, MLP, norms and residuals, as any block's (Zamba: `residual: false`: its output is the
    MLP's alone); the mixer's d_qk and d_v default to the input width / heads."""
    adapter_rank: Count(limits.MAX_HEAD_WIDTH * 4) | None = None
    """Each use's own low-rank adapters of this rank (Zamba2's LoRA), added to the projections `adapt`
    names: W x + B_u A_u x with A_u, B_u this use's (B_u starts at zero); unset: none."""
    adapt: Annotated[list[AdapterTarget], Field(min_length=1, max_length=4)] = Field(
        default_factory=lambda: ["q", "k", "v", "mlp"])
    """The projections the adapters change: the mixer's `q`, `k`, `v`; `mlp`, the MLP's input
    projections together (a GLU's two, one adapter over both, as Zamba2's fused gate_up)."""


def _layer_tag(value: Any) -> str:
    if isinstance(value, dict):
        return "group" if "repeat" in value else "block"
    return "group" if isinstance(value, Group) else "block"


class Group(Node):
    """`repeat` copies of `layers` (each copy has its own weights)."""

    repeat: Count(limits.MAX_REPEAT)
    layers: Annotated[list["Layer"], Field(min_length=1, max_length=limits.MAX_BLOCKS)]


Layer = Annotated[
    Union[Annotated[Block, Tag("block")], Annotated[Group, Tag("group")]],
    Discriminator(_layer_tag),
]
Group.model_rebuild()
Block.model_rebuild()


class TokenInput(Node):
    """Integer tokens, embedded with a learned table."""

    kind: Literal["tokens"]
    vocab_size: Count(limits.MAX_VOCAB)
    scale: Annotated[float, Field(gt=0, le=1e4)] = 1.0
    """Multiplier on the token embeddings (Gemma: sqrt(d_model); Granite: `embedding_multiplier`)."""
    norm: Norm = Field(default_factory=lambda: NoNorm(kind="none"))
    """A norm of the (scaled) token embeddings before the first block and any learned or sinusoidal position
    (BLOOM's `word_embeddings_layernorm`)."""


class FeatureInput(Node):
    """Real-valued sequences (batch, length, dim), projected to d_model."""

    kind: Literal["features"]
    dim: Count(limits.MAX_INPUT_DIM)


Input = Annotated[Union[TokenInput, FeatureInput], Field(discriminator="kind")]


class LmHead(Node):
    """Next-token logits over the vocabulary."""

    kind: Literal["lm"]
    tied: bool = False
    """Share the weights with the token embedding."""
    scale: Annotated[float, Field(gt=0, le=100)] | None = None
    """Multiplier on the logits. Unset: 1 / d_model for a tied head (muP's output multiplier), 1 for
    an untied one. A tied head reads the token embedding, N(0, 1) by default (`init.embedding_std`),
    so without it the first logits have std ~sqrt(d_model) and the first loss is ~60 at d_model 128
    rather than ln(vocab) (docs/training.md, "Initialisation"); `scale: 1` is the behaviour before this field."""

    softcap: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """Cap the logits smoothly, cap * tanh(logits / cap), after `scale` (Gemma 2's
    `final_logit_softcapping`); unset: no cap."""
    bias: bool = False
    """A bias on the logits, before `scale` (an untied head's: Phi, GPT-J; a tied head's own vector beside the
    embedding it reads: CTRL)."""

    def default_scale(self, d_model: int, version: int = 2) -> float:
        """The scale an unset ``scale`` resolves to (always 1 in a version-1 spec)."""
        return 1.0 / d_model if self.tied and version >= 2 else 1.0


class ClassifierHead(Node):
    """Sequence classification from pooled features."""

    kind: Literal["classifier"]
    classes: Count(limits.MAX_CLASSES)
    pooling: Literal["mean", "last"] = "mean"
    """`last` is the causal choice: the last position has seen the whole sequence."""


class NoHead(Node):
    """Return the final hidden states (batch, length, d_model)."""

    kind: Literal["none"]


Head = fixed_union(LmHead, ClassifierHead, NoHead)


class Init(Node):
    """Where training starts (DESIGN sec. 6: initialisation is spec data, so it is ablated like any
    field). The function a model can compute does not depend on these, only its starting weights."""

    distribution: Literal["normal", "truncated_normal", "uniform"] = "normal"
    """How every weight this section draws is drawn, at the std its field names: `normal`;
    `truncated_normal`, N(0, std^2) cut at +-3 std (OLMo's; its std is 0.986 of the field's);
    `uniform`, U(-sqrt(3) std, sqrt(3) std) (exactly that std; PyTorch's nn.Linear shape)."""
    embedding_std: Annotated[float, Field(gt=0, le=10)] = 1.0
    """The token embedding is drawn with this std (`distribution`): 1 is PyTorch's nn.Embedding
    default (normal), 0.02 nanoGPT's."""
    projection_std: Annotated[float, Field(gt=0, le=10)] | None = None
    """The std of the projections of every block (a mixer's q, k, v, output gate, beta and output
    projections; the MLP's), drawn per `distribution`, biases zero, times the mixer's `init_scale`.
    Unset: PyTorch's default nn.Linear initialisation, uniform in +-1/sqrt(fan_in) (nanoGPT: 0.02)."""
    residual_scaling: bool = False
    """Divide the initial weights of the projections that write into the residual stream (each
    mixer's output projection, each MLP's down projection) by sqrt(2 * blocks), as GPT-2 does."""


class Spec(Node):
    """A model: input, a stack of mixer blocks, a final norm and a head."""

    version: Literal[1, 2] = 2
    """Spec format version. In version 1 (every resolved spec written before initialisation became
    spec data) an unset LM head `scale` means 1; from version 2 it means the head's default."""
    plugins: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=64)] = Field(default_factory=list)
    """Python modules defining components this spec uses (e.g. `[my_lab.features]`), imported before
    the spec is validated; installed plugins (entry-point group `attnspec.components`) need not be listed."""
    name: Annotated[str, Field(min_length=1, max_length=limits.MAX_NAME_CHARS)]
    """Model name (used in build summaries and manifests)."""
    description: str = ""
    input: Input
    d_model: Count(limits.MAX_D_MODEL)
    max_len: Count(limits.MAX_LEN)
    """Longest sequence the model is built for (cos re-weighting and budgets use it)."""
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    """The parameters' dtype, and the activations' between the parts that compute in float32 (attention
    kernels' sums, states and normalisers; decays). bfloat16 and float16 halve the weights' bytes (import-hf
    keeps a checkpoint's dtype); float64 is for numerical checks."""
    keep_float32: Annotated[list[Annotated[str, Field(min_length=1, max_length=200)]], Field(max_length=64)] = \
        Field(default_factory=list)
    """In a bfloat16 or float16 spec, the parameters that stay float32 besides those every family keeps
    there (its decays' parameters: `A_log`, `dt_bias`, `D`, `nu`, `theta`, `recurrent_param`): shell-style
    patterns of parameter names as the weights file names them (`*norm*.weight`), norms' weights and
    elementwise parameters only (a linear map's weight is refused). Unused in a float32 or float64 spec."""
    seed: Seed = 0
    """Seed of the weight initialisation and of every random projection and hash."""
    position: Position = Field(default_factory=lambda: NoPosition(kind="none"))
    """Position information: `learned` or `sinusoidal` (added to the embeddings), `rope` or `alibi`
    (in every mixer that does not name its own `position`), or `none`."""
    shared: Annotated[list[SharedBlock], Field(max_length=limits.MAX_BLOCKS)] = Field(default_factory=list)
    """Blocks whose weights are shared by the blocks that call them by name (`shared: {name: ...}` on a
    block: Zamba's shared attention). Empty: none."""
    layers: Annotated[list[Layer], Field(min_length=1, max_length=limits.MAX_BLOCKS)]
    final_norm: Norm = Field(default_factory=lambda: LayerNormNode(kind="layernorm"))
    head: Head = Field(default_factory=lambda: LmHead(kind="lm"))
    init: Init = Field(default_factory=Init)
    """The initial weights' distributions (docs/training.md, "Initialisation")."""


MODELS = [LinearLowRank, LinearMixer, SoftmaxMixer, ScatterbrainMixer, DeltaMixer, MlaMixer, MambaMixer,
          RglruMixer, MlstmMixer, GatedConvMixer, ParallelMixer, Residuals, SubLayerScales, SharedUse, Block,
          SharedBlock, Group, Spec]
"""Every model that holds components, leaves first (the order :func:`attnspec.spec.components.register`
rebuilds them in when a plugin adds a kind)."""
slot_fields_of(MODELS, globals())  # the fields that hold a slot's components, read from the annotations above


# Every IR type, importable from here (plugins write `from attnspec.spec.ir import MixerComponent`).
__all__ = ["AlibiPosition", "AogluFeatures", "Block", "BlockSupport", "ChannelMixer", "ChannelMixerComponent",
           "ClassifierHead", "Component", "Conv", "ConvComponent", "CosReweighting", "Count", "DataTransition",
           "DeltaMixer", "Elu1Features", "ExpFeatures", "FeatureInput", "FeatureMap", "FeatureMapComponent",
           "FixedTransition", "GatedConvMixer", "GluFeatures", "GluMlp", "Group", "Head", "IdentityFeatures", "Init",
           "InitRange", "Input", "L2NormFeatures", "Layer", "LayerNormNode", "LearnedPosition", "LinearLowRank",
           "LinearMixer", "LmHead", "LocalSupport", "LowRank", "LowRankComponent", "LshSupport", "MODELS",
           "MambaMixer", "MambaTransition", "Mixer", "MixerComponent", "MlaMixer", "MlstmMixer", "ParallelMixer", "Mlp", "Mode", "NoConv", "NoHead",
           "NoMixer", "NoMlp", "NoNorm", "NoPosition", "NoReweighting", "NoTransition", "Node", "NonNegativeFloat",
           "Norm", "NormComponent", "OgluFeatures", "OutputGate", "PerformerFeatures", "PerformerLowRank",
           "PhaseRange", "Position", "PositionComponent", "PositiveFloat", "ReluFeatures", "Residuals", "Reweighting", "SubLayerScales",
           "ReweightingComponent", "RglruMixer", "RmsNormNode", "RotaryPosition", "ScatterbrainMixer", "Seed", "SharedBlock", "SharedUse",
           "ShortConv", "SiluFeatures", "SinusoidalPosition", "SoftmaxMixer", "SoftplusFeatures",
           "SoftplusLinearFeatures", "SparseComponent", "SparseSupport", "Spec", "TokenInput", "TokenShift",
           "TopkSupport", "Transition", "TransitionComponent", "UnitRange", "fixed_union", "iter_blocks"]
