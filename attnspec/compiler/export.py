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
    """``forward(inputs (B, L) tokens) -> (logits (B, 1, vocab) at the last position, *state)``: the prompt's
    pass as a plain module, leaving the state :class:`DecodeStep` continues from."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor):
        return self.model.prefill(inputs, last_only=True)


def export_model(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export ``model.forward`` with dynamic batch (1..4096) and length (2..max_len) to ``path``."""
    return _export_over_prompts(model, model, path)


def _export_over_prompts(module: nn.Module, model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export ``module(inputs)`` (``model``'s inputs (B, L[, dim])) with dynamic batch (1..4096) and length
    (2..max_len) to ``path``."""
    max_len = model.spec.max_len
    inputs = example_input(model, 3, min(17, max_len))
    batch = Dim("batch", min=1, max=4096)
    length = Dim("length", min=2, max=max(max_len, 3))
    with size_oblivious():
        program = torch.export.export(module, (inputs,), dynamic_shapes={"inputs": {0: batch, 1: length}}, strict=False)
    torch.export.save(program, str(path))
    return program


def export_step(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export the one-token decoding step with dynamic batch; the state tensors are explicit inputs/outputs."""
    step = DecodeStep(model)
    model.state_layout()  # counted here: counted while tracing, its meta tensors would stay in the program as ops
    state = model.init_state(3)
    token = torch.zeros(3, dtype=torch.long, device=state[0].device)
    batch = Dim("batch", min=1, max=4096)
    shapes = ({0: batch},) + tuple({0: batch} for _ in state)
    with size_oblivious():
        program = torch.export.export(step, (token, *state), dynamic_shapes=(shapes[0], shapes[1:]), strict=False)
    torch.export.save(program, str(path))
    return program


def export_prefill(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export the prompt's prefill (:class:`Prefill`) with dynamic batch (1..4096) and length (2..max_len)."""
    return _export_over_prompts(Prefill(model), model, path)


def state_signature(model: Model) -> list[dict]:
    """Shapes (without the batch dimension) and dtypes of the decoding state, for loaders without attnspec."""
    return [{"shape": list(shape), "dtype": str(dtype).replace("torch.", "")}
            for shape, dtype in model.state_signature()]
