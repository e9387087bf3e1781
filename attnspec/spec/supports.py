"""Scatterbrain's parts (two slots): the low-rank part and the sparse support."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.nodes import Component, Count, Seed
from attnspec.spec.features import Elu1Features, FeatureMap, FeatureMapComponent, PerformerFeatures


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
    scaled_inputs: bool = True
    """The feature map reads q and k times sqrt(scale), so that φ(q).φ(k) estimates exp(scale q.k) for an
    exponential-like map; false: it reads them as they are (LoLCATs' Hedgehog maps, learnt to match the softmax
    themselves)."""

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


__all__ = ["LowRankComponent", "PerformerLowRank", "LinearLowRank", "LowRank", "SparseComponent", "LshSupport",
           "LocalSupport", "BlockSupport", "TopkSupport", "SparseSupport"]
