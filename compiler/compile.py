"""Compiling with ``torch.compile(fullgraph=True)``, dynamic in batch and sequence length.

``fullgraph=True`` turns any graph break into an error. Each model is compiled with its own
recompile budget (``isolate_recompiles`` where torch has it, otherwise a dynamo reset), and
hitting the recompile limit is an error rather than a silent fall-back to eager.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

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


def _compile_options(limit: int = 8) -> dict:
    """Per-call recompile isolation where torch has it (2.13); otherwise a fresh dynamo state."""
    options = {}
    parameters = inspect.signature(torch.compile).parameters
    if "isolate_recompiles" in parameters:
        options["isolate_recompiles"] = True
        if "recompile_limit" in parameters:
            options["recompile_limit"] = limit
    else:  # torch < 2.13: give the new model a fresh recompile budget
        torch._dynamo.reset()
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    return options


def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile(model, fullgraph=True, dynamic=True)`` with recompiles isolated per model."""
    return CompiledModel(torch.compile(model, fullgraph=True, dynamic=True, **_compile_options()))


def _run_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


class _RegionalBlock(nn.Module):
    """A block whose forward runs through a compiled function shared by every block of the model."""

    def __init__(self, block: nn.Module, compiled):
        super().__init__()
        self.block, self.compiled = block, compiled

    def forward(self, x: torch.Tensor, mode: str | None = None) -> torch.Tensor:
        assert mode is None, "the regional check runs each block in its planned mode"
        with size_oblivious():
            return self.compiled(self.block, x)


@contextlib.contextmanager
def regionally_compiled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with every block run through one ``torch.compile(fullgraph=True, dynamic=True)`` function.

    Regional compilation: blocks of the same structure share one compiled graph (the parameters are
    graph inputs), so a model of N identical blocks compiles one block rather than N, and the
    compiler's caches, keyed by the graph, serve a structurally identical spec built later. The
    embedding and head around the blocks run eagerly. The model's own blocks are restored on exit.
    """
    blocks = model.blocks
    compiled = torch.compile(_run_block, fullgraph=True, dynamic=True, **_compile_options(len(blocks) + 1))
    model.blocks = nn.ModuleList(_RegionalBlock(block, compiled) for block in blocks)
    try:
        yield model
    finally:
        model.blocks = blocks


def check_compiled(model: nn.Module, example_inputs: list[torch.Tensor], atol: float, rtol: float) -> dict:
    """Compile ``model``'s blocks (:func:`regionally_compiled`), warm up on the first input, then run
    the others with recompiles forbidden.

    Returns ``{"lengths": [...], "max_abs_diff": float, "graphs": int}`` comparing compiled with
    eager outputs; ``graphs`` is the number of distinct compiled block graphs.
    Raises BuildError if an input would recompile or the outputs differ beyond the tolerance.
    """
    from torch._dynamo.utils import counters

    worst = 0.0
    lengths = []
    graphs_before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        eager = [model(inputs) for inputs in example_inputs]
        with regionally_compiled(model) as compiled:
            for i, inputs in enumerate(example_inputs):
                if i == 0:
                    got = compiled(inputs)
                else:
                    try:
                        with torch.compiler.set_stance("fail_on_recompile"):
                            got = compiled(inputs)
                    except Exception as error:  # torch raises its own internal error types here
                        raise BuildError(f"the compiled model recompiled for length {inputs.shape[1]} after warm-up "
                                         f"(it must be dynamic in the sequence length): {error}") from None
                diff = (got - eager[i]).abs().max().item()
                worst = max(worst, diff)
                if not torch.allclose(got, eager[i], atol=atol, rtol=rtol):
                    raise BuildError(f"compiled output differs from eager by {diff:.3e} at length {inputs.shape[1]}")
                lengths.append(int(inputs.shape[1]))
    return {"lengths": lengths, "max_abs_diff": worst, "graphs": counters["stats"]["unique_graphs"] - graphs_before}
