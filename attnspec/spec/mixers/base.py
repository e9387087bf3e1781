"""The base of a mixer family (the public base of plugin families too): the fields every mixer has, and
the facts planning, lowering, verification and decoding read."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs, linear_costs, noncausal_linear_cost
from attnspec.spec.nodes import Component, Count, PositiveFloat
from attnspec.spec.features import FeatureMapComponent
from attnspec.spec.transitions import TransitionComponent
from attnspec.spec.positions import NoPosition, Position, PositionComponent
from attnspec.spec.convs import Conv, NoConv


Mode = Literal["auto", "recurrent", "scan", "chunk", "quadratic"]
OutputGate = Literal["none", "sigmoid", "swish", "softplus"]


class MixerComponent(Component):
    """The base of a mixer *family* (the public base for plugin families): its fields are what every
    mixer has; its methods are the facts the planner, lowering, verification and decoding read
    (:mod:`attnspec.spec.family`). A family overrides ``modes``, ``mode_costs`` and, where it has
    kernels, ``backends``; a decoding step is ``has_step`` here and ``init_state``/``step`` on its
    implementation (the ``nn.Module`` registered for its kind, or ``implementation = "module:Class"``)."""

    required_overrides: ClassVar[tuple[str, ...]] = ("modes", "mode_costs")
    """What a plugin family must state itself (:func:`attnspec.spec.components.register` checks)."""
    not_applicable: ClassVar[tuple[str, ...]] = ()
    """Fields of the base that this family has no place for: setting one is a located error."""
    single_stream: ClassVar[str | None] = None
    """For a family computed in position order over its values alone (Mamba-1, the RG-LRU, the gated
    convolution): what it is, in words ("the RG-LRU"). The base rules then require `causal`, refuse a
    `scale` and a `position` (it orders positions itself), and take a convolution of the values alone
    (`short` on `[v]`, or `none` where `conv_optional`)."""
    conv_optional: ClassVar[bool] = True
    indivisible: ClassVar[str] = ("so d_qk/d_v cannot be derived; choose heads dividing d_model or set d_qk and "
                                  "d_v")
    """What the rule says where :meth:`resolved_widths` finds the width not divisible by ``heads``."""
    projects_input: ClassVar[bool] = False
    """The family reads its input only through q/k/v projections and its own input maps (the attention-like
    families built on ``ProjectedMixer``), so it can read an input wider than d_model (a shared block
    reading [hidden, embeddings]) and carry per-use adapters on its `q`, `k` and `v` projections."""
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
    """Gate on the mixer output before the output projection: y * act(W_g x), act a sigmoid, SiLU (`swish`) or
    softplus (Laguna's, unbounded above)."""
    gate_per_head: bool = False
    """One gate value per head (W_g `heads` rows wide), multiplying every channel of its head (Laguna's
    `gating: per-head`); false: one per channel."""
    gate_rank: Count(limits.MAX_HEAD_WIDTH) | None = None
    """A low-rank output gate W_g = W_b W_a of this inner width (Kimi Linear's g_a, g_b); unset: full rank."""
    group_norm: bool = False
    """Per-head normalisation (RMS) of the mixer output, as in RetNet/GateLoop."""
    norm_span: Literal["head", "group", "full"] = "head"
    """What the output norm (`group_norm`) takes the RMS over, before the output gate: each head's channels;
    each query/key group's heads together (`qk_groups`; Falcon-H1's gated norm with `norm_before_gate`); or
    the whole output, every head together (MiniMax's lightning attention)."""
    norm_center: bool = False
    """Subtract the mean before the output norm's RMS: a LayerNorm per head (or over the whole output with
    `norm_span: full`) rather than an RMSNorm (xLSTM's multi-head LayerNorm)."""
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
    qk_norm: Literal["none", "rmsnorm", "rmsnorm_full", "layernorm", "rmsnorm_unweighted"] = "none"
    """RMSNorm of each query and key head (a learnt weight per channel, shared by the heads), before
    positions and features (Qwen3); `rmsnorm_full`: of the whole query and key projections, every head
    together, a weight per channel of the projection (OLMo 2 and 3); `layernorm`: a LayerNorm of each head,
    the mean subtracted first, with a learnt weight and bias per channel shared by the heads (Persimmon);
    `rmsnorm_unweighted`: each head's RMSNorm without a weight (nanochat's, Llama 4's L2 norm)."""
    qk_norm_after_rope: bool = False
    """Normalise q and k after RoPE rotates them rather than before (Hunyuan V1); needs a per-head
    `qk_norm` (`rmsnorm` or `layernorm`)."""
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
    query_scale_beta: Annotated[float, Field(ge=0, le=100)] = 0.0
    """Queries times 1 + β ln(1 + floor((t + query_scale_offset) / query_scale_period)) after the positions act:
    attention sharpened by steps past each period of positions (Llama 4's temperature tuning on its layers without
    RoPE; Ministral 3's `llama_4_scaling_beta`). 0: none."""
    query_scale_period: Annotated[int, Field(gt=0, le=limits.MAX_LEN)] | None = None
    """The positions per step of `query_scale_beta` (Ministral 3: `original_max_position_embeddings`; Llama 4:
    `floor_scale`)."""
    query_scale_offset: Annotated[int, Field(ge=0, le=limits.MAX_LEN)] = 0
    """Added to the position before it is divided (Llama 4 counts from t + 1)."""
    qkv_clip: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """Clamp each q, k and v projection's output to [-clip, clip] before anything reads it (DBRX's `clip_qkv`)."""
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
        """The kernels that may run ``mode`` for this mixer, in order of preference (the graph path last);
        which of them applies to a call is each kernel's predicate in :mod:`attnspec.ops.kernels`."""
        return (GRAPH,)

    def kernel_inputs(self, mode: str) -> KernelInputs:
        """What ``mode`` hands its kernel, as the kernels' predicates read it (a family with kernels of
        its own states its decay and key width)."""
        return KernelInputs(mode, self.causal)

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
        return f"{self.kind} {self.on_heads()}"

    def on_heads(self) -> str:
        """How many heads, for :meth:`describe`: "on 4 heads"."""
        return f"on {self.heads} head{'s' if self.heads != 1 else ''}"

    def parts(self) -> list[tuple[str, str]]:
        """Every part this mixer has, as (name, what) rows for ``explain``: its heads and widths, then
        each field set away from its default, a component as its kind and its own fields set away from
        theirs (QK-norm, a partial RoPE, an output gate, short convolutions, a window, shared kv heads).
        Read off the fields, so a plugin family's parts show as a shipped family's do."""
        rows = [("heads", f"{self.heads} (d_qk {self.d_qk}, d_v {self.d_v})")]
        for name, value in self.model_dump(exclude_defaults=True, exclude={"kind", "heads", "d_qk", "d_v"}).items():
            field = getattr(self, name)
            if isinstance(field, Component) and field.is_identity:
                continue  # `none`: not a part
            rows.append((name, part_text(field) if isinstance(field, Component) else _value_text(value)))
        return rows

    def resolved_widths(self, d_model: int) -> dict[str, int] | None:
        """The widths unset fields resolve to in a model of width ``d_model`` (``d_qk`` and ``d_v``:
        d_model / heads); None where one is unset and d_model does not divide into the heads (a rule
        reports it). A family without such widths resolves nothing (``{}``)."""
        if (self.d_qk is None or self.d_v is None) and d_model % self.heads:
            return None
        return {"d_qk": self.d_qk or d_model // self.heads, "d_v": self.d_v or d_model // self.heads}

    def sub_mixers(self) -> list[tuple[tuple, "MixerComponent"]]:
        """The mixers this one holds, as (path below it, mixer): a parallel mixer's branches; else none.
        Rules and resolution apply to each as to a block's mixer."""
        return []

    def resolved_sub_mixers(self, resolve_one) -> dict[str, Any]:
        """The fields holding :meth:`sub_mixers`, each mixer passed through ``resolve_one``."""
        return {}

    def resolved_parts(self, *, d_qk: int, max_len: int) -> dict[str, Any]:
        """Its parts with their derived defaults filled in (``model_copy`` updates), for resolution."""
        return {name: features.resolved(d_qk) for name, features in self.parts_of(FeatureMapComponent)}

    def parts_of(self, slot_type: type) -> list[tuple[str, Any]]:
        """This mixer's fields that hold a component of ``slot_type`` (a feature map, a transition), as
        (field name, component): shared rules find a family's parts by their type, not their names."""
        return [(name, value) for name in type(self).model_fields
                if isinstance(value := getattr(self, name), slot_type)]

    def resolved_position(self, model_position: PositionComponent) -> PositionComponent:
        """The scheme this mixer applies: its own, else the model's when that acts on q/k or as a decay
        (never for a `single_stream` family, which orders positions itself)."""
        if self.position is not None or self.single_stream:
            return self.position or NoPosition(kind="none")
        return model_position if model_position.acts_on in ("qk", "decay") else NoPosition(kind="none")

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        """Rule violations of this mixer and its parts, as (path below the mixer, message)."""
        if self.mode != "auto" and self.mode not in self.modes():
            yield ("mode",), self.mode_problem(self.mode)
        if self.single_stream:
            yield from self._single_stream_problems()
        for name in self.not_applicable:
            if getattr(self, name) != type(self).model_fields[name].get_default(call_default_factory=True):
                yield (name,), f"a {self.kind} mixer has no `{name}` (it is a part of other families): remove it"
        transitions = self.parts_of(TransitionComponent)
        for name, transition in transitions:
            if not transition.is_identity and not self.causal:
                yield (name,), ("a state transition orders positions, so it needs `causal: true`; "
                                "remove the transition or make the mixer causal")
            for below, message in transition.problems():
                yield (name, *below), message
            if transition.scales_input and not self.scales_input:
                yield (name, "scale_input"), (f"a {self.kind} mixer has no input for Δ_t to scale; remove "
                                              "scale_input")
        if self.position is not None:
            if self.position.acts_on == "embedding":
                yield ("position",), (f"{self.position.kind} positions are added to the token embeddings; write "
                                      f"`position: {self.position.kind}` at the model level, not on a mixer")
            for below, message in self.position.problems(causal=self.causal, d_qk=d_qk):
                yield ("position", *below), message
            if self.position.acts_on == "decay" and not transitions:
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
        if self.qk_norm_after_rope and self.qk_norm not in ("rmsnorm", "layernorm", "rmsnorm_unweighted"):
            yield ("qk_norm_after_rope",), ("qk_norm_after_rope places a per-head QK-norm after RoPE: set "
                                            "`qk_norm: rmsnorm`, `layernorm` or `rmsnorm_unweighted`, or remove it")
        if (self.query_scale_beta > 0) != (self.query_scale_period is not None):
            yield ("query_scale_period",), ("a query scale needs both its β (query_scale_beta > 0) and its period "
                                            "(query_scale_period): set both or neither")
        if self.gate_per_head and (self.output_gate == "none" or self.gate_before_norm):
            yield ("gate_per_head",), ("gate_per_head shapes the output gate: set `output_gate`, without "
                                       "`gate_before_norm` (whose gate is inside the norm)")
        if self.gate_rank is not None and self.output_gate == "none":
            yield ("gate_rank",), "gate_rank factors the output gate's projection: set `output_gate` too"
        if self.gate_before_norm and not (self.group_norm and self.output_gate == "swish"):
            yield ("gate_before_norm",), ("gate_before_norm orders a gated norm, which needs `group_norm: true` "
                                          "and `output_gate: swish`")
        if self.shared_norm_weight and (not self.group_norm or self.gate_before_norm):
            yield ("shared_norm_weight",), ("a shared norm weight is the per-head output norm's: it needs "
                                            "`group_norm: true` without `gate_before_norm`")
        if self.norm_center and (not self.group_norm or self.gate_before_norm):
            yield ("norm_center",), ("centring is the output norm's (`group_norm: true`), before the gate: remove "
                                     "`gate_before_norm`")
        if self.norm_span != "head" and (not self.group_norm or self.gate_before_norm or self.shared_norm_weight):
            span = "groups of heads" if self.norm_span == "group" else "the whole output"
            yield ("norm_span",), (f"a norm over {span} is the output norm's (`group_norm: true`) with a "
                                   "weight per channel: remove `gate_before_norm` and `shared_norm_weight`")

    def _single_stream_problems(self) -> Iterator[tuple[tuple, str]]:
        what = self.single_stream
        if not self.causal:
            yield ("causal",), f"{what} is computed in position order: it needs `causal: true`"
        if self.scale not in (None, 1.0):
            yield ("scale",), f"{what} has no scores to scale: remove `scale`"
        if self.position is not None and not self.position.is_identity:
            yield ("position",), f"{what} orders positions itself: remove `position` (or set `none`)"
        values_only = self.conv.kind == "short" and self.conv.projections == ["v"]
        if not values_only and not (self.conv.is_identity and self.conv_optional):
            yield ("conv",), (f"{what} convolves its values alone: `conv: {{kind: short, projections: [v]}}`"
                              + (" or `none`" if self.conv_optional else ""))

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
    def output_heads(self) -> int:
        """Heads whose outputs the output projection reads: ``heads`` (a mixture of attention experts reads every
        expert's)."""
        return self.heads

    @property
    def value_heads(self) -> int:
        """Heads of distinct values: ``kv_heads`` where they are shared, else ``heads``."""
        return self.kv_heads or self.heads

    @property
    def decode_mode(self) -> str | None:
        """How one token is decoded: ``recurrent`` (a constant-size state), ``cache`` (a key/value cache of
        :meth:`cache_capacity` positions), ``borrowed`` (another block's cache, read: cross-layer sharing),
        ``prefix`` (the inputs so far, the mixer rerun over them) or None (no decoding step)."""
        return "recurrent" if self.has_step else None

    def cache_capacity(self, max_len: int) -> int | None:
        """Positions a ``cache`` decoding state holds (None: no cache)."""
        return None

    @property
    def reads_depth(self) -> bool:
        """Its module is told the block's depth (its index in the model, from 0) at construction: a part whose
        initial value follows depth (differential attention's λ_init)."""
        return False

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


__all__ = ["Mode", "OutputGate", "MixerComponent"]


def part_text(component: Component) -> str:
    """A component as its kind and the fields it sets away from their defaults: "rope (rotary_fraction 0.5)"
    (``explain`` shows mixers' parts and blocks' MLPs so)."""
    own = component.model_dump(exclude_defaults=True, exclude={"kind"})
    return component.kind + (f" ({', '.join(f'{k} {_value_text(v)}' for k, v in own.items())})" if own else "")


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):  # a component "kind (fields)"; a plain node (an indexer) its fields alone
        fields = ", ".join(f"{k} {_value_text(v)}" for k, v in value.items() if k != "kind")
        kind = value.get("kind", "")
        return f"{kind} ({fields})" if kind and fields else kind or fields
    if isinstance(value, list):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, float) else str(value)

