"""Scatterbrain's IR: a low-rank part plus an exact sparse correction on a support."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs, NATIVE_CPU, TRITON
from attnspec.spec.nodes import Count, PositiveFloat
from attnspec.spec.supports import LowRank, LshSupport, PerformerLowRank, SparseSupport
from attnspec.spec.mixers.base import MixerComponent, _linear_family_costs


class ScatterbrainMixer(MixerComponent):
    """Scatterbrain: a low-rank estimate of exp(q.k) plus an exact sparse correction on a support."""

    projects_input: ClassVar[bool] = True
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
    sparse_weight: bool = False
    """A learnt weight per head on the exact terms, sigmoid(w_h) (LoLCATs' window factors): the support's weights
    are w_h exp(..) beside the low-rank ones; parameter `sparse_weight` (heads,) holds w's logit, at
    `sparse_weight_init` to start."""
    sparse_weight_init: Annotated[float, Field(ge=-30, le=30)] = -2.1972245773362196
    """The logit each head's `sparse_weight` starts at: LoLCATs' -2.197, a weight of 0.1."""
    sparse_scale: Literal["exact", "row_max"] = "exact"
    """The exact terms' scale: `exact`, exp(scale q_i.k_j) (Scatterbrain: on its support the weight is the
    softmax's own); `row_max`, exp(scale q_i.k_j - m_i), m_i the query's largest score on its support (LoLCATs':
    the window's softmax terms are on the scale of their row's maximum, the low-rank terms are not)."""

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

    def backends(self, mode: str) -> tuple[Backend, ...]:
        return (TRITON, NATIVE_CPU, GRAPH) if mode == "chunk" else (GRAPH,)  # the low-rank part's kernels

    def kernel_inputs(self, mode: str) -> KernelInputs:
        return KernelInputs(mode, self.causal, "none", self.feature_width(), widens_half=True)

    def feature_width(self) -> int:
        return self.lowrank.features().width(self.d_qk)

    def sparse_keys(self) -> int:
        return self.sparse.keys_per_query()

    def describe(self) -> str:
        extra = (", learnt sparse weights" if self.sparse_weight else "") + \
            (", row-max exact terms" if self.sparse_scale == "row_max" else "")
        return f"scatterbrain[{self.lowrank.kind} + {self.sparse.kind}{extra}] {self.on_heads()}"

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
