"""Softmax attention's IR: GQA, QK-norm, positions, a decay as log-bias, a window, a logit soft-cap, an output
gate."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.family import Cost, softmax_cost
from attnspec.spec.nodes import Count, Node, PositiveFloat, ShareName
from attnspec.spec.transitions import NoTransition, Transition
from attnspec.spec.mixers.base import MixerComponent, _softmax_decay_problems


class QueryExperts(Node):
    """A mixture of attention experts (JetMoE's MoA, Zhang et al. 2022's mixture of attention heads): `experts` pairs
    of a query projection (`heads` heads) and an output projection, sharing the keys and values; each token's
    router chooses `top_k` of them and weights them by a softmax over the chosen logits of W_r x_t:

        y_t = Σ_{e chosen} g_t,e W_o^e Attn(W_q^e x_t, K, V)

    Computed with every expert's queries (the unchosen weighted by 0): one attention of experts x heads query heads,
    its key/value cache the shared keys' alone. Parameters: `router.weight` (experts, d); the q projection's and the
    output projection's experts side by side (expert e's rows, and columns, the e-th `heads` x d block)."""

    experts: Count(limits.MAX_EXPERTS)
    top_k: Count(limits.MAX_EXPERTS)


class SoftmaxMixer(MixerComponent):
    """Softmax attention (quadratic only), optionally with a real decay as an additive log-bias."""

    projects_input: ClassVar[bool] = True
    kind: Literal["softmax"]
    transition: Transition = Field(default_factory=lambda: NoTransition(kind="none"))
    """Decay applied as the log-bias sum(log a) between positions (GateLoop sec. 3.4); real only."""
    window: Count(limits.MAX_LEN) | None = None
    """Sliding window: each position attends to the `window` most recent positions, itself included
    (causal only). Decoding keeps a ring buffer of that many keys and values: constant memory."""
    chunk: Count(limits.MAX_LEN) | None = None
    """Chunked attention (Llama 4's `attention_chunk_size`): position t attends to the positions s <= t of its own
    chunk of `chunk` positions, floor(s / chunk) = floor(t / chunk) (causal only; not with a window). Decoding
    keeps one chunk's keys and values: constant memory."""
    softcap: PositiveFloat | None = None
    """A tanh soft-cap on the attention logits (Gemma 2): each scaled score s becomes
    `softcap * tanh(s / softcap)` before the mask, the decay bias and the softmax."""
    sinks: bool = False
    """Attention sinks (gpt-oss, Granite SWA): a learned logit per head joins each query's softmax as a key
    with no value, so the weights on the real keys sum to less than 1 (parameter `sinks`, (heads,), zeros
    at initialisation)."""
    differential: bool = False
    """Differential attention (Ye et al. 2024, DIFF Transformer): key heads pair up, 2i with 2i + 1, and with
    them their query groups, head by head (with g = heads / kv_heads, query head 2gi + t pairs with
    2gi + g + t; without shared keys, head 2i with 2i + 1); each pair p attends with the difference of its two
    softmax maps, (A_first - λ A_second) V_i, over one value head of 2 d_v (value heads i: kv heads 2i and
    2i + 1's values side by side, so the projections keep their shapes). Each pair's output is RMS-normalised
    over its 2 d_v channels (no weight; eps `norm_eps`) and scaled by 1 - λ_init, the pairs' outputs then
    merged (heads x d_v wide) into the output projection. λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init, from
    four learnt vectors of d_qk (`lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2`, drawn from N(0, 0.1²))
    and λ_init = 0.8 - 0.6 exp(-0.3 l) at the block's depth l (from 0; not a weight). Needs an even number
    of key/value heads."""

    query_experts: QueryExperts | None = None
    """A mixture of attention experts (`QueryExperts`, JetMoE's): each token's queries and output projection from
    the `top_k` of `query_experts.experts` its router chooses; unset: one query projection."""

    v_norm: bool = False
    """RMS-normalise each value head over its d_v channels, without a weight (eps `norm_eps`), before attention
    (Gemma 3n and 4's `v_norm`)."""
    values_from_keys: bool = False
    """The values are the key projection's output, each key head's as it is before `qk_norm` and positions, and
    there is no value projection (Gemma 4's `attention_k_eq_v` on its global layers); needs d_v = d_qk."""
    lends_kv: ShareName | None = None
    """Lends this attention's keys and values, as its own attention reads them (after `qk_norm` and positions), to
    the later blocks whose attention says `kv_from` with this name, until a later block lends under the name."""
    kv_from: ShareName | None = None
    """Cross-layer key/value sharing (Gemma 3n and 4's `num_kv_shared_layers`; Brandon et al. 2024's cross-layer
    attention): this attention's queries read the keys and values of the latest earlier block that `lends_kv`
    under this name, and it has no key or value projection (nor a key norm) of its own. Its decoding state is
    the lender's cache, read, not written (and its own decay bias, where its positions (ALiBi) or its
    transition decay: its decay is its own, not the lender's); its key/value heads and widths, `causal`,
    `window` and `chunk` must be the lender's."""

    @property
    def reads_depth(self) -> bool:
        return self.differential

    @property
    def projects_kv(self) -> bool:
        """Whether it projects keys and values of its own (not when it reads another block's: `kv_from`)."""
        return self.kv_from is None

    @property
    def projects_values(self) -> bool:
        """Whether it has a value projection (not where the values are the keys' projection, nor another block's)."""
        return self.projects_kv and not self.values_from_keys

    @property
    def query_heads(self) -> int:
        experts = self.query_experts.experts if self.query_experts is not None else 1
        return experts * super().query_heads

    @property
    def output_heads(self) -> int:
        return self.query_heads if self.query_experts is not None else self.heads

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return {"quadratic": softmax_cost(L, self.output_heads, self.d_qk, self.d_v)}

    @property
    def has_step(self) -> bool:
        return self.causal

    @property
    def decode_mode(self) -> str | None:
        return None if not self.causal else "cache" if self.kv_from is None else "borrowed"

    def cache_capacity(self, max_len: int) -> int | None:
        # A window's ring holds the whole window even when it is longer than max_len: decoding goes
        # on past max_len (a window is unbounded), and every position within the window is read then.
        # a chunk's ring, likewise, holds a whole chunk
        return self.window if self.window is not None else self.chunk if self.chunk is not None else max_len

    def decode_limit(self, max_len: int) -> int | None:
        return None if self.window is not None or self.chunk is not None else max_len  # a ring never fills

    def mode_problem(self, mode: str) -> str:
        return (f"softmax attention has no finite feature expansion, so it can only be computed quadratically; "
                f"mode '{mode}' is impossible: use `mode: quadratic` or `auto`")

    @property
    def softmax_kernel(self) -> bool:
        return True

    def resolved_widths(self, d_model: int) -> dict[str, int] | None:
        """As every mixer's, except that values taken from the key projection (``values_from_keys``) are the
        keys: one width, the one set (``d_qk`` or ``d_v``), else d_model / heads."""
        widths = super().resolved_widths(d_model)
        if widths is not None and self.values_from_keys:
            width = self.d_qk or self.d_v or widths["d_qk"]
            widths = {**widths, "d_qk": width, "d_v": width}
        return widths

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        yield from _softmax_decay_problems(self.transition)
        if self.window is not None and not self.causal:
            yield ("window",), "a sliding window looks back over past positions, so it needs `causal: true`"
        if self.chunk is not None and not self.causal:
            yield ("chunk",), "chunked attention looks back within a chunk, so it needs `causal: true`"
        if self.chunk is not None and self.window is not None:
            yield ("chunk",), "a mixer attends within a window or within chunks: remove one of `window` and `chunk`"
        if self.differential:
            yield from self._differential_problems()
        if self.query_experts is not None:
            yield from self._query_expert_problems()
        if self.kv_from is not None:
            yield from self._borrowed_kv_problems()
        if self.values_from_keys:
            yield from self._values_from_keys_problems()
        if self.lends_kv is not None and self.differential:
            yield ("lends_kv",), ("differential attention reads its values as pairs of heads, which another "
                                  "attention would not: lend keys and values from plain attention")

    def _values_from_keys_problems(self) -> Iterator[tuple[tuple, str]]:
        if self.kv_from is not None:
            yield ("values_from_keys",), ("an attention reading another block's keys and values (`kv_from`) projects "
                                          "neither: remove `values_from_keys`")
        if self.d_qk is not None and self.d_v is not None and self.d_qk != self.d_v:
            yield ("values_from_keys",), (f"values taken from the key projection are d_qk = {self.d_qk} wide: set d_v "
                                          f"= d_qk (it is {self.d_v})")
        if self.qk_groups is not None or self.differential:
            yield ("values_from_keys",), ("values taken from the key projection need a value head per key head: "
                                          "remove `qk_groups` and `differential`")
        if set(self.conv.streams()) & {"k", "v"}:
            yield ("conv",), "values taken from the key projection: convolve `x` or `q` only"

    def _borrowed_kv_problems(self) -> Iterator[tuple[tuple, str]]:
        if self.lends_kv is not None:
            yield ("lends_kv",), (f"this attention reads the keys and values lent as '{self.kv_from}', so it has "
                                  "none of its own to lend: let later blocks read that name too")
        for name in ("differential", "query_experts", "skip", "v_norm"):
            if getattr(self, name) not in (None, False):
                yield (name,), f"an attention reading another block's keys and values (`kv_from`) has no `{name}`"
        if set(self.conv.streams()) & {"k", "v"}:
            yield ("conv",), ("an attention reading another block's keys and values (`kv_from`) projects none to "
                              "convolve: convolve `x` or `q` only")

    def _query_expert_problems(self) -> Iterator[tuple[tuple, str]]:
        experts = self.query_experts
        if experts.top_k > experts.experts:
            yield ("query_experts", "top_k"), f"top_k = {experts.top_k} chooses more than the {experts.experts} experts"
        for name in ("qk_groups", "differential", "sinks", "output_gate", "group_norm", "skip"):
            if getattr(self, name) not in (None, False, "none"):
                yield (name,), (f"a mixture of attention experts has no `{name}` (each expert is plain attention): "
                                "remove it")
        if not self.transition.is_identity:
            yield ("transition",), "a mixture of attention experts has no decay: remove the transition"

    def _differential_problems(self) -> Iterator[tuple[tuple, str]]:
        if self.key_heads % 2:
            yield ("differential",), (f"differential attention pairs key heads, and there are {self.key_heads}: "
                                      "use an even `kv_heads` (or `heads` without shared keys)")
        if self.qk_groups is not None:
            yield ("differential",), ("differential attention pairs key/value heads; it takes `kv_heads`, not "
                                      "`qk_groups`")
        for name in ("group_norm", "gate_per_head", "skip"):
            if getattr(self, name):
                yield (name,), (f"differential attention normalises each pair of heads itself, whose outputs are "
                                f"{self.heads // 2} heads of 2 d_v: remove `{name}`")

    def describe(self) -> str:
        parts = [f"window {self.window}"] if self.window is not None else []
        if self.chunk is not None:
            parts.append(f"chunks of {self.chunk}")
        if self.softcap is not None:
            parts.append(f"logits capped at {self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        if self.differential:
            parts.append("differential")
        if self.query_experts is not None:
            parts.append(f"{self.query_experts.top_k} of {self.query_experts.experts} query experts")
        if self.values_from_keys:
            parts.append("v = k")
        if self.lends_kv is not None:
            parts.append(f"lends kv as '{self.lends_kv}'")
        if self.kv_from is not None:
            parts.append(f"kv from '{self.kv_from}'")
        if self.kv_heads is not None:
            parts.append(f"{self.kv_heads} kv heads")
        if not self.transition.is_identity:
            parts.append(f"{self.transition.kind} decay")
        return f"softmax[{', '.join(parts)}] {self.on_heads()}" if parts else f"softmax {self.on_heads()}"
