"""The ``attnspec`` commands: a thin typer app over the library (what they show: :mod:`.display`).

Every command calls one library function and formats its result. Errors a user can
cause are :class:`~attnspec.errors.AttnSpecError`s, printed without a traceback, and
the process exits with code 2. Anything else is a bug in attnspec: it is reported in
one line (set ``ATTNSPEC_DEBUG=1`` for the traceback) with exit code 70.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional

import typer
import typer.core
from rich.markup import escape

from attnspec.cli.display import (TrainingDisplay, calibration_text, err, evaluation_table, explain_table, out,
                                  print_build_summary, print_report, rich_table, scoring_progress, stage_progress,
                                  verify_table)
from attnspec.cli.metrics import metrics_text
from attnspec.errors import AttnSpecError, RunInterrupted, SpecError, check_whole

app = typer.Typer(
    name="attnspec",
    help="Declarative sequence-mixer models: check, explain, build, verify and run specs; import and export "
         "transformers models; train, evaluate, ablate and diagnose.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

SetOption = typer.Option(
    None, "--set", "-s", metavar="PATH=VALUE",
    help="Override one value of the spec, e.g. --set layers[0].mixer.feature_map=relu. Repeatable; "
         "the value is read as YAML (3, true, [3, 1], {kind: cos, M: 2048}).",
)

# The options of every command that builds (build, import-hf)
NoCalibrateOption = typer.Option(False, "--no-calibrate", help="Plan from the calibration cache and the cost model "
                                 "only; do not measure missing modes.")
NoCompileOption = typer.Option(False, "--no-compile", help="Skip the torch.compile check.")
InductorOption = typer.Option(False, "--inductor", help="Run the compile check through Inductor's generated code "
                              "(15-30 s more on 2 cores). By default the check traces each distinct block whole "
                              "with Dynamo and AOTAutograd (fullgraph) and runs that graph against eager.")


def compile_level(no_compile: bool, inductor: bool) -> bool | str:
    """The compile check a command's ``--no-compile`` and ``--inductor`` ask for."""
    if no_compile and inductor:
        raise AttnSpecError("--no-compile skips the compile check that --inductor deepens: give one of them")
    return False if no_compile else "inductor" if inductor else "trace"


def programs_option(default: str, note: str = "") -> typer.Option:
    return typer.Option(default, "--programs", help="The exported programs to write: some of model, prefill, step "
                        "(comma-separated), all or none. Each loads with plain torch.export.load, holds its own copy "
                        "of the weights and takes seconds of tracing per block; attnspec.load, run, eval, train and "
                        f"export-hf need none of them. Default: {default}{note}.")
ForceOption = typer.Option(False, "--force", help="Replace an existing build directory.")


@app.callback()
def _options(
    plugins: Optional[List[str]] = typer.Option(
        None, "--plugin", metavar="MODULE",
        help="Allow specs to import this plugin module (repeatable; also $ATTNSPEC_PLUGINS=a,b). A spec, sweep or "
             "build directory names plugins under `plugins:`, but attnspec imports only the modules you allow "
             "here or install as entry points: importing a module runs its code."),
) -> None:
    """Declarative sequence-mixer models: check, explain, build, verify and run specs; import and export
    transformers models; train, evaluate, ablate and diagnose."""
    if plugins:
        from attnspec.spec.components import allow_plugins

        allow_plugins(plugins)


def _print_error(error: AttnSpecError) -> None:
    problems = error.problems if isinstance(error, SpecError) else [error]
    for problem in problems:
        err.print(f"error: {problem}", style="red", markup=False)


@app.command()
def check(
    files: List[Path] = typer.Argument(..., metavar="FILE...", help="Spec files (*.yaml, *.yml, *.attn)."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Validate spec files and print one line per valid spec.

    Each valid spec prints its name, number of blocks, mixer kinds and requested modes.
    Every problem is printed as FILE:LINE:COLUMN: PATH: MESSAGE. Exits with code 2 if
    any file is invalid.
    """
    from attnspec.spec import iter_blocks, load_spec

    failed = 0
    for file in files:
        try:
            spec = load_spec(file, overrides or ())
        except AttnSpecError as error:
            _print_error(error)
            failed += 1
            continue
        blocks = iter_blocks(spec, expand=True)
        kinds = Counter(block.mixer.kind for _, block in blocks)
        modes = sorted({block.mixer.mode for _, block in blocks})
        kind_text = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
        out.print(f"ok {file}: {spec.name}: {len(blocks)} blocks ({kind_text}), modes: {', '.join(modes)}",
                  markup=False)
    if failed:
        err.print(f"{failed} of {len(files)} spec(s) invalid", style="red", markup=False)
        raise typer.Exit(2)


@app.command()
def schema(
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the generated spec reference (Markdown)."),
    sweep: bool = typer.Option(False, "--sweep", help="Print the JSON Schema of sweep files (attnspec ablate) "
                                                      "instead."),
    plugins: Optional[List[str]] = typer.Option(None, "--plugin", metavar="MODULE",
                                                help="Import a plugin module first, so its components are in the "
                                                     "schema (installed plugins are always included). Repeatable."),
) -> None:
    """Print the JSON Schema of specs (draft-07, for editors' YAML language servers).

    Point your editor at it with a first line
    `# yaml-language-server: $schema=<path>/attnspec.schema.json`. With --markdown,
    print the spec reference that docs/spec-reference.md is generated from; with --sweep, the
    schema of sweep files (schema/sweep.schema.json).
    """
    from attnspec.spec.components import allow_plugins, import_plugins, load_entry_points
    from attnspec.spec.schema import json_schema_text, reference_markdown

    load_entry_points()
    allow_plugins(list(plugins or []))
    import_plugins(list(plugins or []), lambda path: None)
    if sweep:
        from attnspec.ablation.sweep import sweep_json_schema_text

        text = sweep_json_schema_text()
    else:
        text = reference_markdown() if markdown else json_schema_text()
    if output is None:
        sys.stdout.write(text)
    else:
        _write_text(output, text)


@app.command()
def fmt(
    file: Path = typer.Argument(..., help="Spec file to convert (*.yaml, *.yml, *.attn)."),
    to: str = typer.Option(..., "--to", help="Output format: yaml or attn."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Convert a spec between YAML and the compact grammar (and normalise it).

    The output is validated first; values equal to their defaults are left out and
    `extends` is applied (the output is self-contained).
    """
    from attnspec.spec import load_spec, to_attn, to_yaml

    if to not in ("yaml", "attn"):
        raise AttnSpecError(f"--to must be 'yaml' or 'attn', got '{to}'")
    spec = load_spec(file, overrides or (), resolved=False)
    text = to_yaml(spec, folder=Path.cwd() if output is None else Path(output).parent) if to == "yaml" \
        else to_attn(spec)
    if output is None:
        sys.stdout.write(text)
    else:
        _write_text(output, text)


def _write_text(path: Path, text: str) -> None:
    """Write atomically: a temporary file renamed over ``path`` (attnspec's one writer, :mod:`attnspec.io`)."""
    from attnspec.io import write_atomic

    write_atomic(path, text)


@app.command()
def explain(
    file: Path = typer.Argument(..., help="Spec file, or a build or training run directory (its spec.yaml)."),
    length: int = typer.Option(None, "--length", "-L", help="Sequence length to plan for (default: max_len)."),
    batch: int = typer.Option(8, "--batch", "-B", help="Micro-batch of the training regime."),
    calibrate: bool = typer.Option(False, "--calibrate", help="Measure the modes on this machine now (missing "
                                   "entries; with --refresh all) rather than only reading the calibration cache."),
    refresh: bool = typer.Option(False, "--refresh", help="With --calibrate: measure again what is cached."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Show the execution plan: per layer its parts, parameters and decoding state, and per regime
    (inference at batch 1, training at --batch, one-token decoding) the mode and kernel chosen, every
    valid mode's estimated and measured time, and why."""
    from attnspec.compiler.plan import plan_spec
    from attnspec.compiler.sizes import layer_sizes
    from attnspec.spec import limits, load_spec
    from attnspec.spec.ir import iter_blocks
    from attnspec.training.config import COMPILE_AUTO_REASON, MAX_BATCH

    if file.is_dir() and (file / "spec.yaml").is_file():  # a build or a run: the resolved spec it holds
        file = file / "spec.yaml"
    spec = load_spec(file, overrides or ())
    # a plan may be asked for past max_len (how the modes' costs go on), within attnspec's longest sequence
    L = spec.max_len if length is None else check_whole("--length", length, 1, limits.MAX_LEN)
    check_whole("--batch", batch, 1, MAX_BATCH)
    regimes = [("inference", 1, False), ("training", batch, True)]
    if calibrate:
        from attnspec.compiler.calibrate import calibrate_spec

        for regime, B, _ in regimes:
            calibrate_spec(spec, regime=regime, batch=B, length=L, refresh=refresh)
    blocks = [block for _, block in iter_blocks(spec, expand=True)]
    plans = [(regime, plan_spec(spec, length=L, batch=B, training=training)) for regime, B, training in regimes]
    table = explain_table(spec, L, [block.mixer for block in blocks], plans, layer_sizes(spec),
                          [block.shared.name if block.shared else None for block in blocks],
                          [block.mlp for block in blocks])
    width = None if out.is_terminal else 100  # piped or logged: lines a reader's window holds
    out.print(table, width=width)
    out.print(f"[dim]{escape(COMPILE_AUTO_REASON)}[/dim]", width=width, soft_wrap=False)
    out.print(f"[dim]{escape(calibration_text(blocks, plans, L, batch))}[/dim]", width=width, soft_wrap=False)








@app.command()
def build(
    file: Path = typer.Argument(..., help="Spec file to build, or a training run directory (its trained weights)."),
    output: Path = typer.Option(..., "--output", "-o", help="Build directory to create."),
    overrides: Optional[List[str]] = SetOption,
    weights: Optional[Path] = typer.Option(None, "--weights", help="Trained weights (safetensors) for the spec's "
                                           "model: every tensor whose name and shape fit is loaded, the rest keep "
                                           "the spec's init and are listed (an edited import builds)."),
    strict_weights: bool = typer.Option(False, "--strict-weights", help="Refuse --weights unless every tensor fits "
                                        "(no tensor initialised, none left over)."),
    aot: bool = typer.Option(False, "--aot", help="Also write AOTInductor packages (model.aoti.pt2, step.aoti.pt2, "
                                                        "prefill.aoti.pt2)."),
    programs: str = programs_option("none", " (build and import-hf alike; with --aot, all); `attnspec export DIR` "
                                    "writes them later"),
    no_calibrate: bool = NoCalibrateOption,
    no_compile: bool = NoCompileOption,
    inductor: bool = InductorOption,
    force: bool = ForceOption,
    device: str = typer.Option("cpu", "--device", help="Build for this device: cpu, cuda or cuda:N. The exported "
                                                       "programs run on it; spec.yaml and the weights load anywhere."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="The model's tokenizer (a tokenizer.json, or "
                                             "a .tiktoken file) to carry: run and eval then take text, export-hf "
                                             "writes it. By default a run directory's own, or that of the build "
                                             "whose model.safetensors --weights names."),
) -> None:
    """Validate, plan, lower, verify, compile and export a spec into a build directory.

    The directory holds spec.yaml (resolved), model.safetensors and manifest.json, and the
    exported programs --programs asks for (none by default, as import-hf): model.pt2
    (torch.export, dynamic batch and length), prefill.pt2 and step.pt2 (a prompt's pass to the
    decoding state, and one-token decoding, for a causal token model). It is written
    atomically: a failing stage leaves nothing behind.
    """
    from attnspec.compiler.build import build_directory, check_programs

    if aot and programs == "none":  # the AOTInductor packages compile the programs: --aot alone asks for them
        programs = "all"
    wanted = check_programs(programs.split(","))
    with stage_progress() as on_stage:
        result = build_directory(file, output, overrides=overrides or (), aot=aot,
                                 compile_check=compile_level(no_compile, inductor),
                                 force=force, weights=weights, strict_weights=strict_weights,
                                 calibrate=not no_calibrate, device=device, on_stage=on_stage, tokenizer=tokenizer,
                                 programs=wanted)
    print_build_summary(result.directory, result.manifest)




class _NamesTypes(typer.core.TyperCommand):
    """A command whose help names the model types of :mod:`attnspec.interop.registry`: ``{imported}`` and
    ``{exported}`` in its text and options are filled in when the help is shown (the registry reads
    every family module, which the other commands need not pay for)."""

    def format_help(self, ctx, formatter) -> None:
        from attnspec.interop.registry import architectures, imported_types

        names = {"imported": ", ".join(imported_types()), "exported": ", ".join(sorted(architectures()))}
        self.help = self.help.format(**names)
        for parameter in self.params:
            if getattr(parameter, "help", None):
                parameter.help = parameter.help.format(**names)
        super().format_help(ctx, formatter)


@app.command("import-hf", cls=_NamesTypes)
def import_hf(
    checkpoint: Path = typer.Argument(..., help="A local transformers checkpoint directory (config.json and "
                                                "safetensors weights), or a GGUF file (or a directory holding one): "
                                                "nothing is downloaded, nothing unpickled."),
    output: Path = typer.Option(..., "--output", "-o", help="Build directory to create."),
    spec_file: Optional[Path] = typer.Option(None, "--spec", help="Also write the spec, minimal and readable, to this "
                                                                  "new file (edit it, then build it with --weights)."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Build for sequences up to this length instead of "
                                          "the config's max_position_embeddings (key/value caches hold max_len)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="The parameters' dtype: float32, bfloat16, float16 or "
                                        "float64. Default: the checkpoint's own (its config's dtype); a GGUF file's, "
                                        "bfloat16 (what its weights were released in)."),
    programs: str = programs_option("none", " (build and import-hf alike); `attnspec export DIR` writes them later"),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the comparison with transformers (with transformers "
                                  "installed, both models run on an 8-token prompt: the largest logit difference "
                                  "and whether 8 greedy tokens agree are printed)."),
    no_calibrate: bool = NoCalibrateOption,
    no_compile: bool = NoCompileOption,
    inductor: bool = InductorOption,
    force: bool = ForceOption,
) -> None:
    """Import a transformers model as a build directory.

    Model types: {imported}.

    The config becomes an attnspec spec in the checkpoint's dtype (bfloat16 stays bfloat16) and
    the weights are mapped onto its model tensor by tensor, written once into the build's
    model.safetensors, then built like any spec (verified per distinct block, compile-checked; no
    exported programs unless --programs asks). Anything attnspec cannot express is an error
    naming the config field and the layers, and nothing is written.
    """
    from attnspec.compiler.build import check_programs
    from attnspec.interop.convert import import_hf as run_import
    from attnspec.io import write_atomic
    from attnspec.spec.emit import to_yaml
    from attnspec.spec.validate import validate_data

    if spec_file is not None and os.path.lexists(spec_file):
        raise AttnSpecError(f"{spec_file} already exists; --spec writes a new file, it never overwrites one")
    if spec_file is not None and not spec_file.parent.is_dir():  # checked before the import's minutes of work
        raise AttnSpecError(f"--spec {spec_file}: the folder {spec_file.parent} does not exist; create it first")
    with stage_progress() as on_stage:
        level = compile_level(no_compile, inductor)
        result = run_import(checkpoint, output, max_len=max_len, force=force, calibrate=not no_calibrate,
                            compile_check=level, on_stage=on_stage, dtype=dtype,
                            programs=check_programs(programs.split(",")), check=not no_check)
    if spec_file is not None:
        spec = validate_data(result.manifest["spec"])
        write_atomic(spec_file, to_yaml(spec, header=f"{spec.description}\nWeights: {output}/model.safetensors "
                                                      f"(attnspec build THIS_FILE -o DIR --weights ...)",
                                        folder=Path(spec_file).parent))
    print_build_summary(result.directory, result.manifest)
    if result.import_check is not None:
        out.print(escape(result.import_check.summary()))


@app.command("export")
def export_programs(
    directory: Path = typer.Argument(..., help="A build directory (import-hf's writes no programs)."),
    programs: str = programs_option("all"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write a new build directory there instead "
                                          "of replacing DIRECTORY (with --force, replace that build directory)."),
    aot: bool = typer.Option(False, "--aot", help="Also write AOTInductor packages (minutes more on 2 cores)."),
    no_compile: bool = NoCompileOption,
    inductor: bool = InductorOption,
    force: bool = ForceOption,
) -> None:
    """Write a build directory's exported programs (model.pt2, prefill.pt2, step.pt2).

    The directory is checked as `attnspec.load` checks it and built again from its spec and exact
    weights with the programs asked for; it is replaced whole once the new one is complete (a
    failure leaves it as it was). Each program holds its own copy of the weights, which is why
    import-hf writes none by default.
    """
    from attnspec.compiler.build import check_programs, export_directory

    wanted = check_programs(programs.split(","))
    with stage_progress() as on_stage:
        result = export_directory(directory, wanted, output, aot=aot, compile_check=compile_level(no_compile, inductor),
                                  force=force, on_stage=on_stage)
    print_build_summary(result.directory, result.manifest)


@app.command("export-hf", cls=_NamesTypes)
def export_hf(
    directory: Path = typer.Argument(..., help="A build directory, or a training run directory (its latest "
                                               "checkpoint)."),
    output: Path = typer.Option(..., "--output", "-o", help="transformers directory to create."),
    model_type: Optional[str] = typer.Option(None, "--model-type", help="Insist on this type ({exported}, or attnspec); "
                                             "default: the native type that states the spec exactly, else attnspec."),
    force: bool = typer.Option(False, "--force", help="Replace an existing directory that export-hf wrote (nothing "
                               "else)."),
) -> None:
    """Write a model as a transformers directory that AutoModelForCausalLM.from_pretrained loads.

    A spec transformers has a class for is written as that model type (it loads without
    attnspec); any other causal token spec as the `attnspec` type, which `import attnspec.hf`
    registers with the Auto classes (generate() runs on attnspec's decoding state).
    """
    from attnspec.interop.convert import export_hf as run_export

    written, kind = run_export(directory, output, model_type=model_type, force=force)
    out.print(f"wrote {written} as model type {kind}", markup=False)
    load = "AutoModelForCausalLM.from_pretrained"
    if kind == "attnspec":
        out.print(f"Load it: import attnspec.hf; from transformers import AutoModelForCausalLM; "
                  f"model = {load}('{written}')", markup=False)
    else:
        out.print(f"Load it: from transformers import AutoModelForCausalLM; model = {load}('{written}')",
                  markup=False)


@app.command()
def verify(
    target: Path = typer.Argument(..., help="A spec file or a build directory."),
    overrides: Optional[List[str]] = SetOption,
) -> None:
    """Run the model in every valid mode in float64 and compare them.

    Prints the largest difference of each mode against the recurrent reference and
    whether it is within tolerance; exits with code 1 if any is not.
    """
    from attnspec.compiler.verify import verify_target

    report = verify_target(target, overrides or ())
    out.print(verify_table(report))
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def run(
    directory: Path = typer.Argument(..., help="A build directory."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help='Input token ids, e.g. "1 2 3".'),
    text: Optional[str] = typer.Option(None, "--text", help="Input text, through the tokenizer the build carries "
                                       "(built with --tokenizer, or from a run of a text task)."),
    generate: int = typer.Option(0, "--generate", "-n", help="Generate this many tokens with the decoding step."),
    temperature: float = typer.Option(0.0, "--temperature", help="Sampling temperature; 0 (the default) is greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Sample among the k most likely tokens only."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Sample among the most likely tokens holding this "
                                          "probability mass only (nucleus sampling)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the draws (the same seed, the same tokens)."),
    programs: bool = typer.Option(False, "--programs", help="Run the exported programs (model.pt2, step.pt2) rather "
                                  "than the model rebuilt from spec.yaml and model.safetensors (slower to start)."),
) -> None:
    """Predict the next token of a prompt; optionally generate with the decoding step (recurrent states
    and key/value caches), greedily or by sampling."""
    from attnspec.compiler.runner import run_directory

    result = run_directory(directory, tokens, generate, programs=programs, temperature=temperature, top_k=top_k,
                           top_p=top_p, seed=seed, text=text)
    out.print(result, markup=False)


@app.command("eval")
def evaluate(
    directory: Path = typer.Argument(..., help="A build directory, or a training run directory (its latest "
                                               "checkpoint)."),
    task: Optional[Path] = typer.Option(None, "--task", help="A JSON-lines task file: {context, continuation} "
                                        "requests (log-likelihood) or {context, choices, label} questions (accuracy); "
                                        "token ids or text (the model's tokenizer, else UTF-8 bytes); or a released "
                                        "task's lines with --format."),
    task_format: str = typer.Option("requests", "--format", help="The task file's format: requests (attnspec's), "
                                    "hellaswag, piqa, arc (ARC-Easy/Challenge) or lambada, each with lm-eval's "
                                    "prompts."),
    text: Optional[Path] = typer.Option(None, "--text", help="A UTF-8 text file: its perplexity over a sliding "
                                        "window, bits per byte and word perplexity (instead of --task)."),
    stride: Optional[int] = typer.Option(None, "--stride", help="With --text: a window of max_len tokens every this "
                                         "many (default max_len: disjoint windows, as lm-eval)."),
    batch_size: int = typer.Option(16, "--batch-size", help="Requests (or windows) scored together, right-padded; "
                                   "each scores as it would alone."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Score a model on a local task file, as lm-evaluation-harness's loglikelihood requests do, or on a
    text file (perplexity).

    Reports the mean log-likelihood, perplexity and greedy-match share of continuations, and the
    accuracy (and per-token accuracy_norm) of multiple-choice questions beside their chance level.
    Text goes through the tokenizer the directory carries (a run of a text task, a build with
    --tokenizer, an import with tokenizer.json); without one, text is read as UTF-8 bytes.
    """
    import dataclasses
    import json

    from attnspec.training.eval_formats import FORMATS
    from attnspec.training.evaluate import check_options, evaluate_file, evaluate_text
    from attnspec.compiler.load import tokenizer_of
    from attnspec.training.rundir import load_trained

    if (task is None) == (text is None):
        raise AttnSpecError("give a task file (--task) or a text file (--text), one of them")
    if task_format not in FORMATS:
        raise AttnSpecError(f"--format must be one of {', '.join(FORMATS)}, got {task_format!r}")
    check_options(batch_size, stride)  # before loading; the stride's bound (max_len) again after
    model = load_trained(directory)
    tokenizer = tokenizer_of(directory)
    parameters = sum(p.numel() for p in model.parameters())
    subject = f"{directory} ({model.spec.name}, {parameters:,} parameters) on {text or task}"
    with scoring_progress("windows" if text is not None else "requests", subject) as update:
        if text is not None:
            result = evaluate_text(model, text, tokenizer=tokenizer, stride=stride, batch_size=batch_size,
                                   on_window=update)
        else:
            result = evaluate_file(model, task, on_request=update, tokenizer=tokenizer, task_format=task_format,
                                   batch_size=batch_size)
    if json_output:
        out.print(json.dumps(dataclasses.asdict(result)), markup=False)
        return
    out.print(evaluation_table(f"{directory} ({model.spec.name}) on {task or text}", result))


@app.command()
def train(
    file: Optional[Path] = typer.Argument(None, metavar="SPEC", help="Spec file (not needed with --resume)."),
    output: Path = typer.Option(..., "--output", "-o", help="Run directory to create (or to resume)."),
    task: Optional[str] = typer.Option(None, "--task", help="Task kind, e.g. mqar, in_context_recall, listops, "
                                                            "sort, python_source (all: docs/training.md's table)."),
    task_overrides: Optional[List[str]] = typer.Option(None, "--task-set", metavar="KEY=VALUE",
                                                       help="A task parameter, e.g. --task-set seq_len=256. Repeatable."),
    overrides: Optional[List[str]] = SetOption,
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Training configuration file (YAML); flags "
                                                                       "override it."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimiser steps."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Global batch size (all processes)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the data streams."),
    accumulate: Optional[int] = typer.Option(None, "--accumulate", help="Micro-batches per step."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Evaluate every N steps (0: at the end)."),
    target: Optional[float] = typer.Option(None, "--target", help="Stop when the task's metric reaches this."),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="Linear warm-up steps (default: 10% of "
                                                                           "--steps)."),
    test_examples: Optional[int] = typer.Option(None, "--test-examples", help="Size of the fixed test set."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Checkpoint every N steps (0: at "
                                                                                   "each evaluation); always at the end."),
    precision: Optional[str] = typer.Option(None, "--precision", help="auto, float32 or bfloat16 (autocast matmuls "
                                                                      "to bf16)."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="AdamW weight decay."),
    compile_: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the training step "
                                                                                 "(default: on CUDA only)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda."),
    planning: Optional[str] = typer.Option(None, "--planning", help="How each `mode: auto` mixer's mode is chosen: "
                                           "model (the cost model: the same computation on every machine; default) "
                                           "or measured (time every mode on this machine first)."),
    tensorboard: bool = typer.Option(False, "--tensorboard", help="Also write TensorBoard event files."),
    init_weights: Optional[str] = typer.Option(None, "--init-weights", help="Start from these weights (a safetensors "
                                               "file, or a build or run directory) where they fit by name and shape; "
                                               "the rest from the spec's init (run.json lists them)."),
    init_weights_map: Optional[List[str]] = typer.Option(None, "--init-weights-map", metavar="FROM=TO",
                                                         help="Rename --init-weights' tensors by name prefix before "
                                                              "they fit (repeatable; the longest prefix applies)."),
    freeze: Optional[List[str]] = typer.Option(None, "--freeze", metavar="PATTERN",
                                               help="Keep the parameters this glob names as they start, e.g. "
                                                    "--freeze 'embed.*' (repeatable; config `freeze`)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in -o from its latest checkpoint: with -o "
                                "alone, or added to the command that started it (what it gives must be the run's "
                                "own); a larger --steps trains a run further, finished or not."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Launch N data-parallel processes with torchrun."),
    parallel: Optional[str] = typer.Option(None, "--parallel", help="How --nproc processes share the model: ddp "
                                           "(each holds all of it; default) or fsdp (each holds 1/N of the "
                                           "parameters, gradients and optimiser state)."),
    activation_checkpointing: Optional[str] = typer.Option(None, "--activation-checkpointing", metavar="none|blocks|N",
                                                           help="Recompute every block's (or every N-th block's) "
                                                                "activations in the backward pass."),
) -> None:
    """Train a spec's model on a task; write metrics, checkpoints and the result to a run directory.

    The run directory holds run.json (resolved spec, configuration, plan, status), spec.yaml,
    config.yaml, metrics.jsonl, checkpoints (safetensors) and result.json. Export the trained
    model with `attnspec build RUN_DIR -o DIR`.
    """
    if nproc is not None:  # a process each: a bound before torchrun starts any
        check_whole("--nproc", nproc, 1, MAX_PROCESSES, " (processes on this machine)")
    from attnspec.training.loop import train as train_model, training_inputs

    flags = {"steps": steps, "batch_size": batch, "lr": lr, "seed": seed, "accumulate": accumulate,
             "eval_every": eval_every, "target": target, "device": device, "planning": planning,
             "warmup_steps": warmup_steps,
             "test_examples": test_examples, "checkpoint_every": checkpoint_every, "precision": precision,
             "weight_decay": weight_decay, "init_weights": init_weights,
             "init_weights_map": _prefix_renames(init_weights_map), "freeze": list(freeze) if freeze else None,
             "compile": None if compile_ is None else ("on" if compile_ else "off"), "parallel": parallel,
             "activation_checkpointing": _whole_or_word(activation_checkpointing),
             "tensorboard": True if tensorboard else None}
    if not resume and file is None:
        raise AttnSpecError("give a spec file to train (or --resume -o RUN_DIR)")
    if nproc is not None and nproc > 1 and "WORLD_SIZE" not in os.environ:
        # what a rank would refuse (spec, configuration, vocabulary, run directory, what N processes can train)
        # is refused here, as one line, before torchrun starts any
        training_inputs(file, config, output=output, overrides=overrides or (), task=task,
                        task_overrides=task_overrides or (), resume=resume, processes=nproc, **flags)
        _launch_torchrun(nproc)
        return
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        with TrainingDisplay(enabled=rank0) as display:
            run = train_model(file, config, output=output, overrides=overrides or (), task=task,
                              task_overrides=task_overrides or (), resume=resume, on_progress=display.update, **flags)
    except RunInterrupted as interrupt:  # said here: typer turns a KeyboardInterrupt into a silent exit 130
        if rank0:
            err.print(str(interrupt), style="red", markup=False)
        raise typer.Exit(130) from None
    if rank0:
        out.print(f"trained {run.step} steps -> {output}: {metrics_text(run.metrics)}\n"
                  f"Next: attnspec build {output} -o {output}-build", markup=False)


def _whole_or_word(value: Optional[str]):
    """A flag taking a word or a count (``--activation-checkpointing blocks`` or ``2``) as the configuration's
    value: digits become the number (the configuration's validation bounds and names both)."""
    return int(value) if value is not None and value.isdigit() and len(value) < 10 else value


def _prefix_renames(pairs: Optional[List[str]]) -> Optional[dict]:
    """``--init-weights-map FROM=TO`` flags as a mapping (None without any)."""
    if not pairs:
        return None
    malformed = [pair for pair in pairs if "=" not in pair or not pair.split("=", 1)[0]]
    if malformed:
        raise AttnSpecError(f"--init-weights-map takes FROM=TO (a name prefix of the file's tensors, then the "
                            f"model's), got {malformed[0]!r}")
    return dict(pair.split("=", 1) for pair in pairs)


@app.command()
def ablate(
    file: Path = typer.Argument(..., metavar="SWEEP", help="Sweep file (YAML)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Runs directory (created, or taken up again: "
                                                                       "finished runs are skipped, interrupted ones "
                                                                       "resume)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate every run and list them with estimates; run "
                                                          "nothing."),
    runner: str = typer.Option("local", "--runner", "--backend", help="Where runs execute: local (worker processes) "
                               "or ray (--backend is the old name)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS, or a "
                                                                  "local Ray instance)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Local worker processes (default: "
                                                                         "cores / threads)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Threads per run (default: cores / "
                                                                         "workers; 1 on Ray)."),
) -> None:
    """Run every variant x task x seed x learning rate of a sweep as `attnspec train` runs, then report.

    Every variant and task point is validated before anything runs; --dry-run lists the runs with
    parameters, state size, estimated FLOPs and time, and each variant's differences from the base.
    Run again to take up an interrupted sweep or to add variants: only unfinished runs run.
    """
    from attnspec.ablation.ablate import ablate as run_sweep, plan_sweep
    from attnspec.ablation.runners import sizing
    from attnspec.cli.sweeps import SweepProgress, print_plan

    plan = plan_sweep(file, output)
    if dry_run:
        print_plan(out, plan, sizing(len(plan.todo), workers, threads)[0] if runner == "local" else 1)
        return
    if output is None:
        raise AttnSpecError("give a runs directory with -o RUNS_DIR (or --dry-run to only check the sweep)")
    with SweepProgress(out) as progress:
        outcome = run_sweep(plan, output, runner=runner, workers=workers, threads=threads, address=address,
                            on_event=progress.update)
    print_report(output)
    out.print(f"{outcome.ran} run(s) in {outcome.seconds:.0f} s, {outcome.skipped} already done, "
              f"{len(outcome.failed)} failed, {len(outcome.diverged)} diverged, {len(outcome.busy)} being trained by "
              f"another process; report: {output / 'report' / 'report.html'}", markup=False)
    for busy in outcome.busy:
        out.print(f"elsewhere: {busy['label']} (runs/{busy['key']}) is being trained by another process; run "
                  "`attnspec report` when it ends", markup=False)
    if outcome.failed:
        for failure in outcome.failed:
            err.print(f"failed: {failure['label']} (runs/{failure['key']}): {failure['error']}", style="red",
                      markup=False)
        raise typer.Exit(1)


@app.command()
def report(
    directory: Path = typer.Argument(..., metavar="RUNS_DIR", help="A runs directory written by attnspec ablate."),
) -> None:
    """Write RUNS_DIR/report (results.csv, results.md, plots, report.html) and print the results table."""
    from attnspec.ablation.report import write_report

    write_report(directory)
    print_report(directory)
    out.print(f"report: {directory / 'report' / 'report.html'}", markup=False)




# ----------------------------------------------------------------------------- diagnose
# Every diagnostic is one module of attnspec.diagnostics declaring its parameters as data; this group
# finds them when `attnspec diagnose` runs (not before: their modules import torch) and turns each
# declaration into a command. The CLI only renders the table a diagnostic returns.


class _Diagnostics(typer.core.TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        from attnspec.diagnostics import diagnostics

        return list(diagnostics())

    def get_command(self, ctx, name: str):
        from attnspec.diagnostics import diagnostics

        declared = diagnostics().get(name)
        return _diagnostic_command(declared) if declared is not None else None


def _diagnostic_command(declared):
    """The click command of a :class:`~attnspec.diagnostics.Diagnostic` (its parameters as typer's)."""
    import inspect

    parameters, annotations = [], {}
    for parameter in declared.parameters:
        kind = List[parameter.kind] if parameter.many else (
            Optional[parameter.kind] if parameter.default is None else parameter.kind)
        default = ... if parameter.default is ... else parameter.default
        if parameter.positional:
            info = typer.Argument(default, metavar=parameter.metavar, help=parameter.help)
        else:
            flags = parameter.flags or (f"--{parameter.name.replace('_', '-')}",)
            info = typer.Option(default, *flags, min=parameter.minimum, max=parameter.maximum, help=parameter.help,
                                metavar=parameter.metavar)
        parameters.append(inspect.Parameter(parameter.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                            annotation=kind))
        annotations[parameter.name] = kind

    repeated = {parameter.name for parameter in declared.parameters if parameter.many}

    def command(**values) -> None:
        result = declared.run(**{name: [] if value is None and name in repeated else value
                                 for name, value in values.items()})
        out.print(rich_table(result.table))
        out.print(f"wrote {', '.join(str(f) for f in result.files)}", markup=False)

    command.__signature__ = inspect.Signature(parameters)
    command.__annotations__ = annotations
    command.__doc__ = declared.summary
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    single.command(declared.name)(command)
    return typer.main.get_command(single)




diagnose_app = typer.Typer(cls=_Diagnostics, help="Measurements the papers make, on a spec or a trained run: a CSV "
                                                  "table and a plot (PNG, SVG) each.", no_args_is_help=True,
                           rich_markup_mode=None)
app.add_typer(diagnose_app, name="diagnose")


MAX_PROCESSES = 256
"""The most processes ``train --nproc`` starts on one machine (8 GPUs, or the cores of a large host)."""


def _launch_torchrun(nproc: int) -> None:
    """Re-run this command under torchrun with ``nproc`` processes (the --nproc flag removed). The ranks'
    output passes through; where a rank fails with attnspec's error, that one ``error:`` line is what the
    user sees (once, however many ranks said it), not torchrun's report of the failed child after it, and
    the exit status is the rank's (2)."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    import subprocess

    from attnspec.io import start_python

    # PYTHONSAFEPATH (inherited by the ranks torchrun starts): no module from the working directory there either
    process = start_python("torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "attnspec",
                           *args, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        shown = _ranks_stderr(process.stderr)
        code = process.wait()
    except BaseException:  # Ctrl-C: the ranks go with it, as subprocess.call did
        process.kill()
        process.wait()
        raise
    if code:
        raise typer.Exit(2 if shown else code)


def _ranks_stderr(stream) -> bool:
    """Copy the ranks' stderr to ours as it comes, but each ``error:`` line once (every rank refuses the same
    way) and, after one, nothing of torchrun's report of the failed children (its traceback and the box
    naming the rank and exit code). Whether an ``error:`` line was shown."""
    errors: set[str] = set()
    for line in stream:
        if "Setting OMP_NUM_THREADS environment variable for each process" in line or line.startswith("*****"):
            continue  # torchrun's notice that it sets one thread per rank: its choice, not the user's concern
        if line.startswith("error: "):
            if line not in errors:
                errors.add(line)
                sys.stderr.write(line)
                sys.stderr.flush()
        elif not errors:
            sys.stderr.write(line)
            sys.stderr.flush()
    return bool(errors)


def _terminate(signum, frame) -> None:
    """SIGTERM unwinds like Ctrl-C, so a build removes its scratch directory before exiting."""
    raise KeyboardInterrupt


def _settle_garbage_collection() -> None:
    """Collect garbage less often: importing torch makes about a million objects that live as long as the
    process, and Python's default thresholds traverse them in a full collection several times while it
    loads, and once more as the interpreter exits (0.3-0.6 s of the 2 s ``attnspec run`` takes to its first
    token, ``benchmarks/main_job.py``). Young collections every 50,000 allocations rather than 700 still
    free cycles within a training step; freezing the heap at exit leaves what the process held to the OS."""
    gc.set_threshold(50_000, 20, 100)
    atexit.unregister(_freeze_at_exit)  # once, however often main() runs in one process (the tests call it)
    atexit.register(_freeze_at_exit)  # registered first, so it runs after every other exit handler


def _freeze_at_exit() -> None:
    """Skip the interpreter's last full collection (``gc.freeze``), unless Triton is loaded: its nanobind bindings
    print every object a skipped collection leaves behind as a leak, lines of noise after a command's one-line
    error (the commands that compile load it; ``attnspec run`` does not)."""
    if "triton" not in sys.modules:
        gc.freeze()


def main() -> None:
    """Console-script entry point: run the app, turning errors into messages and exit codes.

    Usage errors (unknown option, missing argument) are reported by typer with exit
    code 2; attnspec errors are printed here with exit code 2.
    """
    # OpenMP threads that sleep when idle rather than spin (read when torch loads, and by every child
    # process: sweep workers, compile checks, torchrun ranks): with other processes on the cores, a
    # spinning second thread made a training step 5-20x slower than one thread, a sleeping one 1.1-1.2x
    # (benchmarks/threads.py; docs/ablation.md, "Threads"). A user's own setting stands.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _settle_garbage_collection()
    signal.signal(signal.SIGTERM, _terminate)
    # Off a terminal (a pipe, a log file, a CI job) Python buffers stdout in 8 KiB blocks: a long command's
    # progress lines would all arrive at its end. One line at a time, as a terminal gets them.
    for stream in (sys.stdout, sys.stderr):
        if not stream.isatty() and hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    try:
        app()
    except SystemExit:
        raise
    except AttnSpecError as error:
        _print_error(error)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted; nothing was left half-written", style="red")
        sys.exit(130)
    except Exception as error:  # anything else is a bug in attnspec
        if os.environ.get("ATTNSPEC_DEBUG"):
            raise
        err.print(f"internal error (a bug in attnspec, please report it): {type(error).__name__}: {error}\n"
                  "set ATTNSPEC_DEBUG=1 to see the traceback", style="red", markup=False)
        sys.exit(70)
