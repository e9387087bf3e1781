"""``attnspec build``: spec -> verified, compiled, exported build directory (DESIGN sec. 5).

Stages: parse, validate, plan, lower, verify, compile, export. Nothing is written before the spec
is valid; the directory is then written into a locked scratch sibling and published with one
atomic rename (:mod:`attnspec.compiler.outdir`), so an interrupted or failing build leaves the
output as it was, and ``--force`` replaces only a build directory attnspec wrote.
"""

from __future__ import annotations

import contextlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from attnspec.io import VERSION, save_tensors
from attnspec.compiler.compile import CHECK_BACKENDS, BackgroundCheck
from attnspec.compiler.compile_cache import check_key, passed_before, remember_pass
from attnspec.compiler.export import export_model, export_prefill, export_step, state_signature
from attnspec.compiler.speed import SPEED_BATCH, decode_speed, sequence_speed, speed_length, speed_steps
from attnspec.compiler.tracing import example_input
from attnspec.compiler.load import check_plugins, grouped_projections_of, load_weights, tokenizer_of
from attnspec.compiler.device import device_calibration, resolve_device
from attnspec.compiler.lower import lower
from attnspec.compiler.sizes import check_model_size
from attnspec.compiler.generation import checked_generation_config, write_generation_config
from attnspec.compiler.manifest import FILE_NAMES, FORMAT, MANIFEST, sha256
from attnspec.compiler.outdir import Scratch, check_output
from attnspec.compiler.plan import plan_spec
from attnspec.compiler.verify import non_finite_problem, verify_model
from attnspec.errors import AttnSpecError, BuildError, shorten
from attnspec.spec.emit import spec_to_data, to_yaml
from attnspec.spec.ir import iter_blocks
from attnspec.spec.load import load_data
from attnspec.spec.validate import validate_data
from attnspec.tokenizer import Tokenizer, load_tokenizer, save_tokenizer


@dataclass
class BuildResult:
    """What a build produced: the directory, its manifest and the seconds each stage took."""

    directory: Path
    manifest: dict
    stage_seconds: dict[str, float] = field(default_factory=dict)
    import_check: object = None
    """``import-hf``'s comparison with transformers (:class:`attnspec.interop.check.ImportCheck`), None otherwise."""


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers, each storage once (a tied LM head has no separate weight)."""
    return {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}


PROGRAMS = ("model", "prefill", "step")
"""The exported programs a build can write: ``model.pt2`` (the full sequence), ``prefill.pt2`` and ``step.pt2``."""


def check_programs(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` (``--programs model,step``; ``all``, ``none``) as a tuple of :data:`PROGRAMS`, or a BuildError."""
    names = [name.strip() for name in names if name.strip()]
    if names in (["all"], ["none"]):
        return PROGRAMS if names == ["all"] else ()
    unknown = [name for name in names if name not in PROGRAMS]
    if unknown:
        raise BuildError(f"--programs: {shorten(unknown[0])} is not a program a build writes; give some of "
                         f"{', '.join(PROGRAMS)} (comma-separated), all or none")
    return tuple(name for name in PROGRAMS if name in names)


StageCallback = Callable[[str, "float | None"], None]
"""``on_stage(name, None)`` when a stage starts, ``on_stage(name, seconds)`` when it ends."""


def build_directory(spec_path: Path | str | dict, output: Path | str, *, overrides=(), aot: bool = False,
                    compile_check: bool | str = "trace", force: bool = False, weights: Path | str | dict | None = None,
                    strict_weights: bool = False, calibrate: bool = True, device=None,
                    on_stage: StageCallback | None = None, tokenizer=None,
                    programs: Iterable[str] = PROGRAMS, generation: dict | None = None,
                    beside_compile_check=None) -> BuildResult:
    """Build ``spec_path`` into the directory ``output``.

    Args:
        spec_path: a ``.yaml``/``.yml``/``.attn`` spec, spec data, or a training run directory (its
            resolved spec, with the weights of its latest checkpoint).
        output: the build directory to create (must not exist unless ``force``).
        overrides: ``"path=value"`` strings, as ``--set``.
        programs: the exported programs to write, of :data:`PROGRAMS` (those the model has: ``step`` and
            ``prefill`` where it decodes). Each holds its own copy of the weights (it loads with plain
            ``torch.export.load``, without attnspec) and costs seconds of tracing per block, whatever the
            width; ``attnspec.load``, ``run``, ``eval``, ``train`` and ``export-hf`` read ``model.safetensors``
            alone. This function writes all by default; the commands ``attnspec build`` and ``import-hf``
            write none unless asked (``--programs``), since the researcher's loop reads none.
        aot: also write AOTInductor packages ``model.aoti.pt2`` (and ``step.aoti.pt2``): compiled native
            programs, minutes of C++ compilation on a small CPU, so not built by default.
        compile_check: compile with ``torch.compile(fullgraph=True)`` and compare with eager: ``"trace"`` (the
            default), Dynamo and AOTAutograd's graph, run without Inductor's code generation; ``"inductor"``
            (or True, ``--inductor``), with Inductor's generated code, 15-30 s more of C++ compilation on a
            2-core CPU whatever the model's size (:data:`~attnspec.compiler.compile.CHECK_BACKENDS`); False skips
            it (``--no-compile``). A check that passed on this machine for the same structure at that level
            or deeper is reused (manifest ``compile.reused``).
        force: replace an existing build directory (never any other directory).
        weights: a safetensors file (or name -> tensor dict) of trained weights for the spec's model,
            instead of the spec's random initialisation: every tensor whose name and shape fit is
            loaded, the rest keep the spec's ``init`` (an edited import: a swapped layer, a wider MLP),
            and the manifest's ``weights`` lists what was initialised, every shape mismatch and the
            file's tensors the model has no place for (:class:`~attnspec.compiler.load.WeightsFit`).
            A build's ``model.safetensors`` brings its spec too: where the edit gives a block of grouped
            keys and values more key/value heads (a mixer without ``kv_heads`` in place of a GQA
            attention), each head is repeated for the query heads it served (manifest ``weights.repeated``).
            Or a function ``write(path)`` that writes the model's exact weights file there: an import
            streams its conversion into the build's own ``model.safetensors``, and the model takes those
            tensors (never initialised, never copied).
        strict_weights: refuse ``weights`` unless they fit the model exactly (every tensor, by name,
            shape and dtype). A training run directory's checkpoint is always loaded strictly.
        calibrate: measure the modes of ``mode: auto`` mixers that this machine's calibration lacks
            (inference at batch 1 and ``max_len``) and plan by the measurements; False plans from the
            cache and the cost model only.
        device: where the model is verified, compiled, exported and measured ("cpu", "cuda", "cuda:N";
            default the CPU). The exported programs are for that device (``torch.export`` records it);
            ``spec.yaml`` and ``model.safetensors`` (weights on the CPU) load anywhere. On a GPU the plan
            comes from the cost model, not from a calibration.
        on_stage: called as each stage starts and ends (the CLI draws its progress display with it).
        tokenizer: the model's tokenizer (:class:`attnspec.tokenizer.Tokenizer`, or its file; by default a run's
            own, or that of the build whose ``model.safetensors`` ``weights`` names), copied into the
            build (``tokenizer.json`` or ``tokenizer.tiktoken``, its identity in the manifest) so ``attnspec
            run`` and ``eval`` take text and ``export-hf`` carries it; a run directory's own is carried by
            default. Its vocabulary must fit the spec's.
        generation: a released model's decoding defaults, written as ``generation_config.json``
            (:mod:`attnspec.compiler.generation`: checked fields only; ``import-hf`` carries a checkpoint's).
        beside_compile_check: called once with the verified model after its files are written, while the
            compile check's process runs on another core (``import-hf`` computes its side of the comparison
            with transformers there); its exceptions fail the build.

    Raises:
        SpecError: the spec is invalid (nothing is written). BuildError: a stage failed, or the output
            is not ours to write (the output is left as it was).
    """
    output = Path(output)
    device = resolve_device(device)
    check_output(output, force)
    fix = "they must come from a model of this spec"
    if strict_weights:
        fix += " (without --strict-weights, what fits is loaded and the rest initialised)"
    run_directory = None
    if not isinstance(spec_path, dict) and Path(spec_path).is_dir():
        run_directory = Path(spec_path)
        spec_path, weights = _from_run(run_directory, weights)
        strict_weights, fix = True, "the run's checkpoint does not fit its own spec"
        if tokenizer is None:  # the run's copy of its text task's tokenizer, checked against its run.json
            tokenizer = tokenizer_of(run_directory)
    head_groups = None
    if isinstance(weights, (str, Path)) and (Path(weights).parent / MANIFEST).is_file():  # a build's weights
        if tokenizer is None:  # an edited build carries its source build's tokenizer
            tokenizer = tokenizer_of(Path(weights).parent)
        if not strict_weights:  # its shared key/value heads repeated where the edit gives a block more
            head_groups = grouped_projections_of(Path(weights).parent)
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    seconds: dict[str, float] = {}
    stage = _Stages(on_stage)
    with _internal_errors_as_build_errors():
        with stage("parse", seconds):
            data, smap = load_data(spec_path, overrides)
        with stage("validate", seconds):
            spec = validate_data(data, smap)
            expected = check_model_size(spec)
        with stage("plan", seconds):
            calibration = device_calibration(device)
            auto = any(block.mixer.mode == "auto" for _, block in iter_blocks(spec, expand=True))
            if calibrate and calibration is None and auto:
                from attnspec.compiler.calibrate import calibrate_spec

                calibration = calibrate_spec(spec, regime="inference", batch=1, length=spec.max_len)
            plan = plan_spec(spec, for_build=True, calibration=calibration, device=device.type)
        # A structure whose check passed before on this machine (the same spec but for its name and
        # seed, the same modes and versions) compiles to the same graphs: its check is reused. Otherwise
        # the check's process starts now, needing nothing this build writes, and runs beside all of it.
        level = "inductor" if compile_check is True else compile_check
        if level not in (False, *CHECK_BACKENDS):
            raise ValueError(f"compile_check={compile_check!r}: True, False or one of {sorted(CHECK_BACKENDS)}")
        deep_enough = [] if not level else ["inductor"] if level == "inductor" else [level, "inductor"]
        keys = [check_key(spec_to_data(spec, minimal=False), plan.full_modes, device.type, each) for each in deep_enough]
        reused = next(filter(None, map(passed_before, keys)), None)
        with contextlib.ExitStack() as stack:  # the check's process ends with the build, however it ends
            background = None
            if keys and reused is None:
                background = stack.enter_context(BackgroundCheck(spec, plan.full_modes, device, level))
            scratch = stack.enter_context(Scratch(output))  # nothing is written before this point
            if background is not None:
                stage.started("compile")
            with stage("lower", seconds):
                fit, streamed = None, callable(weights)
                if streamed:  # the weights file is the model's own, written once where the build keeps it
                    weights(scratch.path / "model.safetensors")
                    model = lower(spec, plan, empty=True)
                    fit = load_weights(model, scratch.path / "model.safetensors", fix=fix)
                else:
                    model = lower(spec, plan)
                    if weights is not None:  # a run's checkpoint: its master weights, float32 for a half spec
                        fit = load_weights(model, weights if isinstance(weights, dict) else Path(weights),
                                           fix=fix, strict=strict_weights, cast=run_directory is not None,
                                           head_groups=head_groups)
                parameters = sum(p.numel() for p in model.parameters())
                if parameters != expected:  # a lowering bug, never a user error
                    raise BuildError(f"internal: built {parameters} parameters, the spec implies {expected}")
                header = f"resolved spec of {spec.name}, built by attnspec {VERSION}"
                (scratch.path / "spec.yaml").write_text(to_yaml(spec, minimal=False, header=header))
                if not streamed:
                    save_tensors(scratch.path / "model.safetensors", _weights(model))
                if tokenizer is not None:
                    if spec.input.kind != "tokens" or tokenizer.vocab_size > spec.input.vocab_size:
                        raise BuildError(f"the tokenizer {tokenizer.path} has {tokenizer.vocab_size:,} ids; the spec's "
                                         f"vocabulary {getattr(spec.input, 'vocab_size', 0):,} must hold them")
                    tokenizer_identity = save_tokenizer(tokenizer, scratch.path)
                if generation:
                    write_generation_config(scratch.path, checked_generation_config(
                        generation, getattr(spec.input, "vocab_size", 0), "the generation config"))
                model.to(device)
            with stage("verify", seconds):
                problem = non_finite_problem(model)
                if problem is not None:
                    raise BuildError(problem)
                verification = verify_model(model)
                if not verification.ok:
                    worst = max(verification.rows, key=lambda row: row.rel_diff)
                    raise BuildError(f"mode verification failed: {worst.layer} in {worst.mode} differs by "
                                     f"{worst.rel_diff:.2e} (tolerance {worst.tolerance:.0e})")
            with stage("export", seconds):
                exported, programs = _export(model, scratch.path, aot, programs)
            if beside_compile_check is not None:
                beside_compile_check(model)
            compiled = None if reused is None else {**reused, "reused": True}
            if background is not None:
                compiled, seconds["compile"] = background.result()
                seconds["compile"] = round(seconds["compile"], 3)
                stage.finished("compile", seconds["compile"])
                remember_pass(keys[0], compiled)
            with stage("measure", seconds):  # after the compile check: its process would slow these
                _measure_speeds(model, programs, exported)
            manifest = _manifest(spec, plan, model, parameters, verification, compiled, exported, seconds,
                                 scratch.path, device, fit)
            if tokenizer is not None:
                manifest["tokenizer"] = tokenizer_identity
            (scratch.path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            scratch.publish(force)
    return BuildResult(output, manifest, seconds)


def export_directory(directory: Path | str, programs: Iterable[str] = PROGRAMS, output: Path | str | None = None, *,
                     aot: bool = False, compile_check: bool | str = "trace", force: bool = False,
                     on_stage: StageCallback | None = None) -> BuildResult:
    """``attnspec export``: a build directory with the exported programs it lacks (an import writes none).

    The directory is read as :func:`attnspec.compiler.load.load_model` reads it (its files checked against
    its manifest) and built again from its resolved spec and exact weights (strictly: every tensor,
    name, shape and dtype), its tokenizer carried, with ``programs`` (and ``aot`` packages). Into
    ``output`` (a new build directory, or a build directory with ``force``), else in place: the
    directory is replaced as a whole once the new one is complete, so a failure leaves it as it was.
    Its compile check is reused where the same structure passed on this machine before.
    """
    from attnspec.compiler.load import read_manifest

    directory = Path(directory)
    manifest = read_manifest(directory)  # every file checked against the manifest before anything is read
    check_plugins(directory, manifest.spec.get("plugins"))
    in_place = output is None or Path(output).resolve() == directory.resolve()
    return build_directory(manifest.spec, directory if in_place else Path(output), compile_check=compile_check,
                           force=force or in_place, weights=directory / "model.safetensors", strict_weights=True,
                           calibrate=False, device=manifest.device, on_stage=on_stage,
                           tokenizer=tokenizer_of(directory), programs=programs, aot=aot)


def _from_run(directory: Path, weights) -> tuple[dict, Path]:
    """A training run directory's resolved spec and the weights of its latest checkpoint (name -> tensor)."""
    from attnspec.io import RUN_FILE, checkpoint_tensors, latest_checkpoint, read_run

    if not (directory / RUN_FILE).is_file():
        raise BuildError(f"{directory}: a directory, but not a training run directory (no {RUN_FILE}); give a "
                         "spec file or a run directory written by `attnspec train`")
    record = read_run(directory)
    if weights is None:  # whole tensors, from one file or from each process's shard
        weights = checkpoint_tensors(latest_checkpoint(directory)[1], "model")
    return record["spec"], weights


def save_model(model, directory: Path | str, *, force: bool = False, aot: bool = False,
               compile_check: bool | str = "trace", on_stage: StageCallback | None = None) -> BuildResult:
    """Write ``model`` (an attnspec model, trained or not) as a build directory: its spec with its
    current weights, verified, compiled and exported exactly like ``attnspec build``, on the model's
    device.

    Args:
        model: a model from :func:`attnspec.build`, :func:`attnspec.load` or a training run.
        directory: the build directory to create (``force`` replaces a build directory).
    """
    from attnspec.spec.emit import spec_to_data

    spec = getattr(getattr(model, "module", model), "spec", None)
    if spec is None:
        raise BuildError(f"attnspec.save takes an attnspec model (it carries its spec), got {type(model).__name__}")
    module = getattr(model, "module", model)
    weights = {name: tensor.detach().cpu() for name, tensor in module.state_dict().items()}
    return build_directory(spec_to_data(spec, minimal=False), directory, weights=weights, strict_weights=True,
                           force=force, aot=aot, compile_check=compile_check, device=module.embed.weight.device,
                           on_stage=on_stage)


def _export(model, scratch: Path, aot: bool, wanted: Iterable[str] = PROGRAMS) -> tuple[dict, dict]:
    """Export the ``wanted`` programs the model has: ``model.pt2``, ``step.pt2`` for a model that decodes,
    ``prefill.pt2`` where every mixer computes its prompt in one pass (:attr:`Model.prefills_in_one_pass`),
    with ``aot`` their AOTInductor packages too, and check the full-sequence and prefill programs against
    eager. Returns the manifest's ``export`` entries and the programs by file name (for
    :func:`_measure_speeds`)."""
    wanted = check_programs(wanted)
    check_length = max(2, min(model.spec.max_len, 37))
    inputs = example_input(model, 2, check_length, torch.Generator().manual_seed(1))
    info, exported = {}, {}
    if "model" in wanted:
        program = export_model(model, scratch / "model.pt2")
        with torch.no_grad():
            diff = (program.module()(inputs) - model(inputs)).abs().max().item()
        info["model.pt2"] = {"checked_length": check_length, "max_abs_diff_vs_eager": diff}
        exported["model.pt2"] = program
    if model.prefills_in_one_pass and "prefill" in wanted:
        prefill = export_prefill(model, scratch / "prefill.pt2")
        capacity = min(model.spec.max_len, check_length + 5)  # a generation's capacity, not the traced one
        with torch.no_grad():  # the logits at the last position and every state tensor
            got = prefill.module()(inputs, *model.init_state(inputs.shape[0], capacity))
            want = model.prefill(inputs, last_only=True, capacity=capacity)
            diff = max((a.double() - b.double()).abs().max().item() for a, b in zip(got, want))
        info["prefill.pt2"] = {"checked_length": check_length, "max_abs_diff_vs_eager": diff, "takes_state": True}
        exported["prefill.pt2"] = prefill
    if model.has_step and "step" in wanted:
        exported["step.pt2"] = export_step(model, scratch / "step.pt2")
        info["step.pt2"] = {"state": state_signature(model)}
    programs = {name: program.module() for name, program in exported.items()}
    if aot:
        from torch._inductor import aoti_compile_and_package, aoti_load_package

        for name, program in exported.items():
            aot_name = name.replace(".pt2", ".aoti.pt2")
            package = aoti_compile_and_package(program, package_path=str(scratch / aot_name))
            info[aot_name], programs[aot_name] = {}, aoti_load_package(package)
    return info, programs


def _measure_speeds(model, programs: dict, info: dict) -> None:
    """Tokens per second of every artifact into its ``info`` entry: full-sequence programs at batch
    ``SPEED_BATCH`` and :func:`~attnspec.compiler.speed.speed_length`, decoding steps at batch 1
    (:func:`~attnspec.compiler.speed.speed_steps`), each beside ``attnspec.load``'s eager model for the
    portable programs."""
    parameters = sum(p.numel() for p in model.parameters())  # a larger model is timed on fewer tokens (SPEED_WORK)
    inputs = example_input(model, SPEED_BATCH, speed_length(parameters, model.spec.max_len),
                           torch.Generator().manual_seed(2))
    sequence_at = {"batch": int(inputs.shape[0]), "length": int(inputs.shape[1])}
    # the warm-up step and the timed ones stay within the positions a full cache holds
    steps = speed_steps(parameters) if model.decode_limit is None else \
        max(1, min(speed_steps(parameters), model.decode_limit - 1))
    decode_at = {"batch": 1, "steps": steps}
    decodes = model.has_step and any(name.startswith(("prefill", "step")) for name in programs)
    state = model.init_state(inputs.shape[0], inputs.shape[1]) if decodes else ()  # a prefill writes it (none: no
    # program reads it, and a 30-block model's caches at the measured length are a checkpoint's worth of memory)
    for name, program in programs.items():
        if name.startswith("model"):
            info[name].update(tokens_per_second=sequence_speed(program, inputs), speed_at=sequence_at)
            if name == "model.pt2":
                info[name]["eager_tokens_per_second"] = sequence_speed(model, inputs)
        elif name.startswith("prefill"):
            info[name].update(tokens_per_second=sequence_speed(lambda x: program(x, *state), inputs),
                              speed_at=sequence_at)
            if name == "prefill.pt2":
                info[name]["eager_tokens_per_second"] = sequence_speed(lambda x: model.prefill(x, last_only=True,
                                                                                                into=state), inputs)
        else:
            info[name].update(tokens_per_second=decode_speed(program, model.init_state(1), steps), speed_at=decode_at)
            if name == "step.pt2":
                info[name]["eager_tokens_per_second"] = decode_speed(model.step, model.init_state(1), steps)


def _manifest(spec, plan, model, parameters, verification, compiled, exported, seconds, scratch: Path,
              device: torch.device, fit=None) -> dict:
    files = {name: {"sha256": sha256(scratch / name), "bytes": (scratch / name).stat().st_size}
             for name in FILE_NAMES if (scratch / name).exists()}
    return {
        "format": FORMAT,
        "name": spec.name,
        "attnspec_version": VERSION,
        "torch_version": torch.__version__,
        "parameters": parameters,
        "input": spec.input.kind,
        "vocab_size": getattr(spec.input, "vocab_size", None),
        "head": spec.head.kind,
        "causal": all(block.mixer.causal for block in model.blocks),
        "max_len": spec.max_len,
        "dtype": spec.dtype,
        "device": device.type,
        "plan": plan.to_json(),
        "spec": spec_to_data(spec, minimal=False),
        "verification": verification.to_json(),
        "compile": compiled,
        "export": exported,
        "has_step": model.has_step,
        "decode_limit": model.decode_limit if model.has_step else None,
        "stage_seconds": seconds,
        "files": files,
        "weights": None if fit is None else fit.to_json(),
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


class _Stages:
    """``with stages("lower", seconds):`` times a stage into ``seconds`` and reports it to ``on_stage``."""

    def __init__(self, on_stage: StageCallback | None):
        self.on_stage = on_stage

    def started(self, name: str) -> None:
        """A stage that runs beside others (the compile check's process)."""
        if self.on_stage is not None:
            self.on_stage(name, None)

    def finished(self, name: str, seconds: float) -> None:
        if self.on_stage is not None:
            self.on_stage(name, seconds)

    @contextmanager
    def __call__(self, name: str, seconds: dict[str, float]) -> Iterator[None]:
        if self.on_stage is not None:
            self.on_stage(name, None)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds[name] = round(time.perf_counter() - start, 3)
            if self.on_stage is not None:
                self.on_stage(name, seconds[name])
