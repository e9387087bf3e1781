"""Exporting with ``torch.export``: the model with dynamic batch and length, and the decoding step.

The exported programs load with ``torch.export.load`` and run without attnspec installed.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from attnspec.compiler.compile import size_oblivious
from attnspec.nn.model import Model


class DecodeStep(nn.Module):
    """``forward(token, *state) -> (logits, *state)``: the model's one-token step as a plain module."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, token: torch.Tensor, *state: torch.Tensor):
        return self.model.step(token, *state)


def example_input(model: Model, batch: int, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random tokens (B, L) or features (B, L, dim) for ``model``, on its device (drawn on the CPU, so a
    seeded generator gives the same numbers on every device)."""
    spec = model.spec
    device = model.embed.weight.device
    if spec.input.kind == "tokens":
        return torch.randint(0, spec.input.vocab_size, (batch, length), generator=generator).to(device)
    dtype = model.embed.weight.dtype
    return torch.randn(batch, length, spec.input.dim, generator=generator, dtype=dtype).to(device)


def export_model(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export ``model.forward`` with dynamic batch (1..4096) and length (2..max_len) to ``path``."""
    max_len = model.spec.max_len
    inputs = example_input(model, 3, min(17, max_len))
    batch = Dim("batch", min=1, max=4096)
    length = Dim("length", min=2, max=max(max_len, 3))
    with size_oblivious():
        program = torch.export.export(model, (inputs,), dynamic_shapes={"inputs": {0: batch, 1: length}}, strict=False)
    torch.export.save(program, str(path))
    return program


def export_step(model: Model, path: Path) -> torch.export.ExportedProgram:
    """Export the one-token decoding step with dynamic batch; the state tensors are explicit inputs/outputs."""
    step = DecodeStep(model)
    state = model.init_state(3)
    token = torch.zeros(3, dtype=torch.long, device=state[0].device)
    batch = Dim("batch", min=1, max=4096)
    shapes = ({0: batch},) + tuple({0: batch} for _ in state)
    with size_oblivious():
        program = torch.export.export(step, (token, *state), dynamic_shapes=(shapes[0], shapes[1:]), strict=False)
    torch.export.save(program, str(path))
    return program


def state_signature(model: Model) -> list[dict]:
    """Shapes (without the batch dimension) and dtypes of the decoding state, for loaders without attnspec."""
    return [{"shape": list(shape), "dtype": str(dtype).replace("torch.", "")}
            for shape, dtype in model.state_signature()]


SPEED_BATCH = 1
SPEED_LENGTH = 256
SPEED_SECONDS = 0.5  # timed calls stop after this long (at least one after the warm-up)
DECODE_STEPS = 32


def sequence_speed(call, inputs: torch.Tensor, repeats: int = 3) -> float:
    """Tokens per second of ``call(inputs)`` (B, L, ...) without gradients: median of up to
    ``repeats`` timed calls within ``SPEED_SECONDS``, after one warm-up call."""
    times = []
    with torch.no_grad():
        call(inputs)
        while len(times) < repeats and sum(times) < SPEED_SECONDS:
            _synchronize(inputs)
            start = time.perf_counter()
            call(inputs)
            _synchronize(inputs)
            times.append(time.perf_counter() - start)
    return inputs.shape[0] * inputs.shape[1] / statistics.median(times)


def decode_speed(step, state: tuple[torch.Tensor, ...], steps: int = DECODE_STEPS) -> float:
    """Tokens per second of ``step(token, *state) -> (logits, *state)`` at the state's batch, over
    ``steps`` steps after one warm-up step."""
    batch = state[0].shape[0]
    token = torch.zeros(batch, dtype=torch.long, device=state[0].device)
    with torch.no_grad():
        _, *state = step(token, *state)
        _synchronize(token)
        start = time.perf_counter()
        for _ in range(steps):
            _, *state = step(token, *state)
        _synchronize(token)
    return batch * steps / (time.perf_counter() - start)


def _synchronize(tensor: torch.Tensor) -> None:
    """Wait for ``tensor``'s device: CUDA calls return before their kernels finish."""
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
