"""Exporting with ``torch.export``: the model with dynamic batch and length, the prompt's prefill (dynamic
batch and length) and the decoding step (dynamic batch).

The exported programs load with ``torch.export.load`` and run without attnspec installed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from attnspec.compiler.tracing import example_input, size_oblivious
from attnspec.nn.model import Model


class DecodeStep(nn.Module):
    """``forward(token, *state) -> (logits, *state)``: the model's one-token step as a plain module (the
    state is updated in place and returned as the same tensors, in the exported program too)."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, token: torch.Tensor, *state: torch.Tensor):
        return self.model.step(token, *state)


class Prefill(nn.Module):
    """``forward(inputs (B, L) tokens, *state) -> (logits (B, 1, vocab) at the last position, *state)``: the
    prompt's pass as a plain module, writing the state :class:`DecodeStep` continues from into ``state``
    (B rows of ``Model.init_state``, allocated once for the generation at the capacity it reaches) in
    place and returning the same tensors."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, *state: torch.Tensor):
        return self.model.prefill(inputs, last_only=True, into=state)


def export_model(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export ``model.forward`` with dynamic batch (1..4096) and length (2..max_len) to ``path``."""
    inputs = example_input(model, 3, min(17, model.spec.max_len))
    return _export(model, (inputs,), ({0: BATCH, 1: _length(model)},), path)


def export_step(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export the one-token decoding step with dynamic batch and capacity (the positions full caches hold,
    up to ``max_len``: :meth:`Model.capacity_axes`); the state tensors are explicit inputs/outputs."""
    state = _example_state(model)
    token = torch.zeros(3, dtype=torch.long, device=state[0].device)
    return _export(DecodeStep(model), (token, *state), ({0: BATCH}, _state_shapes(model)), path)


def export_prefill(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export the prompt's prefill (:class:`Prefill`) with dynamic batch (1..4096), length (2..max_len) and
    capacity (that of the state it writes, as :func:`export_step`)."""
    state = _example_state(model)
    inputs = example_input(model, 3, max(2, min(17, model.spec.max_len - 1)))  # (a length the capacity is not)
    return _export(Prefill(model), (inputs, *state), ({0: BATCH, 1: _length(model)}, _state_shapes(model)), path)


BATCH = Dim("batch", min=1, max=4096)
_EXAMPLE_CAPACITY = 29
"""The capacity the example state of an export is made with: a size no other example size has (3 rows, 17
positions), so tracing takes none of them for another."""


def _length(model: Model) -> Dim:
    return Dim("length", min=2, max=max(model.spec.max_len, 3))


def _example_state(model: Model) -> tuple[torch.Tensor, ...]:
    """A state of 3 rows at :data:`_EXAMPLE_CAPACITY` (or ``max_len`` where smaller), its layout and capacity
    axes counted first (counted while tracing, their meta tensors would stay in the program as ops)."""
    model.state_layout()
    model.capacity_axes()
    return model.init_state(3, min(_EXAMPLE_CAPACITY, model.spec.max_len))


def _state_shapes(model: Model) -> tuple[dict, ...]:
    """The dynamic dimensions of every state tensor: the batch, and the capacity axis where it has one (one
    ``Dim`` for all: the positions every full cache of a generation holds)."""
    capacity = Dim("capacity", min=2, max=max(model.spec.max_len, 3))
    return tuple({0: BATCH} if axis is None else {0: BATCH, 1 + axis: capacity} for axis in model.capacity_axes())


def _export(module: nn.Module, args: tuple, shapes: tuple, path: Path) -> torch.export.ExportedProgram:
    """``torch.export`` ``module(*args)`` with the dynamic dimensions ``shapes`` (one per argument), saved to
    ``path``."""
    with size_oblivious():
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
    torch.export.save(program, str(path))
    return program


def state_signature(model: Model) -> list[dict]:
    """Shapes (without the batch dimension; ``max_len`` on a capacity axis) and dtypes of the decoding state,
    and the capacity axis of each tensor that has one, for loaders without attnspec."""
    return [{"shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
             **({} if axis is None else {"capacity_axis": axis})}
            for (shape, dtype), axis in zip(model.state_signature(), model.capacity_axes())]
