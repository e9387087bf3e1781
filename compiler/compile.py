"""Compiling with ``torch.compile(fullgraph=True)``, dynamic in batch and sequence length.

``fullgraph=True`` turns any graph break into an error. Each model is compiled with its own
recompile budget (``isolate_recompiles`` where torch has it, otherwise a dynamo reset), and
hitting the recompile limit is an error rather than a silent fall-back to eager.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch import nn

from attnspec.errors import BuildError


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


class CompiledModel(nn.Module):
    """A compiled model whose calls trace size-obliviously (see :func:`size_oblivious`)."""

    def __init__(self, compiled: nn.Module):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args, **kwargs):
        with size_oblivious():
            return self.compiled(*args, **kwargs)


def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile(model, fullgraph=True, dynamic=True)`` with recompiles isolated per model."""
    options = {}
    if "isolate_recompiles" in inspect.signature(torch.compile).parameters:
        options["isolate_recompiles"] = True
    else:  # torch < 2.13: give the new model a fresh recompile budget
        torch._dynamo.reset()
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    return CompiledModel(torch.compile(model, fullgraph=True, dynamic=True, **options))


def check_compiled(model: nn.Module, example_inputs: list[torch.Tensor], atol: float, rtol: float) -> dict:
    """Compile ``model``, warm up on the first input, then run the others with recompiles forbidden.

    Returns ``{"lengths": [...], "max_abs_diff": float}`` comparing compiled with eager outputs.
    Raises BuildError if an input would recompile or the outputs differ beyond the tolerance.
    """
    compiled = compile_model(model)
    worst = 0.0
    lengths = []
    with torch.no_grad():
        for i, inputs in enumerate(example_inputs):
            eager = model(inputs)
            if i == 0:
                got = compiled(inputs)
            else:
                try:
                    with torch.compiler.set_stance("fail_on_recompile"):
                        got = compiled(inputs)
                except Exception as error:  # torch raises its own internal error types here
                    raise BuildError(f"the compiled model recompiled for length {inputs.shape[1]} after warm-up "
                                     f"(it must be dynamic in the sequence length): {error}") from None
            diff = (got - eager).abs().max().item()
            worst = max(worst, diff)
            if not torch.allclose(got, eager, atol=atol, rtol=rtol):
                raise BuildError(f"compiled output differs from eager by {diff:.3e} at length {inputs.shape[1]}")
            lengths.append(int(inputs.shape[1]))
    return {"lengths": lengths, "max_abs_diff": worst}
