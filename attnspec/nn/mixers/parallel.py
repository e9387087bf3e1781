"""Parallel branches (:class:`attnspec.spec.mixers.parallel.ParallelMixer`): each branch a mixer module
of its own family, all reading the same input, their outputs weighted and summed; the branches' decoding
states side by side in one flat tuple."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer, holding
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents


@register("mixer", "parallel")
class ParallelMixer(Mixer):
    """y = Σ_b w_b branch_b(x). Setting ``mode`` hands each branch the mode it runs then (the IR's
    :meth:`~attnspec.spec.mixers.parallel.ParallelMixer.branch_mode`, tabled at build)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, depth: int = 0):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        self.branches = nn.ModuleList(build("mixer", branch, d_model=d_model, max_len=max_len, seed=seed + 104729 * i,
                                            **({"depth": depth} if branch.reads_depth else {}))
                                      for i, branch in enumerate(node.branches))
        # block mode -> each branch's mode, from the IR's one rule
        self.branch_modes = {mode: tuple(node.branch_mode(branch, mode) for branch in node.branches)
                             for mode in node.modes()}
        self.weights = list(node.weights or [1.0] * len(node.branches))
        meta = torch.device("meta")
        self.state_counts = [len(branch.init_state(1, torch.float32, meta)) if branch.has_step else 0
                             for branch in self.branches]
        self.mode = self._mode  # now that the branches exist, hand them the planned mode

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = mode
        if "branches" in self._modules:  # the base class sets the planned mode before the branches exist
            for branch, branch_mode in zip(self.branches, self.branch_modes[mode]):
                branch.mode = branch_mode

    def projections(self) -> list[nn.Linear]:
        return [projection for branch in self.branches for projection in branch.projections()]

    def projection_groups(self) -> list[tuple[list[nn.Linear], float]]:
        return [group for branch in self.branches for group in branch.projection_groups()]

    def residual_writers(self) -> list[Tensor]:
        return [weight for branch in self.branches for weight in branch.residual_writers()]

    def state_size(self, length: int) -> int:
        return sum(branch.state_size(length) for branch in self.branches)

    def regularization_loss(self) -> Tensor | None:
        terms = [t for branch in self.branches if (t := branch.regularization_loss()) is not None]
        return sum(terms) if terms else None

    def _weighted(self, outputs: list[Tensor]) -> Tensor:
        total = None
        for weight, y in zip(self.weights, outputs):
            y = y * weight if weight != 1.0 else y
            total = y if total is None else total + y
        return total

    @property
    def takes_documents(self) -> bool:
        return all(branch.takes_documents for branch in self.branches)

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        extra = {} if documents is None else {"documents": documents}
        return self._weighted([branch(x, branch_mode, **extra)
                               for branch, branch_mode in zip(self.branches, self.branch_modes[mode])])

    # -- decoding: the branches' states in branch order
    def _split(self, state: tuple[Tensor, ...]) -> list[tuple[Tensor, ...]]:
        parts, start = [], 0
        for count in self.state_counts:
            parts.append(tuple(state[start:start + count]))
            start += count
        return parts

    @property
    def prefills_in_one_pass(self) -> bool:
        return all(branch.prefills_in_one_pass for branch in self.branches)

    def prefill(self, x: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The branches' prefills; ``capacity`` reaches the branches whose state holds positions."""
        outputs, state = [], ()
        for branch in self.branches:
            y, branch_state = branch.prefill(x, **holding(branch, capacity))
            outputs.append(y)
            state += tuple(branch_state)
        return self._weighted(outputs), state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        return tuple(t for branch in self.branches
                     for t in branch.init_state(batch, dtype, device, **holding(branch, capacity)))

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        outputs, new_state = [], ()
        for branch, branch_state in zip(self.branches, self._split(state)):
            y, branch_state = branch.step(x_t, branch_state, position)
            outputs.append(y)
            new_state += tuple(branch_state)
        return self._weighted(outputs), new_state
