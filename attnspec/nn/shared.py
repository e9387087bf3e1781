"""Shared blocks (the spec's ``shared``; Zamba's shared attention): one block's weights called from several
blocks, each call with its own projection, low-rank adapters and decoding state.

A call runs a *view* of the shared block: a copy whose every parameter and buffer is the shared block's
own tensor (tied), with the projections the spec's ``adapt`` names wrapped in the call's adapters. The
view is a registered module (so compile, export and ``.to()`` see one model), and its names, all aliases,
are left out of the state dict, which keeps each tensor once under ``shared_blocks.<name>``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LowRankAdapter(nn.Module):
    """One use's adapter of a shared projection W (out, d_in): x -> B A x, A = ``down`` (rank, d_in) drawn as
    nn.Linear draws, B = ``up`` (out, rank) zero, so a new adapter changes nothing (LoRA's start)."""

    def __init__(self, d_in: int, rank: int, out: int):
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, out, bias=False)
        nn.init.zeros_(self.up.weight)


class Adapted(nn.Module):
    """A shared projection with one use's adapter: base(x) + B[rows] A x (``rows``: the part of the adapter's
    output that is this projection's, when one adapter spans several, as a GLU's two input projections)."""

    def __init__(self, base: nn.Linear, adapter: LowRankAdapter, rows: tuple[int, int]):
        super().__init__()
        self.base, self.adapter, self.rows = base, adapter, rows

    def forward(self, x: Tensor) -> Tensor:
        start, stop = self.rows
        return self.base(x) + F.linear(self.adapter.down(x), self.adapter.up.weight[start:stop])


VIEW = "tied_view"
"""The attribute of a :class:`SharedUse` holding its view of the shared block: every tensor there is
the shared block's or the use's adapters', so its names are aliases, left out of the state dict."""


class SharedUse(nn.Module):
    """One block's call of a shared block (:class:`attnspec.spec.ir.SharedUse`; ``shared`` its
    :class:`~attnspec.spec.ir.SharedBlock`, ``canonical`` the model's :class:`~attnspec.nn.model.Block` of it):
    S(x) or S([x, embeddings]), through this use's ``proj`` (d_model, d_model) where the spec asks.

    ``tied_view`` is the shared block as this use runs it: a copy whose every parameter and buffer *is* the
    shared block's (tied: one tensor, trained by every use), with the projections the spec's ``adapt``
    names wrapped in this use's :class:`Adapted` (``adapters``). It has its own decoding state and plan.
    Its names are aliases: the state dict leaves them out (the shared block's own are under
    ``shared_blocks.<name>``) and loading does not ask for them.
    """

    def __init__(self, use, shared, canonical: nn.Module, *, d_model: int):
        super().__init__()
        self.wide = shared.reads == "hidden_and_embeddings"
        self.proj = nn.Linear(d_model, d_model, bias=False) if use.projection else None
        view = copy.deepcopy(canonical)
        for mine, theirs in zip(view.modules(), canonical.modules()):  # the same structure, module by module
            mine._parameters.update(theirs._parameters)
            mine._buffers.update(theirs._buffers)
        self.adapters = nn.ModuleDict()
        if shared.adapter_rank is not None:
            d_in = 2 * d_model if self.wide else d_model
            for target in shared.adapt:
                owner, names = (view.mlp, ["up", "gate"]) if target == "mlp" else (view.mixer, [f"{target}_proj"])
                bases = [getattr(owner, name) for name in names if getattr(owner, name, None) is not None]
                adapter = LowRankAdapter(d_in if target != "mlp" else d_model, shared.adapter_rank,
                                         sum(base.out_features for base in bases))
                self.adapters[target] = adapter
                start = 0
                for name, base in zip(names, bases):
                    setattr(owner, name, Adapted(base, adapter, (start, start + base.out_features)))
                    start += base.out_features
        setattr(self, VIEW, view)
        # how many tensors of the calling block's state are this use's (its last ones)
        self.state_count = len(view.init_state(1, torch.float32, torch.device("meta"))) if view.has_step else 0
        self.register_state_dict_post_hook(_drop_view_names)
        self.register_load_state_dict_post_hook(_view_names_not_missing)

    def _input(self, x: Tensor, embeddings: Tensor | None) -> Tensor:
        return torch.cat([x, embeddings], dim=-1) if self.wide else x

    def _output(self, y: Tensor) -> Tensor:
        return y if self.proj is None else self.proj(y)

    def forward(self, x: Tensor, embeddings: Tensor | None, documents=None) -> Tensor:
        """x, embeddings (B, L, d_model) -> what joins the calling block's mixer input (B, L, d_model);
        ``documents``: packed documents (:class:`attnspec.ops.documents.Documents`)."""
        return self._output(self.tied_view(self._input(x, embeddings), documents=documents))

    def step(self, x: Tensor, embeddings: Tensor | None, state: tuple[Tensor, ...],
             position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One position (B, d_model) through the shared block and its state at this use."""
        y, state = self.tied_view.step(self._input(x, embeddings), state, position)
        return self._output(y), state

    def prefill(self, x: Tensor, embeddings: Tensor | None,
                capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """A prompt (B, L, d_model) through the shared block, and its state at this use after it (caches of
        ``capacity`` positions if given)."""
        y, state = self.tied_view.prefill(self._input(x, embeddings), capacity=capacity)
        return self._output(y), state


def _drop_view_names(module: SharedUse, state_dict: dict, prefix: str, local_metadata) -> None:
    for name in [name for name in state_dict if name.startswith(f"{prefix}{VIEW}.")]:
        del state_dict[name]


def _view_names_not_missing(module: SharedUse, incompatible) -> None:
    incompatible.missing_keys[:] = [name for name in incompatible.missing_keys if f".{VIEW}." not in name]


__all__ = ["Adapted", "LowRankAdapter", "SharedUse", "VIEW"]
