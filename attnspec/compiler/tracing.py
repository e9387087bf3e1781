"""What traced and checked calls are given: example inputs of a model, and the tracing setting that keeps
a length dynamic. Shared by the compile check, the export, verification and speed measurement.
"""

from __future__ import annotations

import contextlib

import torch

from attnspec.nn.model import Model


def example_input(model: Model, batch: int, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random tokens (B, L) or features (B, L, dim) for ``model``, on its device (drawn on the CPU, so a
    seeded generator gives the same numbers on every device)."""
    spec = model.spec
    device = model.embed.weight.device
    if spec.input.kind == "tokens":
        return torch.randint(0, spec.input.vocab_size, (batch, length), generator=generator).to(device)
    dtype = model.embed.weight.dtype
    return torch.randn(batch, length, spec.input.dim, generator=generator, dtype=dtype).to(device)


def size_oblivious():
    """Trace sizes without special-casing 0 and 1 (``backed_size_oblivious``).

    The chunked kernel reshapes L into (chunks, chunk_size); when an example has exactly one
    chunk, ordinary tracing specialises on "chunks == 1" (size-1 dimensions have arbitrary
    strides) and the program would not be dynamic in L.
    """
    try:
        import torch.fx.experimental._config as shape_config

        return shape_config.patch(backed_size_oblivious=True)
    except (ImportError, AttributeError, KeyError):  # older torch: best effort
        return contextlib.nullcontext()


__all__ = ["example_input", "size_oblivious"]
