"""Parallel branches: several mixers side by side on the same normalised input, their outputs summed
(Falcon-H1's attention beside Mamba2, Hymba's heads)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs
from attnspec.spec.mixers.base import MixerComponent
from attnspec.spec.positions import NoPosition, PositionComponent

Weight = Annotated[float, Field(gt=0, le=1e4)]


class ParallelMixer(MixerComponent):
    """y = Σ_b w_b f_b(x): each branch a whole mixer of any family (its own heads, parts, state), all
    reading the block's normalised input x; `weights` are the per-branch output multipliers (Falcon-H1's
    `ssm_out_multiplier` and `attention_out_multiplier`). Summing is also what concatenating the branches'
    outputs before one output projection computes, since each branch ends in its own projection.

    Its mode names the branches' computation: a branch runs the block's mode where it has it (and its
    spec does not force one), else its own first mode, so [Mamba2, softmax] in `chunk` is Mamba2 chunked
    beside quadratic softmax attention; its cost is the branches' summed. It decodes when every branch
    does, with their states side by side."""

    kind: Literal["parallel"]
    not_applicable: ClassVar[tuple[str, ...]] = ("kv_heads", "qk_groups", "qk_norm", "qk_norm_after_rope", "qkv_clip",
                                                 "query_scale_beta", "output_gate", "gate_per_head", "gate_rank",
                                                 "group_norm", "norm_span", "norm_center", "gate_before_norm",
                                                 "shared_norm_weight", "skip", "conv", "qkv_bias", "out_bias", "heads",
                                                 "d_qk", "d_v")
    """Every part belongs to a branch: set it there."""
    # a list of the `mixer` slot's components, typed so where the slot is declared (attnspec.spec.mixers)
    branches: Annotated[list[Any], Field(min_length=2, max_length=8)]
    """The mixers side by side (any family but `parallel` and `none`)."""
    weights: Annotated[list[Weight], Field(min_length=2, max_length=8)] | None = None
    """A multiplier on each branch's output, in the order of `branches`; unset: 1 each."""

    def branch_mode(self, branch: MixerComponent, mode: str) -> str:
        """The mode ``branch`` runs when the block runs ``mode``."""
        if branch.mode != "auto":
            return branch.mode
        return mode if mode in branch.modes() else branch.modes()[0]

    def modes(self) -> tuple[str, ...]:
        found: list[str] = []
        for branch in self.branches:
            found += [mode for mode in branch.modes() if mode not in found and branch.mode == "auto"]
        return tuple(found) or (self.branches[0].modes()[0],)

    def mode_costs(self, L: int) -> dict[str, Cost]:
        costs = {}
        for mode in self.modes():
            parts = [branch.mode_costs(L)[self.branch_mode(branch, mode)] for branch in self.branches]
            costs[mode] = Cost(macs=sum(c.macs for c in parts), bytes=sum(c.bytes for c in parts),
                               state_bytes=sum(c.state_bytes for c in parts),
                               sequential_steps=sum(c.sequential_steps for c in parts))
        return costs

    def _named_by(self, mode: str) -> MixerComponent | None:
        """The first branch that runs ``mode`` as its own (the branch a plan's mode and kernel are about)."""
        return next((b for b in self.branches if b.mode == "auto" and mode in b.modes()), None)

    def backends(self, mode: str) -> tuple[Backend, ...]:
        branch = self._named_by(mode)
        return branch.backends(mode) if branch is not None else (GRAPH,)

    def kernel_inputs(self, mode: str) -> KernelInputs:
        branch = self._named_by(mode)
        return branch.kernel_inputs(mode) if branch is not None else KernelInputs(mode, self.causal)

    @property
    def has_step(self) -> bool:
        return all(branch.has_step for branch in self.branches)

    @property
    def decode_mode(self) -> str | None:
        modes = {branch.decode_mode for branch in self.branches}
        for mode in (None, "prefix", "cache"):  # the most a branch needs, the whole block needs
            if mode in modes:
                return mode
        return "recurrent"

    def cache_capacity(self, max_len: int) -> int | None:
        held = [c for branch in self.branches if (c := branch.cache_capacity(max_len)) is not None]
        return max(held) if held else None

    def decode_limit(self, max_len: int) -> int | None:
        limits_ = [c for branch in self.branches if (c := branch.decode_limit(max_len)) is not None]
        return min(limits_) if limits_ else None

    @property
    def reads_depth(self) -> bool:
        return any(branch.reads_depth for branch in self.branches)

    def sub_mixers(self) -> list[tuple[tuple, MixerComponent]]:
        return [(("branches", index), branch) for index, branch in enumerate(self.branches)]

    def resolved_widths(self, d_model: int) -> dict[str, int]:
        return {}

    def resolved_position(self, model_position: PositionComponent) -> PositionComponent:
        return NoPosition(kind="none")  # each branch resolves its own

    def resolved_sub_mixers(self, resolve_one) -> dict[str, Any]:
        return {"branches": [resolve_one(branch) for branch in self.branches]}

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.scale not in (None, 1.0):
            yield ("scale",), "a parallel mixer has no scores of its own: set `scale` on a branch"
        if self.position is not None and not self.position.is_identity:
            yield ("position",), "each branch takes its own `position`: set it there"
        for index, branch in enumerate(self.branches):
            if branch.kind in ("parallel", "none"):
                yield ("branches", index, "kind"), f"a branch is a mixer of its own, not `{branch.kind}`"
            if branch.causal != self.causal:
                yield ("branches", index, "causal"), ("every branch and the parallel mixer are causal alike: set "
                                                      f"`causal: {str(self.causal).lower()}` on each")
        if self.weights is not None and len(self.weights) != len(self.branches):
            yield ("weights",), f"one weight per branch: {len(self.branches)} branches, {len(self.weights)} weights"

    def parts(self) -> list[tuple[str, str]]:
        rows = [(f"branch {index}", branch.describe()) for index, branch in enumerate(self.branches)]
        return rows + ([("weights", ", ".join(f"{w:g}" for w in self.weights))] if self.weights else [])

    def describe(self) -> str:
        return "parallel[" + " + ".join(branch.describe() for branch in self.branches) + "]"


__all__ = ["ParallelMixer"]
