"""Speed of a build's artifacts: tokens per second of a full-sequence call and of a decoding step,
timed as medians after a warm-up (the manifest's ``tokens_per_second`` and the build summary).
"""

from __future__ import annotations

import statistics
import time

import torch


SPEED_BATCH = 1
SPEED_LENGTH = 256
SPEED_SECONDS = 0.5  # timed calls stop after this long (at least one after the warm-up)
DECODE_STEPS = 32
SPEED_WORK = SPEED_LENGTH * (1 << 25)
"""Parameter-tokens of one timed call at most (256 tokens through 32M parameters, ~17 GFLOP): a larger model
is timed on fewer tokens (at least 16) and decoding steps (at least 4): at 256 tokens a 1B build on 2
cores was still timing its programs after 8 minutes. The manifest records the length and steps each speed
was measured at."""


def speed_length(parameters: int, max_len: int) -> int:
    """The sequence length a build times full-sequence calls at (:data:`SPEED_WORK`), within ``max_len``."""
    return max(2, min(max_len, SPEED_LENGTH, max(16, SPEED_WORK // max(parameters, 1))))


def speed_steps(parameters: int) -> int:
    """The decoding steps a build times (:data:`SPEED_WORK`, one token a step)."""
    return min(DECODE_STEPS, max(4, SPEED_WORK // SPEED_LENGTH * DECODE_STEPS // max(parameters, 1)))


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


__all__ = ["DECODE_STEPS", "SPEED_BATCH", "SPEED_LENGTH", "SPEED_SECONDS", "decode_speed", "sequence_speed"]
