"""Compiling with ``torch.compile(fullgraph=True)``, and the build's compile check.

``fullgraph=True`` turns any graph break into an error. The check runs at one of two levels
(:data:`CHECK_BACKENDS`): ``inductor``, what ``build`` and ``export`` run, generates and runs Inductor's
code; ``trace``, an import's default, traces with Dynamo and AOTAutograd (the graph Inductor would be
given: graph breaks, guards and decompositions are all there) and runs that graph, without Inductor's
code generation, which costs 15-30 s of C++ compilation on a 2-core CPU whatever the model's size.
Each model is compiled with its own recompile budget (``isolate_recompiles`` where torch has it,
otherwise a dynamo reset), and hitting the recompile limit is an error rather than a silent fall-back to
eager. Checks compile regionally (one compiled graph per distinct block structure); a build runs its
check in a child process beside the whole build, on one copy of each block from the spec's seed
(:class:`BackgroundCheck`), and remembers a passed one (:mod:`attnspec.compiler.compile_cache`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from attnspec.compiler.tracing import example_input, size_oblivious
from attnspec.errors import BuildError
from attnspec.io import start_python


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


def _run_block(block: nn.Module, x: torch.Tensor, embeddings: torch.Tensor | None, documents=None, kv=None,
               lend: bool = False):
    extra = ({} if documents is None else {"documents": documents}) | ({} if kv is None else {"kv": kv})
    return block(x, None, embeddings, lend=True, **extra) if lend else block(x, None, embeddings, **extra)


class _RegionalBlock(nn.Module):
    """A block whose forward runs through a compiled function shared by every block of the model."""

    def __init__(self, block: nn.Module, compiled):
        super().__init__()
        self.block, self.compiled = block, compiled

    def forward(self, x: torch.Tensor, mode: str | None = None, embeddings: torch.Tensor | None = None,
                documents=None, kv=None, lend: bool = False):
        assert mode is None, "the regional check runs each block in its planned mode"
        with size_oblivious():
            return self.compiled(self.block, x, embeddings, documents, kv, lend)


@contextlib.contextmanager
def regionally_compiled(model: nn.Module, dynamic: bool = True, backend: str = "inductor") -> Iterator[nn.Module]:
    """``model`` with every block run through one ``torch.compile(fullgraph=True, dynamic=dynamic)`` function
    (``backend``: torch's name of the compiler, ``inductor`` or ``aot_eager``).

    Regional compilation: blocks of the same structure share one compiled graph (the parameters are
    graph inputs), so a model of N identical blocks compiles one block rather than N, and the
    compiler's caches, keyed by the graph, serve a structurally identical spec built later. The
    embedding and head around the blocks run eagerly. The model's own blocks are restored on exit.
    """
    blocks = model.blocks
    compiled = torch.compile(_run_block, fullgraph=True, dynamic=dynamic, backend=backend,
                             **_compile_options(len(blocks) + 1))
    model.blocks = nn.ModuleList(_RegionalBlock(block, compiled) for block in blocks)
    try:
        yield model
    finally:
        model.blocks = blocks


def check_compiled(model: nn.Module, example_inputs: list[torch.Tensor], atol: float, rtol: float,
                   dynamic: bool = True, backend: str = "inductor") -> dict:
    """Compile ``model``'s blocks (:func:`regionally_compiled`), warm up on the first input, then run
    the others with recompiles forbidden (with ``dynamic=False``, give one input).

    Returns ``{"lengths": [...], "max_abs_diff": float, "max_rel_diff": float, "graphs": int, "dynamic": bool,
    "backend": str}`` comparing compiled with eager outputs (``max_rel_diff``: against the output's
    largest magnitude); ``graphs`` is the number of distinct compiled block graphs.
    Raises BuildError if an input would recompile or the outputs differ beyond the tolerance.
    """
    from torch._dynamo.utils import counters

    worst = worst_relative = 0.0
    lengths = []
    graphs_before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        eager = [model(inputs) for inputs in example_inputs]
        with regionally_compiled(model, dynamic, backend) as compiled:
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
                diff, largest = (got - eager[i]).abs().max().item(), eager[i].abs().max().item()
                worst, worst_relative = max(worst, diff), max(worst_relative, diff / max(largest, 1e-30))
                relative = atol == 0.0  # half precision: against the output's largest magnitude (TOLERANCES)
                if (diff > rtol * largest) if relative else \
                        not torch.allclose(got, eager[i], atol=atol, rtol=rtol):
                    raise BuildError(f"compiled output differs from eager by {diff:.3e} at length {inputs.shape[1]}")
                lengths.append(int(inputs.shape[1]))
    return {"lengths": lengths, "max_abs_diff": worst, "max_rel_diff": worst_relative,
            "graphs": counters["stats"]["unique_graphs"] - graphs_before, "dynamic": dynamic, "backend": backend}


TOLERANCES = {torch.float64: (1e-9, 1e-7), torch.float32: (1e-4, 1e-4), torch.bfloat16: (0.0, 2.0 ** -2),
              torch.float16: (0.0, 2.0 ** -5)}
"""Compiled against eager, (absolute, relative) per parameter dtype. float64 and float32: element by element
(``allclose``), summation order alone. bfloat16 and float16: the largest difference relative to the
output's largest magnitude, at most 64 units in the last place of the dtype (eps 2^-8, 2^-11): compiled
code fuses ops and keeps their intermediates in float32 where eager rounds each to the dtype, so the two
differ by about as much as eager differs from the exact function (eager against float64, measured on
the shipped specs in bfloat16: 1 to 10 units, the LRU 40); a wrong graph differs by the output's whole
size."""


CHECK_BACKENDS = {"inductor": "inductor", "trace": "aot_eager"}
"""The compile check's levels, by the name a build takes (``compile_check=``), with torch's backend for each."""


def check_model(model: nn.Module, level: str = "inductor") -> dict:
    """A build's compile check: ``fullgraph=True`` holds and compiled equals eager, for every block
    compiled regionally with fixed shapes at batch 2 and length 45 (or ``max_len``), within the
    :data:`TOLERANCES` of the model's dtype; ``level`` of :data:`CHECK_BACKENDS`.

    Fixed shapes are what ``attnspec train --compile`` compiles, and they compile in about half
    the time of a length-dynamic graph on a small CPU. That the model does not specialise on the
    length is what the export stage proves (``model.pt2`` has a dynamic length dimension, which
    ``torch.export`` refuses to keep if any code specialises on it), and the test suite checks
    ``torch.compile(dynamic=True)`` across lengths without recompiles for each mode's code path.
    """
    inputs = [example_input(model, 2, min(45, model.spec.max_len), torch.Generator().manual_seed(0))]
    atol, rtol = TOLERANCES[model.embed.weight.dtype]
    return check_compiled(model, inputs, atol=atol, rtol=rtol, dynamic=False, backend=CHECK_BACKENDS[level])


class BackgroundCheck:
    """:func:`check_model` on a build's structure in a child process, while the build goes on.

    The child builds one copy of each of the spec's blocks (every ``repeat`` group at one copy:
    :func:`attnspec.spec.walk.one_copy_each`) from the spec's seed, in its dtype, with the plan's modes
    of those blocks: regional compilation gives identical blocks one graph, so a model of 30 identical
    blocks checks the same code as one of 1, and the child holds no copy of the build's weights (a 7B
    import would otherwise hold two). It needs nothing the build writes, so it starts before the weights
    are converted and overlaps the whole build (most of a build's time on a small CPU is this check),
    and the compiler's state never leaks into the building process. ``result()`` waits; leaving the
    ``with`` block early kills the child. Its spec and output live in a temporary folder outside the
    build directory.
    """

    def __init__(self, spec, modes: list[str], device: torch.device | str = "cpu", level: str = "inductor"):
        from attnspec.errors import SpecError
        from attnspec.spec.emit import spec_to_data, to_yaml
        from attnspec.spec.validate import validate_data
        from attnspec.spec.walk import first_copies, one_copy_each

        try:  # a spec whose rules need its depth (none today) is checked whole
            shallow = validate_data(one_copy_each(spec_to_data(spec, minimal=False)))
            modes = [mode for mode, first in zip(modes, first_copies(spec), strict=True) if first]
        except SpecError:
            shallow = spec
        self.folder = tempfile.TemporaryDirectory(prefix="attnspec-compile-check-")
        (Path(self.folder.name) / "spec.yaml").write_text(to_yaml(shallow, minimal=False))
        self.log = tempfile.TemporaryFile()
        self.start = time.perf_counter()
        self.process = start_python("attnspec.compiler.compile", self.folder.name, json.dumps(modes), str(device),
                                    level, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "BackgroundCheck":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()
        self.folder.cleanup()

    def result(self) -> tuple[dict, float]:
        """The check's report and its wall-clock seconds. Raises BuildError with the child's message."""
        code = self.process.wait()
        seconds = time.perf_counter() - self.start
        self.log.seek(0)
        output = self.log.read().decode(errors="replace").strip().splitlines()
        last = output[-1] if output else ""
        try:
            report = json.loads(last)
        except ValueError:
            report = None
        if code == 0 and isinstance(report, dict) and "lengths" in report:
            return report, seconds
        if isinstance(report, dict) and "error" in report:
            raise BuildError(report["error"])
        tail = "\n".join(output[-15:])
        raise BuildError(f"the compile check's process failed (exit {code}):\n{tail}")


def _check_spec(directory: Path, modes: list[str], device: str, level: str) -> dict:
    """The child's check: the model of ``directory/spec.yaml`` from its seed, with ``modes``."""
    from attnspec.nn.model import build_model_from_spec
    from attnspec.spec import load_spec

    model = build_model_from_spec(load_spec(directory / "spec.yaml", ()))
    model.set_modes(modes)
    return check_model(model.to(device).eval(), level)


if __name__ == "__main__":  # the child of BackgroundCheck: prints one JSON line, the report or the error
    try:
        print(json.dumps(_check_spec(Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4])))
    except BuildError as error:
        print(json.dumps({"error": str(error)}))
        sys.exit(3)
