"""``attnspec build``: spec -> verified, compiled, exported build directory (DESIGN sec. 5).

Stages: parse, validate, plan, lower, verify, compile, export. Nothing is written before the spec
is valid; the directory is then written into a locked scratch sibling and published with one
atomic rename (:mod:`attnspec.compiler.outdir`), so an interrupted or failing build leaves the
output as it was, and ``--force`` replaces only a build directory attnspec wrote.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from safetensors.torch import save_file

import attnspec
from attnspec.compiler.compile import check_compiled
from attnspec.compiler.export import example_input, export_model, export_step, state_signature
from attnspec.compiler.lower import count_parameters, lower
from attnspec.compiler.manifest import FILE_NAMES, FORMAT, MANIFEST, sha256
from attnspec.compiler.outdir import Scratch, check_output
from attnspec.compiler.plan import plan_spec
from attnspec.compiler.verify import verify_model
from attnspec.errors import AttnSpecError, BuildError
from attnspec.spec import limits, load_data, to_yaml, validate_data


@dataclass
class BuildResult:
    """What a build produced: the directory, its manifest and the seconds each stage took."""

    directory: Path
    manifest: dict
    stage_seconds: dict[str, float] = field(default_factory=dict)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers, each storage once (a tied LM head has no separate weight)."""
    return {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}


def build_directory(spec_path: Path | str, output: Path | str, *, overrides=(), aot: bool = False,
                    compile_check: bool = True, force: bool = False, console: Console | None = None) -> BuildResult:
    """Build ``spec_path`` into the directory ``output``.

    Args:
        spec_path: a ``.yaml``/``.yml``/``.attn`` spec.
        output: the build directory to create (must not exist unless ``force``).
        overrides: ``"path=value"`` strings, as ``--set``.
        aot: also write an AOTInductor package ``model.aoti.pt2``.
        compile_check: compile with ``torch.compile`` and compare with eager (``--no-compile`` skips it).
        force: replace an existing build directory (never any other directory).
        console: where progress and the summary go (None: quiet).

    Raises:
        SpecError: the spec is invalid (nothing is written). BuildError: a stage failed, or the output
            is not ours to write (the output is left as it was).
    """
    output = Path(output)
    check_output(output, force)
    seconds: dict[str, float] = {}
    with _progress(console) as stage, _internal_errors_as_build_errors():
        with stage("parse", seconds):
            data, smap = load_data(spec_path, overrides)
        with stage("validate", seconds):
            spec = validate_data(data, smap)
            expected = count_parameters(spec)
            if expected > limits.MAX_PARAMETERS:
                raise BuildError(f"the spec implies {expected:,} parameters, over the limit of "
                                 f"{limits.MAX_PARAMETERS:,}; make the model smaller")
        with stage("plan", seconds):
            plan = plan_spec(spec, for_build=True)
        with Scratch(output) as scratch:  # nothing is written before this point
            with stage("lower", seconds):
                model = lower(spec, plan)
                parameters = sum(p.numel() for p in model.parameters())
                if parameters != expected:  # a lowering bug, never a user error
                    raise BuildError(f"internal: built {parameters} parameters, the spec implies {expected}")
                header = f"resolved spec of {spec.name}, built by attnspec {attnspec.__version__}"
                (scratch.path / "spec.yaml").write_text(to_yaml(spec, minimal=False, header=header))
                save_file(_weights(model), str(scratch.path / "model.safetensors"))
            with stage("verify", seconds):
                verification = verify_model(model)
                if not verification.ok:
                    worst = max(verification.rows, key=lambda row: row.rel_diff)
                    raise BuildError(f"mode verification failed: {worst.layer} in {worst.mode} differs by "
                                     f"{worst.rel_diff:.2e} (tolerance {worst.tolerance:.0e})")
            compiled = None
            if compile_check:
                with stage("compile", seconds):
                    compiled = _compile_check(model)
            with stage("export", seconds):
                exported = _export(model, scratch.path, aot)
            manifest = _manifest(spec, plan, model, parameters, verification, compiled, exported, seconds,
                                 scratch.path)
            (scratch.path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            scratch.publish(force)
    result = BuildResult(output, manifest, seconds)
    if console is not None:
        _summary(console, result)
    return result


def _compile_check(model) -> dict:
    """Compile, warm up at one length, then require equal outputs and no recompile at others."""
    lengths = [n for n in (45, 29, 77) if n <= model.spec.max_len] or [model.spec.max_len]
    generator = torch.Generator().manual_seed(0)
    inputs = [example_input(model, 2, n, generator) for n in lengths]
    tight = model.embed.weight.dtype == torch.float64
    return check_compiled(model, inputs, atol=1e-9 if tight else 1e-4, rtol=1e-7 if tight else 1e-4)


def _export(model, scratch: Path, aot: bool) -> dict:
    program = export_model(model, scratch / "model.pt2")
    check_length = max(2, min(model.spec.max_len, 37))
    inputs = example_input(model, 2, check_length, torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (program.module()(inputs) - model(inputs)).abs().max().item()
    info = {"model.pt2": {"checked_length": check_length, "max_abs_diff_vs_eager": diff}}
    if model.has_step:
        export_step(model, scratch / "step.pt2")
        info["step.pt2"] = {"state": state_signature(model)}
    if aot:
        torch._inductor.aoti_compile_and_package(program, package_path=str(scratch / "model.aoti.pt2"))
    return info


def _manifest(spec, plan, model, parameters, verification, compiled, exported, seconds, scratch: Path) -> dict:
    files = {name: {"sha256": sha256(scratch / name), "bytes": (scratch / name).stat().st_size}
             for name in FILE_NAMES if (scratch / name).exists()}
    return {
        "format": FORMAT,
        "name": spec.name,
        "attnspec_version": attnspec.__version__,
        "torch_version": torch.__version__,
        "parameters": parameters,
        "input": spec.input.kind,
        "vocab_size": getattr(spec.input, "vocab_size", None),
        "head": spec.head.kind,
        "causal": all(block.mixer.causal for block in model.blocks),
        "max_len": spec.max_len,
        "dtype": spec.dtype,
        "plan": plan.to_json(),
        "verification": verification.to_json(),
        "compile": compiled,
        "export": exported,
        "has_step": "step.pt2" in files,
        "stage_seconds": seconds,
        "files": files,
    }


@contextmanager
def _internal_errors_as_build_errors() -> Iterator[None]:
    """Any failure that is not an attnspec error (a bug, an unexpected torch error) becomes a BuildError."""
    try:
        yield
    except (AttnSpecError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # noqa: BLE001
        raise BuildError(f"build failed: {type(error).__name__}: {error}") from error


@contextmanager
def _progress(console: Console | None) -> Iterator:
    """A ``stage(name, seconds)`` context manager factory that shows a rich progress line per stage."""
    progress = None
    if console is not None:
        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                            transient=False)
        progress.start()

    @contextmanager
    def stage(name: str, seconds: dict[str, float]):
        task = progress.add_task(f"{name}...", total=1) if progress else None
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds[name] = round(time.perf_counter() - start, 3)
            if progress is not None:
                progress.update(task, completed=1, description=f"{name} ({seconds[name]:.1f}s)")

    try:
        yield stage
    finally:
        if progress is not None:
            progress.stop()


def _summary(console: Console, result: BuildResult) -> None:
    manifest = result.manifest
    table = Table(title=escape(f"built {manifest['name']} -> {result.directory}"))
    table.add_column("item")
    table.add_column("value")
    table.add_row("parameters", f"{manifest['parameters']:,}")
    for layer in manifest["plan"]["layers"]:
        table.add_row(escape(layer["path"]), escape(f"{layer['mixer']}: {layer['full_mode']}"
                      + (f" / decode {layer['decode_mode']}" if layer["decode_mode"] else "")))
    verification = manifest["verification"]
    table.add_row("verification", f"{len(verification['rows'])} mode checks, worst rel. diff "
                                  f"{verification['worst_rel_diff']:.1e}: {'ok' if verification['ok'] else 'FAILED'}")
    for name, info in manifest["files"].items():
        table.add_row(name, f"{info['bytes'] / 2**20:.2f} MiB")
    table.add_row("stages", ", ".join(f"{k} {v:.1f}s" for k, v in manifest["stage_seconds"].items()))
    console.print(table)
    run = (f"attnspec run {result.directory} --tokens \"1 2 3\"" + (" --generate 8" if manifest["has_step"] else "")
           if manifest["input"] == "tokens" else "")
    console.print(f"\nNext: {run}"
                  + f"\n      python -c \"import torch; p = torch.export.load('{result.directory}/model.pt2')\""
                  + f"\n      python -c \"import attnspec; model = attnspec.load('{result.directory}')\"", markup=False)
