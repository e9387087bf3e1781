"""The Spec IR: strict pydantic models describing a model built from sequence mixers.

This module is the single source of truth for what a spec can say. The YAML and
grammar front-ends produce plain dicts that are validated here; the JSON Schema,
the generated reference docs and the compiler all read these classes. Nothing in
``attnspec/spec`` imports torch.

Components that have a ``kind`` (feature maps, transitions, mixers, ...) may be
written as a bare string when every other field keeps its default, so
``feature_map: relu`` means ``feature_map: {kind: relu}``. That is what makes an
ablation one edit (``--set layers[0].mixer.feature_map=relu``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Iterator, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
)

from attnspec.spec import limits
from attnspec.spec.components import SLOTS, declare, kind_shorthand, slot_fields_of
from attnspec.spec.family import (GRAPH, NATIVE_CPU, TRITON, Backend, Cost, delta_costs, linear_costs,
                                  noncausal_linear_cost, softmax_cost)
from attnspec.spec.walk import iter_blocks  # noqa: F401  (part of the IR's API)

NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


def Count(limit: int) -> Any:
    """A positive integer at most ``limit`` (see :mod:`attnspec.spec.limits`)."""
    return Annotated[int, Field(gt=0, le=limit)]


Seed = Annotated[int, Field(ge=0, le=limits.MAX_SEED)]


class Node(BaseModel):
    """Base of every IR node: strict types, unknown keys rejected, docstrings become descriptions."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        str_max_length=limits.MAX_STRING_CHARS,
        use_attribute_docstrings=True,
        validate_default=True,
    )


def fixed_union(*members: type[Node]) -> Any:
    """A fixed union of ``kind``-tagged node types with the bare-string shorthand (for the model's own
    parts, such as heads; the slots plugins can extend are declared in :mod:`attnspec.spec.components`)."""
    union = Annotated[Union[members], Field(discriminator="kind")]  # type: ignore[valid-type]
    return Annotated[union, BeforeValidator(kind_shorthand)]


# --------------------------------------------------------------------------- component bases
# Each slot's base class states the facts every component of the slot has, with defaults; a kind
# overrides what differs. Rules, resolve, plan, lower and nn read these facts, never a kind name.


class Component(Node):
    """Base of every kind-tagged part of a spec that fills a slot (:mod:`attnspec.spec.components`)."""

    slot: ClassVar[str]
    """The slot this component fills (set when it is declared or registered)."""
    implementation: ClassVar[str | None] = None
    """``"module:Class"`` of the nn implementation for plugins (built-ins register in attnspec.nn)."""
    is_identity: ClassVar[bool] = False
    """The component does nothing (``none`` kinds): the model leaves it out."""
    no_weight_decay: ClassVar[bool] = False
    """The trainer's optimiser applies no weight decay to this component's parameters (norms,
    positions, transitions). Biases and the token embedding never take weight decay."""
    lr_multiplier: ClassVar[float] = 1.0
    """The trainer scales the learning rate of this component's parameters by this factor."""


class FeatureMapComponent(Component):
    """A feature map phi applied per head to queries and keys: width n -> ``width(n)``."""

    non_negative: ClassVar[bool] = True
    """phi >= 0, so the linear-attention normaliser q~.z stays positive."""
    finite: ClassVar[bool] = True
    """phi has a finite feature expansion (False: the softmax kernel, computed quadratically)."""
    consumes_scale: ClassVar[bool] = False
    """The feature map applies the mixer's `scale` (the softmax temperature) itself."""
    unit_norm: ClassVar[bool] = False
    """|phi(x)| <= 1 per head, = 1 up to a 1e-6 smoothing (what the delta rule needs for I - beta k kᵀ,
    beta <= 2, to stay a contraction)."""

    def width(self, n: int) -> int:
        """Feature width for query/key width ``n``."""
        return n

    def resolved(self, d_qk: int) -> "FeatureMapComponent":
        """This component with its derived defaults filled in (``d_qk``: the per-head width)."""
        return self

    def problems(self, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this component alone, as (path below it, message)."""
        return iter(())


class ReweightingComponent(Component):
    """A separable position re-weighting rho(t) of the features."""

    width_factor: ClassVar[int] = 1
    """How many times the feature width the re-weighted features have."""

    def problems(self, *, causal: bool, max_len: int) -> Iterator[tuple[tuple, str]]:
        return iter(())


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


# --------------------------------------------------------------------------- feature maps


class IdentityFeatures(FeatureMapComponent):
    """phi(x) = x. Signed, so only valid without normalisation (GateLoop uses it)."""

    kind: Literal["identity"]
    non_negative: ClassVar[bool] = False


class Elu1Features(FeatureMapComponent):
    """phi(x) = elu(x) + 1 (Katharopoulos et al.), strictly positive."""

    kind: Literal["elu1"]


class ReluFeatures(FeatureMapComponent):
    """phi(x) = max(x, 0) (cosFormer), non-negative; rows may be all zero (eps clamp)."""

    kind: Literal["relu"]


class SoftplusFeatures(FeatureMapComponent):
    """phi(x) = log(1 + e^x), strictly positive."""

    kind: Literal["softplus"]


class SiluFeatures(FeatureMapComponent):
    """phi(x) = x sigmoid(x) (SiLU/swish), signed; DeltaNet's q/k activation before the L2 norm."""

    kind: Literal["silu"]
    non_negative: ClassVar[bool] = False


class L2NormFeatures(FeatureMapComponent):
    """phi(x) = act(x) / |act(x)|, per head (DeltaNet, Gated DeltaNet, KDA: q and k of unit norm), with
    act the identity or SiLU."""

    kind: Literal["l2norm"]
    activation: Literal["none", "silu"] = "none"
    """Applied before the normalisation (FLA's `qk_activation`; a short convolution's SiLU comes before it)."""
    non_negative: ClassVar[bool] = False
    unit_norm: ClassVar[bool] = True


class ExpFeatures(FeatureMapComponent):
    """The softmax kernel exp(q.k). It has no finite feature expansion: quadratic mode only."""

    kind: Literal["exp"]
    finite: ClassVar[bool] = False
    consumes_scale: ClassVar[bool] = True


class PerformerFeatures(FeatureMapComponent):
    """Performer positive random features phi(x) = exp(Wx - |x|^2/2)/sqrt(m), unbiased for exp(q.k)."""

    kind: Literal["performer"]
    num_features: Count(limits.MAX_FEATURES) = 64
    """Number of random features m (the feature width)."""
    projection: Literal["orthogonal", "iid"] = "orthogonal"
    """Rows of W drawn i.i.d. N(0, 1), or in orthogonal blocks with chi-distributed norms."""
    redraw: Literal["never", "interval"] = "never"
    """`never`: the projection is fixed by `seed`. `interval`: the training loop redraws it every
    `redraw_interval` steps through `attnspec.nn.redraw_random_features(model, step)`."""
    redraw_interval: Count(limits.MAX_STEPS) | None = None
    """Steps between redraws; required with `redraw: interval`, forbidden otherwise."""
    seed: Seed = 0
    """Seed of the projection (the model seed is added), so a rebuilt model computes the same function."""
    consumes_scale: ClassVar[bool] = True

    def width(self, n: int) -> int:
        return self.num_features

    def problems(self, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if self.redraw == "interval" and self.redraw_interval is None:
            yield ("redraw_interval",), "`redraw: interval` needs `redraw_interval: N` (steps between redraws)"
        if self.redraw == "never" and self.redraw_interval is not None:
            yield ("redraw_interval",), "`redraw_interval` only applies with `redraw: interval`; remove it"


class _TrainableKernel(FeatureMapComponent):
    stack: Count(limits.MAX_STACK) = 1
    """Number of units applied in sequence; only the last one is made positive (Softplus)."""
    share_across_heads: bool = True
    """One set of kernel weights shared by all heads (true) or separate weights per head (false)."""

    # the facts the trainable kernel's module is built from (attnspec/nn/features.py)
    def is_orthogonal(self) -> bool:
        """W_f starts orthogonal and is regularised towards it."""
        return False

    def regulariser_weight(self) -> float:
        """lambda of the orthogonality regulariser (0: none)."""
        return 0.0

    def is_gated(self) -> bool:
        """A sigmoid gate multiplies each unit."""
        return True

    def gate_rank(self) -> int | None:
        """The rank of a low-rank gate W_g = U V (None: a full n x n gate)."""
        return None


class _OrthogonalKernel(_TrainableKernel):
    ortho_weight: NonNegativeFloat = 1e-3
    """Weight lambda of the regulariser lambda*|W^T W - I|_F^2 on the orthogonal matrices, exposed
    to the training loop as `model.regularization_loss()`."""

    def is_orthogonal(self) -> bool:
        return True

    def regulariser_weight(self) -> float:
        return self.ortho_weight if self.is_orthogonal() else 0.0


class SoftplusLinearFeatures(_OrthogonalKernel):
    """Trainable FFN kernel phi(X) = Softplus(X W), W n x n (Yorsh & Kovalenko)."""

    kind: Literal["softplus_linear"]
    orthogonal: bool = False
    """Initialise W orthogonal and add the orthogonality regulariser (the 'Orth. linear kernel')."""

    def is_orthogonal(self) -> bool:
        return self.orthogonal

    def is_gated(self) -> bool:
        return False


class GluFeatures(_TrainableKernel):
    """GLU kernel: (X W_f) * sigmoid(X W_g); the last unit uses Softplus(X W_f) so phi > 0."""

    kind: Literal["glu"]


class OgluFeatures(_OrthogonalKernel):
    """GLU kernel with W_f kept orthogonal (init + regulariser)."""

    kind: Literal["oglu"]


class AogluFeatures(_OrthogonalKernel):
    """OGLU with a low-rank gate W_g = U V (rank r < n/2); 1.5 n^2 weights per unit at r = n/4."""

    kind: Literal["aoglu"]
    rank: Count(limits.MAX_HEAD_WIDTH) | None = None
    """Rank r of the gate; defaults to n/4 (n = d_qk). Must be below n/2."""

    def resolved(self, d_qk: int) -> "AogluFeatures":
        return self if self.rank is not None else self.model_copy(update={"rank": max(1, d_qk // 4)})

    def gate_rank(self) -> int | None:
        return self.rank

    def problems(self, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        if self.rank is not None and d_qk is not None and 2 * self.rank >= d_qk:
            yield ("rank",), (f"the AOGLU gate rank must be below n/2 = {d_qk / 2:g} (n = d_qk = {d_qk}); the paper "
                              f"uses n/4 = {max(d_qk // 4, 1)}")
        if self.rank is None and d_qk is not None and d_qk < 4:
            yield (), f"AOGLU needs d_qk >= 4 for a gate of rank n/4 (d_qk = {d_qk}); use glu or oglu"


FeatureMap = declare(
    "feature_map",
    IdentityFeatures,
    Elu1Features,
    ReluFeatures,
    SoftplusFeatures,
    SiluFeatures,
    L2NormFeatures,
    ExpFeatures,
    PerformerFeatures,
    SoftplusLinearFeatures,
    GluFeatures,
    OgluFeatures,
    AogluFeatures,
    base=FeatureMapComponent,
)

# --------------------------------------------------------------------------- re-weighting


class NoReweighting(ReweightingComponent):
    """No position re-weighting."""

    kind: Literal["none"]


class CosReweighting(ReweightingComponent):
    """cosFormer: weights cos(pi/2 (i-j)/M), split by Ptolemy's identity (feature width doubles)."""

    kind: Literal["cos"]
    M: Count(limits.MAX_SUPPORT) | None = None
    """Horizon M >= sequence length. Required (and >= max_len) for causal use so that every mode
    and the decoder use the same M; `null` means M = L per call (non-causal only)."""
    width_factor: ClassVar[int] = 2

    def problems(self, *, causal: bool, max_len: int) -> Iterator[tuple[tuple, str]]:
        if self.M is None and causal:
            yield ("M",), (f"causal cos re-weighting needs a fixed M so every mode and the decoder use the same "
                           f"weights; set `M: {max_len}` (>= max_len)")
        elif self.M is not None and self.M < max_len:
            yield ("M",), (f"M = {self.M} is below max_len = {max_len}: cos(pi/2 (i-j)/M) turns negative for "
                           f"|i-j| > M; set M >= {max_len}")


Reweighting = declare("reweighting", NoReweighting, CosReweighting, base=ReweightingComponent)

# --------------------------------------------------------------------------- state transitions


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
    init: Literal["retnet", "lru", "s4d_lin"] = "retnet"
    """`retnet`: |a| = 1 - 2^(-5-i); `lru`: |a| = exp(-exp(nu)) uniform in [0.9, 0.999];
    `s4d_lin`: ZOH discretisation of -1/2 + i pi k with a log-uniform step in [1e-3, 1e-1]."""
    complex: bool = False
    """Complex transition (magnitude and phase) or real (magnitude only)."""
    per: Literal["head", "channel"] = "head"
    """One transition per head, or one per key channel."""
    magnitude_init: UnitRange | None = None
    """Override the recipe's magnitudes: |a| of channel c of C is lo + (hi - lo) c / (C - 1)."""
    phase_init: PhaseRange | None = None
    """Override the recipe's phases (complex only): theta of channel c spread the same way over [lo, hi]."""

    @property
    def is_complex(self) -> bool:
        return self.complex

    def problems(self) -> Iterator[tuple[tuple, str]]:
        yield from _range_problems(self.magnitude_init, self.phase_init, self.is_complex)

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
    rank: Count(limits.MAX_HEAD_WIDTH) | None = None
    """A low-rank W_Δ = W_up W_down of this inner width (KDA's gate projection); full rank when unset."""
    scale_input: bool = False
    """Multiply the written input by Δ_t (Mamba2's discretisation, with the D skip taking x_t unscaled)."""

    @property
    def per_channel(self) -> bool:
        return self.per == "channel"

    def problems(self) -> Iterator[tuple[tuple, str]]:
        for name in ("a_init", "dt_init"):
            low, high = getattr(self, name)
            if low > high:
                yield (name,), f"{name} is a range [low, high]; got low {low} above high {high}"
        if self.scale_input and self.per_channel:
            yield ("scale_input",), "scale_input multiplies the input by one Δ_t per head (Mamba2); use `per: head`"


Transition = declare("transition", NoTransition, FixedTransition, DataTransition, MambaTransition,
                     base=TransitionComponent)

# --------------------------------------------------------------------------- positions


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

# --------------------------------------------------------------------------- short convolutions


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

# --------------------------------------------------------------------------- scatterbrain parts


class LowRankComponent(Component):
    """Scatterbrain's low-rank part: a non-negative feature map estimating exp(q.k)."""

    size_field: ClassVar[str | None] = None
    """The field that sizes it from the mixer's `budget` (None: its size is its feature map's)."""
    default_size: ClassVar[int] = 64

    def features(self) -> FeatureMapComponent:
        """The feature map this low-rank part computes with (what the nn layer builds)."""
        raise NotImplementedError

    def problems(self) -> Iterator[tuple[tuple, str]]:
        return iter(())


class PerformerLowRank(LowRankComponent):
    """Low-rank part with Performer positive random features."""

    kind: Literal["performer"]
    num_features: Count(limits.MAX_FEATURES) | None = None
    """Number of random features; derived from `budget` when omitted (64 without a budget)."""
    projection: Literal["orthogonal", "iid"] = "orthogonal"
    seed: Seed = 0
    size_field: ClassVar[str | None] = "num_features"

    def features(self) -> PerformerFeatures:
        width = {"num_features": self.num_features} if self.num_features is not None else {}  # else the map's default
        return PerformerFeatures(kind="performer", projection=self.projection, seed=self.seed, **width)


class LinearLowRank(LowRankComponent):
    """Low-rank part as plain linear attention with a deterministic non-negative feature map."""

    kind: Literal["linear"]
    feature_map: FeatureMap = Field(default_factory=lambda: Elu1Features(kind="elu1"))

    def features(self) -> FeatureMapComponent:
        return self.feature_map

    def problems(self) -> Iterator[tuple[tuple, str]]:
        for below, message in self.feature_map.problems(None):
            yield ("feature_map", *below), message
        if not (self.feature_map.non_negative and self.feature_map.finite):
            yield ("feature_map",), ("the low-rank part needs a finite non-negative feature map (the joint "
                                     "normaliser must stay positive); use elu1, relu, softplus or performer")


LowRank = declare("lowrank", PerformerLowRank, LinearLowRank, base=LowRankComponent)


class SparseComponent(Component):
    """Scatterbrain's sparse support: which keys each query sees exactly."""

    size_field: ClassVar[str]
    """The field that sizes the support; derived from the mixer's `budget` when omitted."""
    default_size: ClassVar[int]
    """Its value without a budget."""

    def keys_per_query(self) -> int:
        """Keys each query sees exactly (the sparse part's cost per query)."""
        return getattr(self, self.size_field)

    def size_for_budget(self, keys: int) -> int:
        """The value of ``size_field`` that spends ``keys`` keys per query."""
        return max(1, keys)

    def resolved(self, keys: int | None, max_len: int) -> "SparseComponent":
        """This support with the fields left to the budget filled: ``size_field`` spends ``keys`` keys
        per query (its default without a budget: ``keys`` None)."""
        if getattr(self, self.size_field) is not None:
            return self
        size = self.size_for_budget(keys) if keys is not None else self.default_size
        return self.model_copy(update={self.size_field: size})

    def problems(self) -> Iterator[tuple[tuple, str]]:
        return iter(())


class LshSupport(SparseComponent):
    """Angular LSH support: a query sees keys that share its bucket in any round (counted once)."""

    kind: Literal["lsh"]
    buckets: Count(limits.MAX_BUCKETS) | None = None
    """Buckets per round (even: a random rotation and argmax over [xR, -xR]). Derived when omitted:
    about max_len / capacity, so that a bucket holds as many keys as a round may take and the
    support spends its budget (8 without a budget). Fewer buckets than that waste nothing but
    select keys less sharply; more leave the capacity unfilled (a smaller support than budgeted)."""
    rounds: Count(limits.MAX_ROUNDS) = 2
    """Hash rounds; a pair colliding in several rounds counts once."""
    capacity: Count(limits.MAX_SUPPORT) | None = None
    """Keys per query per round: the nearest-in-position keys of the query's bucket (only earlier
    ones when causal). Bounds memory at O(L * rounds * capacity). Derived from `budget` when
    omitted (32 without a budget)."""
    seed: Seed = 0
    size_field: ClassVar[str] = "capacity"
    default_size: ClassVar[int] = 32

    def keys_per_query(self) -> int:
        return self.rounds * self.capacity

    def size_for_budget(self, keys: int) -> int:
        return max(1, keys // self.rounds)

    def resolved(self, keys: int | None, max_len: int) -> "LshSupport":
        found = super().resolved(keys, max_len)
        if found.buckets is not None:
            return found
        buckets = 8 if keys is None else 2 * max(1, round(max_len / found.capacity / 2))
        return found.model_copy(update={"buckets": min(buckets, limits.MAX_BUCKETS - limits.MAX_BUCKETS % 2)})

    def problems(self) -> Iterator[tuple[tuple, str]]:
        if self.buckets is not None and self.buckets % 2:
            yield ("buckets",), f"LSH buckets must be even (argmax over [xR, -xR]), got {self.buckets}"


class LocalSupport(SparseComponent):
    """Sliding-window support: |i - j| < window (j <= i when causal)."""

    kind: Literal["local"]
    window: Count(limits.MAX_SUPPORT) | None = None
    """Window size; derived from `budget` when omitted (64 without a budget)."""
    size_field: ClassVar[str] = "window"
    default_size: ClassVar[int] = 64


class BlockSupport(SparseComponent):
    """Block-diagonal support: i and j in the same block of `size` positions."""

    kind: Literal["block"]
    size: Count(limits.MAX_SUPPORT) | None = None
    """Block size; derived from `budget` when omitted (64 without a budget)."""
    size_field: ClassVar[str] = "size"
    default_size: ClassVar[int] = 64


class TopkSupport(SparseComponent):
    """Exact top-k support: each query sees the `keys` keys of largest q.k (earlier ones when causal).
    Finding them costs O(L^2) like full attention: a reference support for diagnosing the sparse
    part (how much of the attention mass a support of this size can hold), not a fast one."""

    kind: Literal["topk"]
    keys: Count(limits.MAX_SUPPORT) | None = None
    """Keys per query; derived from `budget` when omitted (32 without a budget)."""
    size_field: ClassVar[str] = "keys"
    default_size: ClassVar[int] = 32


SparseSupport = declare("sparse", LshSupport, LocalSupport, BlockSupport, TopkSupport, base=SparseComponent)

# --------------------------------------------------------------------------- mixers

Mode = Literal["auto", "recurrent", "scan", "chunk", "quadratic"]
OutputGate = Literal["none", "sigmoid", "swish"]


class MixerComponent(Component):
    """The base of a mixer *family* (the public base for plugin families): its fields are what every
    mixer has; its methods are the facts the planner, lowering, verification and decoding read
    (:mod:`attnspec.spec.family`). A family overrides ``modes``, ``mode_costs`` and, where it has
    kernels, ``backends``; a decoding step is ``has_step`` here and ``init_state``/``step`` on its
    implementation (the ``nn.Module`` registered for its kind, or ``implementation = "module:Class"``)."""

    required_overrides: ClassVar[tuple[str, ...]] = ("modes", "mode_costs")
    """What a plugin family must state itself (:func:`attnspec.spec.components.register` checks)."""
    heads: Count(limits.MAX_HEADS) = 1
    """Number of heads."""
    d_qk: Count(limits.MAX_HEAD_WIDTH) | None = None
    """Per-head query/key width; defaults to d_model / heads."""
    d_v: Count(limits.MAX_HEAD_WIDTH) | None = None
    """Per-head value width; defaults to d_model / heads."""
    causal: bool = True
    """Position t sees only positions <= t."""
    mode: Mode = "auto"
    """Execution mode; `auto` lets the compiler's cost model choose."""
    chunk_size: Count(limits.MAX_CHUNK) = 64
    """Chunk length of the chunked mode (a power of two)."""
    scale: PositiveFloat | None = None
    """Multiplier on q.k; defaults to 1/sqrt(d_qk) for exp/softmax kernels and 1 otherwise."""
    output_gate: OutputGate = "none"
    """Gate on the mixer output before the output projection: y * act(W_g x)."""
    group_norm: bool = False
    """Per-head normalisation (RMS) of the mixer output, as in RetNet/GateLoop."""
    position: Position | None = None
    """Position scheme of this mixer: `rope`, `alibi` or `none`; unset, the model's `position` applies
    when it acts on q/k or as a decay (resolved specs state it)."""
    conv: Conv = Field(default_factory=lambda: NoConv(kind="none"))
    """`short` causal depthwise convolutions on q/k/v, or `shift` (token shift of the input)."""
    init_scale: Annotated[float, Field(gt=0, le=100)] = 1.0
    """Multiplier on the q/k/v/gate/output projections' initial weights (PyTorch's default
    nn.Linear init, uniform in +-1/sqrt(fan_in)). 1 keeps the default."""
    kv_heads: Count(limits.MAX_HEADS) | None = None
    """Keys and values shared by groups of query heads: grouped-query attention (1: multi-query). Unset:
    one per head. The decoding cache holds kv_heads heads."""
    qk_norm: Literal["none", "rmsnorm"] = "none"
    """RMSNorm of each query and key head (a learnt weight per channel, shared by the heads), before
    positions and features (Qwen3, OLMo 2)."""
    qk_groups: Count(limits.MAX_HEADS) | None = None
    """Queries and keys shared by groups of heads: G groups of heads / G heads each (Mamba2's B and C
    `n_groups`; multi-value attention). Unset: one per head."""
    skip: bool = False
    """Add D ⊙ v_t to the output, a learnt D per head starting at 1 (Mamba2's D skip)."""
    gate_before_norm: bool = False
    """Gate then normalise: RMSNorm(y ⊙ silu(W_g x)) over each query/key group's heads (Mamba2's gated
    norm), rather than per-head RMSNorm(y) then the gate (Gated DeltaNet's). Needs `group_norm: true`
    and `output_gate: swish`."""
    norm_eps: Annotated[float, Field(gt=0, le=1)] = 1e-6
    """Epsilon of the mixer's RMS norms: the output norm (`group_norm`) and `qk_norm`."""
    shared_norm_weight: bool = False
    """The output norm's weight is one vector of d_v shared by the heads (Qwen3-Next's and Kimi's gated
    norms), rather than one weight per channel of every head. Needs `group_norm: true`, and not
    `gate_before_norm` (whose groups span several heads)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections and the output gate's (Qwen2; Llama's `attention_bias`)."""
    out_bias: bool = False
    """A bias on the output projection (Llama's `attention_bias`)."""

    def modes(self) -> tuple[str, ...]:
        """The execution modes that compute this mixer, the planner's default first."""
        return ("quadratic",)

    def mode_problem(self, mode: str) -> str:
        """Why a forced ``mode`` outside :meth:`modes` is impossible, and what to do."""
        return f"a {self.kind} mixer runs in {', '.join(self.modes())}; mode '{mode}' is impossible"

    def mode_costs(self, L: int) -> dict[str, Cost]:
        """The estimated :class:`~attnspec.spec.family.Cost` of each of :meth:`modes` at length ``L``
        (batch 1, forward; the planner scales it to the regime). Every family states its own."""
        raise NotImplementedError(f"the {self.kind} mixer family states no costs (MixerComponent.mode_costs)")

    def backends(self, mode: str) -> tuple[Backend, ...]:
        """The backends that run ``mode`` for this mixer, in order of preference (the graph path last)."""
        return (GRAPH,)

    @property
    def reference_mode(self) -> str:
        """The mode the others are verified against: the defining recurrence where there is one."""
        return "recurrent" if "recurrent" in self.modes() else self.modes()[0]

    @property
    def has_step(self) -> bool:
        """A one-token decoding step: a recurrent form with a constant-size state, or a key/value cache
        (:attr:`decode_mode`)."""
        return False

    @property
    def softmax_kernel(self) -> bool:
        """Computed as exact softmax attention (its cost is quadratic, its default scale 1/sqrt(d_qk))."""
        return False

    @property
    def softmax_temperature(self) -> bool:
        """`scale` defaults to 1/sqrt(d_qk), the temperature of an exp kernel, rather than 1."""
        return self.softmax_kernel

    def feature_width(self) -> int:
        """Width m of the state's keys (the planner's cost and the decoding state), once resolved."""
        return self.d_qk

    def sparse_keys(self) -> int:
        """Keys per query computed exactly beside the linear part (Scatterbrain's support), else 0."""
        return 0

    def describe(self) -> str:
        """One line naming the mixer and its parts, for plans and summaries."""
        return f"{self.kind} x{self.heads}"

    def resolved_parts(self, *, d_qk: int, max_len: int) -> dict[str, Any]:
        """Its parts with their derived defaults filled in (``model_copy`` updates), for resolution."""
        fmap = getattr(self, "feature_map", None)
        return {"feature_map": fmap.resolved(d_qk)} if fmap is not None else {}

    def resolved_position(self, model_position: PositionComponent) -> PositionComponent:
        """The scheme this mixer applies: its own, else the model's when that acts on q/k or as a decay."""
        if self.position is not None:
            return self.position
        return model_position if model_position.acts_on in ("qk", "decay") else NoPosition(kind="none")

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this mixer and its parts, as (path below the mixer, message)."""
        if self.mode != "auto" and self.mode not in self.modes():
            yield ("mode",), self.mode_problem(self.mode)
        transition = getattr(self, "transition", None)
        if transition is not None and not transition.is_identity and not self.causal:
            yield ("transition",), ("a state transition orders positions, so it needs `causal: true`; "
                                    "remove the transition or make the mixer causal")
        if transition is not None:
            for below, message in transition.problems():
                yield ("transition", *below), message
        if self.position is not None:
            if self.position.acts_on == "embedding":
                yield ("position",), (f"{self.position.kind} positions are added to the token embeddings; write "
                                      f"`position: {self.position.kind}` at the model level, not on a mixer")
            for below, message in self.position.problems(causal=self.causal, d_qk=d_qk):
                yield ("position", *below), message
            if self.position.acts_on == "decay" and transition is None:
                yield ("position",), (f"a {self.kind} mixer has no decay path for {self.position.kind}; use rope")
        for below, message in self.conv.problems():
            yield ("conv", *below), message
        for name in ("qk_groups", "kv_heads"):
            groups = getattr(self, name)
            if groups is not None and self.heads % groups:
                yield (name,), (f"{self.heads} heads cannot be split into {groups} equal groups; use a divisor of "
                                f"{self.heads}")
        if self.qk_groups is not None and self.kv_heads is not None:
            yield ("kv_heads",), ("kv_heads shares keys and values, qk_groups queries and keys: a mixer takes one "
                                  "of them")
        if self.gate_before_norm and not (self.group_norm and self.output_gate == "swish"):
            yield ("gate_before_norm",), ("gate_before_norm orders a gated norm, which needs `group_norm: true` "
                                          "and `output_gate: swish`")
        if self.shared_norm_weight and (not self.group_norm or self.gate_before_norm):
            yield ("shared_norm_weight",), ("a shared norm weight is the per-head output norm's: it needs "
                                            "`group_norm: true` without `gate_before_norm`")
        if transition is not None and getattr(transition, "scale_input", False) and not self.scales_input:
            yield ("transition", "scale_input"), (f"a {self.kind} mixer has no input for Δ_t to scale; remove "
                                                  "scale_input")

    @property
    def scales_input(self) -> bool:
        """Whether the family applies a transition's ``scale_input`` (Δ_t times the written key)."""
        return False

    @property
    def query_heads(self) -> int:
        """Heads of distinct queries: ``qk_groups`` where they are shared, else ``heads``."""
        return self.qk_groups or self.heads

    @property
    def key_heads(self) -> int:
        """Heads of distinct keys: ``qk_groups`` or ``kv_heads`` where they are shared, else ``heads``."""
        return self.qk_groups or self.kv_heads or self.heads

    @property
    def value_heads(self) -> int:
        """Heads of distinct values: ``kv_heads`` where they are shared, else ``heads``."""
        return self.kv_heads or self.heads

    @property
    def decode_mode(self) -> str | None:
        """How one token is decoded: ``recurrent`` (a constant-size state), ``cache`` (a key/value cache of
        :meth:`cache_capacity` positions), ``prefix`` (the inputs so far, the mixer rerun over them) or
        None (no decoding step)."""
        return "recurrent" if self.has_step else None

    def cache_capacity(self, max_len: int) -> int | None:
        """Positions a ``cache`` decoding state holds (None: no cache)."""
        return None

    def decode_limit(self, max_len: int) -> int | None:
        """The most positions one sequence can reach by decoding (None: unbounded): a full cache, or
        the inputs a ``prefix`` state keeps, hold :meth:`cache_capacity` of them."""
        return self.cache_capacity(max_len)


def _linear_family_costs(mixer: MixerComponent, L: int, d: int, transition: TransitionComponent | None
                         ) -> dict[str, Cost]:
    """Costs of a mixer computed as gated linear attention of feature width ``mixer.feature_width()``
    and value width ``d`` (with the normaliser's column), restricted to its modes; non-causal, every
    mode but quadratic is the linear form q (Kᵀ V)."""
    m, H = mixer.feature_width(), mixer.heads
    per_channel = transition is not None and transition.per_channel
    complex_ = transition is not None and transition.is_complex
    costs = {mode: cost for mode, cost in linear_costs(L, H, m, d, mixer.chunk_size, per_channel, complex_).items()
             if mode in mixer.modes()}
    if not mixer.causal:
        costs = {mode: (cost if mode == "quadratic" else noncausal_linear_cost(L, H, m, d))
                 for mode, cost in costs.items()}
    return costs


def _softmax_decay_problems(transition: TransitionComponent) -> Iterator[tuple[tuple, str]]:
    """A decay under softmax is an additive log-bias: it must be real and one per head."""
    if transition.is_complex:
        yield ("transition",), ("softmax scores must be real, but this transition is complex; use a real decay "
                                "(`complex: false` for fixed, `phase: none` for data-controlled)")
    elif transition.per_channel:
        yield ("transition", "per"), ("under softmax a decay is one additive bias per pair of positions, so it "
                                      "must be per head; set `per: head`")


class LinearMixer(MixerComponent):
    """The gated linear family: q~ = rho(t) phi(q), S_t = diag(a_t) S_(t-1) + k~_t^T v_t, y_t = Re(q~_t S_t)."""

    kind: Literal["linear"]
    feature_map: FeatureMap = Field(default_factory=lambda: Elu1Features(kind="elu1"))
    reweighting: Reweighting = Field(default_factory=lambda: NoReweighting(kind="none"))
    transition: Transition = Field(default_factory=lambda: NoTransition(kind="none"))
    normalize: bool = True
    """Divide by the same recurrence run on k~ alone (needs a non-negative feature map)."""
    eps: PositiveFloat = 1e-6
    """Lower clamp of the normaliser."""

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
        # the kernels take no decay or one per head, real or complex (ops.linear.backends)
        if mode == "chunk" and self.causal and not self.transition.per_channel:
            return (TRITON, NATIVE_CPU, GRAPH)
        return (GRAPH,)

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
        return ", ".join(parts) + f"] x{self.heads}"


class SoftmaxMixer(MixerComponent):
    """Softmax attention (quadratic only), optionally with a real decay as an additive log-bias."""

    kind: Literal["softmax"]
    transition: Transition = Field(default_factory=lambda: NoTransition(kind="none"))
    """Decay applied as the log-bias sum(log a) between positions (GateLoop sec. 3.4); real only."""
    window: Count(limits.MAX_LEN) | None = None
    """Sliding window: each position attends to the `window` most recent positions, itself included
    (causal only). Decoding keeps a ring buffer of that many keys and values: constant memory."""

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return {"quadratic": softmax_cost(L, self.heads, self.d_qk, self.d_v)}

    @property
    def has_step(self) -> bool:
        return self.causal

    @property
    def decode_mode(self) -> str | None:
        return "cache" if self.causal else None

    def cache_capacity(self, max_len: int) -> int | None:
        # A window's ring holds the whole window even when it is longer than max_len: decoding goes
        # on past max_len (a window is unbounded), and every position within the window is read then.
        return self.window if self.window is not None else max_len

    def decode_limit(self, max_len: int) -> int | None:
        return None if self.window is not None else max_len  # a ring buffer never fills

    def mode_problem(self, mode: str) -> str:
        return (f"softmax attention has no finite feature expansion, so it can only be computed quadratically; "
                f"mode '{mode}' is impossible: use `mode: quadratic` or `auto`")

    @property
    def softmax_kernel(self) -> bool:
        return True

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        yield from _softmax_decay_problems(self.transition)
        if self.window is not None and not self.causal:
            yield ("window",), "a sliding window looks back over past positions, so it needs `causal: true`"

    def describe(self) -> str:
        parts = [f"window {self.window}"] if self.window is not None else []
        if self.kv_heads is not None:
            parts.append(f"{self.kv_heads} kv heads")
        if not self.transition.is_identity:
            parts.append(f"{self.transition.kind} decay")
        return f"softmax[{', '.join(parts)}] x{self.heads}" if parts else f"softmax x{self.heads}"


class ScatterbrainMixer(MixerComponent):
    """Scatterbrain: a low-rank estimate of exp(q.k) plus an exact sparse correction on a support."""

    kind: Literal["scatterbrain"]
    lowrank: LowRank = Field(default_factory=lambda: PerformerLowRank(kind="performer"))
    sparse: SparseSupport = Field(default_factory=lambda: LshSupport(kind="lsh"))
    budget: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of full attention each query may spend (e.g. 0.125); sizes not given are derived
    from it and `ratio`."""
    ratio: Annotated[list[Count(limits.MAX_RATIO)], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [3, 1]
    )
    """Budget split `[sparse, low_rank]`; the paper trains with 3:1."""
    eps: PositiveFloat = 1e-6
    """Lower clamp of the joint normaliser."""

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "recurrent", "quadratic")

    @property
    def has_step(self) -> bool:
        return self.causal

    @property
    def decode_mode(self) -> str | None:
        """``prefix``: the sparse support needs every earlier key, so a step recomputes the mixer over its
        cached inputs (exact; a full pass per token)."""
        return "prefix" if self.causal else None

    def cache_capacity(self, max_len: int) -> int | None:
        return max_len if self.causal else None

    def mode_costs(self, L: int) -> dict[str, Cost]:
        """The low-rank part as normalised linear attention, plus the exact part on the sparse support."""
        costs = _linear_family_costs(self, L, self.d_v + 1, None)
        H, m, keys = self.heads, self.feature_width(), self.sparse_keys()
        for cost in costs.values():
            cost.macs += H * L * keys * (self.d_qk + self.d_v + m)
            cost.bytes += H * L * keys * (self.d_qk + self.d_v) * 4
        return costs

    def mode_problem(self, mode: str) -> str:
        return ("scatterbrain's sparse correction is not a linear recurrence, so it has no scan mode; use auto, "
                "chunk, recurrent or quadratic")

    @property
    def softmax_temperature(self) -> bool:  # its exact part is exp(scale q.k)
        return True

    def feature_width(self) -> int:
        return self.lowrank.features().width(self.d_qk)

    def sparse_keys(self) -> int:
        return self.sparse.keys_per_query()

    def describe(self) -> str:
        return f"scatterbrain[{self.lowrank.kind} + {self.sparse.kind}] x{self.heads}"

    def resolved_parts(self, *, d_qk: int, max_len: int) -> dict[str, Any]:
        """The low-rank and sparse sizes: from the budget's split when there is one, else their defaults."""
        sizes = self.sizes_for_budget(max_len) if self.budget is not None else None
        lowrank, sparse = self.lowrank, self.sparse
        if lowrank.size_field and getattr(lowrank, lowrank.size_field) is None:
            size = sizes["lowrank"] if sizes else lowrank.default_size
            lowrank = lowrank.model_copy(update={lowrank.size_field: size})
        sparse = sparse.resolved(sizes["sparse"] if sizes else None, max_len)
        return {"lowrank": lowrank, "sparse": sparse}

    def sizes_for_budget(self, max_len: int) -> dict[str, int]:
        """Sizes the budget implies: ``{"sparse": keys per query, "lowrank": features}`` (needs a budget)."""
        total = self.budget * max_len
        s, r = self.ratio
        return {"sparse": max(1, round(total * s / (s + r))), "lowrank": max(1, round(total * r / (s + r)))}

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        lowrank, sparse = self.lowrank, self.sparse
        for below, message in lowrank.problems():
            yield ("lowrank", *below), message
        for below, message in sparse.problems():
            yield ("sparse", *below), message
        if self.budget is None:
            return
        sizes = self.sizes_for_budget(max_len)
        split = f"budget {self.budget} with ratio {self.ratio[0]}:{self.ratio[1]}"
        if lowrank.size_field and getattr(lowrank, lowrank.size_field) not in (None, sizes["lowrank"]):
            yield ("lowrank", lowrank.size_field), (
                f"{split} gives {sizes['lowrank']} features, not {getattr(lowrank, lowrank.size_field)}; remove "
                f"{lowrank.size_field} or the budget")
        field = sparse.size_field
        value, expected = getattr(sparse, field), sparse.size_for_budget(sizes["sparse"])
        if value is not None and value != expected:
            yield ("sparse", field), f"{split} gives {field} = {expected}, not {value}; remove {field} or the budget"


class DeltaMixer(MixerComponent):
    """The delta rule: S_t = (I - beta_t k_t k_tᵀ) diag(a_t) S_(t-1) + beta_t k_t v_tᵀ, o_t = scale q_tᵀ S_t,
    with q and k of unit norm per head (`feature_map: l2norm`).

    DeltaNet has no transition; Gated DeltaNet a `mamba` transition per head; KDA one per key channel
    (any real transition works). beta_t = sigmoid(W_beta x_t), or 2 sigmoid (eigenvalues of
    I - beta k kᵀ down to -1: the state-tracking variant). Gated DeltaNet's output stage is
    `group_norm: true` with `output_gate: swish` (per-head RMSNorm, then the SiLU gate)."""

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
        return f"delta[beta {self.beta}{gate}] x{self.heads}"


Mixer = declare("mixer", LinearMixer, SoftmaxMixer, ScatterbrainMixer, DeltaMixer, base=MixerComponent)

# --------------------------------------------------------------------------- blocks and model


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


class Residuals(Node):
    """Skip connections of a block's two sub-layers, separately (the rank-collapse paper's surgery:
    "SAN + MLP" is `{mixer: false, mlp: true}`)."""

    mixer: bool = True
    """x + mixer(...)"""
    mlp: bool = True
    """x + mlp(...)"""


class Block(Node):
    """One residual block: [norm] -> mixer -> [+x] -> [norm] -> mlp -> [+x]."""

    mixer: Mixer
    mlp: ChannelMixer = Field(default_factory=lambda: Mlp(kind="mlp"))
    """`mlp` (the default kind), `glu` or `none`."""
    norm: Norm = Field(default_factory=lambda: LayerNormNode(kind="layernorm"))
    """`layernorm`, `rmsnorm` or `none`."""
    norm_placement: Literal["pre", "post"] = "pre"
    """`pre`: x + f(norm(x)); `post`: norm(x + f(x))."""
    residual: bool | Residuals = True
    """Skip connections around the mixer and the MLP: `true`, `false` (the rank-collapse study's pure
    attention network), or each sub-layer's own: `{mixer: false, mlp: true}`."""

    def residuals(self) -> tuple[bool, bool]:
        """(skip around the mixer, skip around the MLP)."""
        if isinstance(self.residual, Residuals):
            return self.residual.mixer, self.residual.mlp
        return self.residual, self.residual


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


class TokenInput(Node):
    """Integer tokens, embedded with a learned table."""

    kind: Literal["tokens"]
    vocab_size: Count(limits.MAX_VOCAB)


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
    rather than ln(vocab) (README "Initialisation"); `scale: 1` is the behaviour before this field."""

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
    dtype: Literal["float32", "float64"] = "float32"
    seed: Seed = 0
    """Seed of the weight initialisation and of every random projection and hash."""
    position: Position = Field(default_factory=lambda: NoPosition(kind="none"))
    """Position information: `learned` or `sinusoidal` (added to the embeddings), `rope` or `alibi`
    (in every mixer that does not name its own `position`), or `none`."""
    layers: Annotated[list[Layer], Field(min_length=1, max_length=limits.MAX_BLOCKS)]
    final_norm: Norm = Field(default_factory=lambda: LayerNormNode(kind="layernorm"))
    head: Head = Field(default_factory=lambda: LmHead(kind="lm"))
    init: Init = Field(default_factory=Init)
    """The initial weights' distributions (README "Initialisation")."""


MODELS = [LinearLowRank, LinearMixer, SoftmaxMixer, ScatterbrainMixer, DeltaMixer, Residuals, Block, Group, Spec]
"""Every model that holds components, leaves first (the order :func:`attnspec.spec.components.register`
rebuilds them in when a plugin adds a kind)."""
slot_fields_of(MODELS, globals())  # the fields that hold a slot's components, read from the annotations above
