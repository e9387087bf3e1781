"""What the command line shows: its consoles, and the tables and progress displays of its commands.

Everything here renders a result the library computed (a plan, a build's manifest, a diagnostic's
table, a training run's events); nothing here computes one.
"""

from __future__ import annotations

import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from attnspec.cli.metrics import metrics_text

# Piped output (CI logs, files) gets a wide fixed width: rich's 80-column default truncates table cells.
# off a terminal (a log, a pipe) tables are 100 columns wide, their cells wrapped between words
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 100)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def calibration_text(blocks: list, plans: list, length: int, batch: int) -> str:
    """What explain's modes rest on: the spec's own ``mode:``, this machine's measurements per regime, or the
    cost model (a build measures inference at batch 1 and ``max_len``; ``--calibrate`` any regime)."""
    if all(block.mixer.mode != "auto" for block in blocks):
        return "Every mixer's mode is fixed by the spec (`mode:`): nothing is chosen, nothing to calibrate."
    shapes = {"inference": f"inference at batch 1, L = {length:,}", "training": f"training at batch {batch}, "
                                                                                  f"L = {length:,}"}
    measured = [shapes[regime] for regime, plan in plans if any(entry.measured for entry in plan.layers)]
    estimated = [shapes[regime] for regime, plan in plans if not any(entry.measured for entry in plan.layers)]
    if not estimated:
        return f"Modes chosen by this machine's measurements ({'; '.join(measured)})."
    return ((f"Measured on this machine: {'; '.join(measured)}. " if measured else "")
            + f"Chosen by the cost model, not measured here: {'; '.join(estimated)} (`--calibrate` measures "
              "them; a build measures inference at batch 1 and max_len, training runs their own shape).")


def explain_table(spec, length: int, mixers: list, plans: list, sizes: list, calls: list | None = None,
                  mlps: list | None = None) -> Table:
    """The plan of ``spec`` at ``length``: per block (``mixers``; ``sizes`` from
    :func:`~attnspec.compiler.sizes.layer_sizes`; ``calls``: the shared block each calls, or None) its parts,
    parameters and decoding state, and per regime of ``plans`` (``[(regime, Plan)]``, inference first) the mode and kernel chosen, every valid
    mode's measured and estimated time, and why; then its one-token decoding; ``mlps``: each block's MLP, shown
    under its mixer's parts. Consecutive blocks whose rows all say the same are one entry (``blocks[0-26] x27``)."""
    from attnspec.compiler.plan import decoding_text, regime_modes
    from attnspec.spec.mixers.base import part_text

    table = Table(title=escape(f"{spec.name}: plan at L = {length}"))
    for column in ("layer", "mixer: parts, size", "regime", "mode · kernel", "valid modes: measured / estimated",
                   "why"):
        table.add_column(column, overflow="fold")  # a long word wraps rather than losing its end
    blocks = []  # (label, the block's rows without their label), then alike neighbours as one
    for index, mixer in enumerate(mixers):
        call = (calls or [None] * len(mixers))[index]
        mlp = (mlps or [None] * len(mixers))[index]
        block = "\n".join([mixer.describe(), *(f"  {name}: {what}" for name, what in mixer.parts()),
                           *([f"mlp: {part_text(mlp)}"] if mlp is not None and not mlp.is_identity else []),
                           *([f"calls shared block '{call}' (its own cache and adapters)"] if call else []),
                           f"parameters {sizes[index].parameters:,}" + (
                               f" ({sizes[index].active_parameters:,} active per token)"
                               if sizes[index].active_parameters != sizes[index].parameters else ""),
                           f"decoding state {byte_size(sizes[index].decode_state_bytes)} per sequence"])
        rows = []
        for regime, plan in plans:
            entry = plan.layers[index]
            times = []
            for mode in regime_modes(mixer, regime):
                measured = (entry.measured or {}).get(mode)
                shown = milliseconds(measured) if measured is not None else entry.skipped.get(mode, "-")
                if measured is not None and entry.spread.get(mode):  # the runs' interquartile range / median
                    shown += f" ±{entry.spread[mode] / 2:.0%}"
                times.append(f"{mode}: {shown} / {milliseconds(entry.candidates[mode])}")
            chosen = f"{entry.full_mode} · {entry.backend}"
            if entry.export_backend != entry.backend and regime == "inference":
                chosen += f"\n(exported: {entry.export_backend})"
            first = regime == "inference"
            rows.append((block if first else "", f"{regime} B{plan.batch}", chosen, "\n".join(times), entry.reason))
        decode = plans[0][1].layers[index]
        held, why = decoding_text(decode)
        rows.append(("", "decoding", f"{decode.decode_mode} · graph" if decode.decode_mode else "-", held, why))
        blocks.append((plans[0][1].layers[index].path, tuple(rows)))
    for label, rows in runs_of_alike_blocks(blocks):
        for number, row in enumerate(rows):
            table.add_row(escape(label) if number == 0 else "", *(escape(cell) for cell in row))
    return table


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def byte_size(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps it at least 1 (B, KiB, MiB, GiB)."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count} B"


@contextmanager
def stage_progress():
    """A progress display of a build's stages; yields the ``on_stage`` callback that draws it: rich's on a
    terminal, else a plain line as each stage starts and ends (``compile...``, ``compile (12.3s)``), so a
    log shows where a long build is while it runs."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not out.is_terminal:
        yield lambda name, seconds: out.print(f"{name}..." if seconds is None else f"{name} ({seconds:.1f}s)",
                                              markup=False)
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=out) as progress:
        tasks: dict[str, int] = {}

        def on_stage(name: str, seconds: float | None) -> None:
            if seconds is None:
                tasks[name] = progress.add_task(f"{name}...", total=1)
            else:
                progress.update(tasks[name], completed=1, description=f"{name} ({seconds:.1f}s)")

        yield on_stage


@contextmanager
def scoring_progress(what: str, subject: str, every: float = 10.0):
    """Progress of an evaluation of ``subject`` (the model and the file); yields ``update(done, total)``
    (``what``: the units, ``windows`` or ``requests``; the first call comes once the file is read): rich's
    transient bar on a terminal (on stderr), else a plain line on stderr at the first call, every ``every``
    seconds and at the end (``scoring DIR (name) on FILE: 1 of 2 windows``), so a log shows it live."""
    from rich.progress import Progress

    if not err.is_terminal:
        last = [None]

        def update(done: int, total: int | None) -> None:
            if last[0] is None or done == total or time.monotonic() - last[0] > every:
                last[0] = time.monotonic()
                err.print(f"scoring {subject}: {done:,} of {total:,} {what}" if total else
                          f"scoring {subject}: {done:,} {what}", markup=False)

        yield update
        return
    with Progress(console=err, transient=True) as progress:
        bar = progress.add_task(escape(f"scoring {subject}: {what}"), total=None)
        yield lambda done, total: progress.update(bar, completed=done, total=total)


def compile_check_text(report: dict) -> str:
    """A compile check's report in words: its level, graphs and difference from eager (a manifest written
    before 2026-11-28 has neither the level, then always Inductor, nor the relative difference)."""
    how = "traced by Dynamo + AOTAutograd, without Inductor" if report.get("backend") == "aot_eager" else "Inductor"
    relative = report.get("max_rel_diff")
    difference = f"max diff {report['max_abs_diff']:.1e}" + ("" if relative is None else f" = {relative:.1e} relative")
    return f"{how}; {report.get('graphs', '?')} block graph(s); {difference}"


def runs_of_alike_blocks(rows: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Consecutive blocks whose rows say the same, as one row: ``("blocks[0] (layers[0]#0)", text)`` ...
    ``("blocks[29] (layers[0]#29)", text)`` become ``("blocks[0-29] x30", text)`` (a 30-block import is
    one line, not thirty); a block unlike its neighbours keeps its own label. ``text``: anything
    comparable (the build summary's cell, explain's rows)."""
    runs: list[list] = []
    for label, text in rows:
        if runs and runs[-1][1] == text:
            runs[-1][2].append(label)
        else:
            runs.append([label, text, [label]])
    grouped = []
    for label, text, labels in runs:
        if len(labels) > 1:
            first, last = (name.split("]")[0].removeprefix("blocks[") for name in (labels[0], labels[-1]))
            label = f"blocks[{first}-{last}] x{len(labels)}"
        grouped.append((label, text))
    return grouped


def print_build_summary(directory: Path, manifest: dict) -> None:
    """The table of what a build produced, and what to run next."""
    table = Table(title=escape(f"built {manifest['name']} -> {directory}"))
    table.add_column("item")
    table.add_column("value")
    table.add_row("parameters", f"{manifest['parameters']:,}")
    rows = [(layer["path"], f"{layer['mixer']}: {layer['full_mode']} · {layer['backend']}"
             + (f" / decode {layer['decode_mode']}" if layer["decode_mode"] else "")
             + (f" ({layer['decode_cache']:,} positions)" if layer.get("decode_cache") else ""))
            for layer in manifest["plan"]["layers"]]
    for label, text in runs_of_alike_blocks(rows):
        table.add_row(escape(label), escape(text))
    fit = manifest.get("weights")
    if fit is not None:
        table.add_row("weights", escape(weights_text(fit)))
    verification = manifest["verification"]
    table.add_row("verification", f"{len(verification['rows'])} mode checks, worst rel. diff "
                                  f"{verification['worst_rel_diff']:.1e}: {'ok' if verification['ok'] else 'FAILED'}")
    compiled = manifest["compile"]
    if compiled is not None:
        table.add_row("compile check", ("reused: a build of the same structure passed on this machine" if
                                        compiled.get("reused") else "ok") + f" ({compile_check_text(compiled)})")
    export = manifest["export"]
    for name, info in manifest["files"].items():
        table.add_row(name, f"{info['bytes'] / 2**20:.2f} MiB" + artifact_speed(export.get(name)))
    if not any(name.endswith(".pt2") for name in manifest["files"]):
        table.add_row("programs", "none: attnspec, transformers (export-hf) and the loop read model.safetensors; "
                                  "`attnspec export DIR` writes model.pt2, prefill.pt2 and step.pt2 for plain PyTorch")
    elif "model.aoti.pt2" not in manifest["files"]:
        table.add_row("model.aoti.pt2", "not built: --aot adds AOTInductor packages of every program (compiled "
                                        "native code; minutes more on 2 cores, decoding 6-15x faster: docs/building.md)")
    table.add_row("stages", ", ".join(f"{k} {v:.1f}s" for k, v in manifest["stage_seconds"].items()))
    out.print(table)
    prompt = "--text \"Once upon a time\"" if manifest.get("tokenizer") else "--tokens \"1 2 3\""  # it carries one
    run = (f"attnspec run {directory} {prompt}" + (" --generate 8" if manifest["has_step"] else "")
           if manifest["input"] == "tokens" else "")
    lines = [f"\nNext: {run}", f"      python -c \"import attnspec; model = attnspec.load('{directory}')\""]
    if "model.pt2" in manifest["files"]:
        lines += ["Load each artifact from plain PyTorch:",
                  f"  model.pt2       program = torch.export.load('{directory}/model.pt2').module(); program(tokens)"]
    if "step.pt2" in manifest["files"]:
        lines.append("  (state: zeros for each entry of manifest.json export.step.pt2.state, (batch, *shape), its "
                     "capacity_axis sized to the prompt plus the tokens to generate; updated in place)")
    if "prefill.pt2" in manifest["files"]:
        lines.append(f"  prefill.pt2     prefill = torch.export.load('{directory}/prefill.pt2').module(); "
                     "logits, *state = prefill(prompt, *state)  (prompt: (batch, length >= 2))")
    if "step.pt2" in manifest["files"]:
        lines.append(f"  step.pt2        step = torch.export.load('{directory}/step.pt2').module(); "
                     "logits, *state = step(token, *state)")
    for name in ("model.aoti.pt2", "step.aoti.pt2", "prefill.aoti.pt2"):
        if name in manifest["files"]:
            lines.append(f"  {name:<15} program = torch._inductor.aoti_load_package('{directory}/{name}')  "
                         "(native code: load only your own)")
    out.print("\n".join(lines), markup=False)


def artifact_speed(info: dict | None) -> str:
    """``, 12,345 tokens/s at B4 L256 (eager 6,789)`` from a manifest export entry."""
    if not info or info.get("tokens_per_second") is None:
        return ""
    at = info.get("speed_at") or {}
    where = f"B{at.get('batch')} L{at['length']}" if "length" in at else f"decoding, B{at.get('batch')}"
    text = f", {info['tokens_per_second']:,.0f} tokens/s at {where}"
    if info.get("eager_tokens_per_second"):
        text += f" (attnspec.load's eager model: {info['eager_tokens_per_second']:,.0f})"
    return text


def print_report(directory: Path) -> None:
    from attnspec.ablation.results import collect, summary_rows
    from attnspec.cli.sweeps import results_table

    found = collect(directory)
    out.print(results_table(*summary_rows(found), title=f"sweep {found.sweep.get('name')}: {found.metric} at the "
                                                        "best learning rate"))


def rich_table(table) -> Table:
    """A diagnostic's :class:`~attnspec.diagnostics.Table` for the terminal."""
    shown = Table(title=table.title, title_justify="left")
    for column in table.columns:
        shown.add_column(column, justify="left" if column in table.left else "right", no_wrap=column not in table.left)
    for index, row in enumerate(table.rows):
        shown.add_row(*(Text(cell, style="bold" if (index, column) in table.strong else "")
                        for column, cell in enumerate(row)))
    return shown


class TrainingDisplay:
    """Rich progress (step, loss, metric, tokens/s, ETA) on a terminal; plain lines otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.progress = None
        self.task_id = None
        self.prepare_id = None
        self.metric = ""
        self.last_plain = 0.0

    def __enter__(self) -> "TrainingDisplay":
        if self.enabled and out.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                     TextColumn("{task.description}"), TimeRemainingColumn(), console=out)
            self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def _prepare(self, done: int, total: int) -> None:
        if self.progress is not None:
            if self.prepare_id is None:
                self.prepare_id = self.progress.add_task("tokenising the corpus", total=total)
            self.progress.update(self.prepare_id, completed=done, description=f"tokenising: {done / 2 ** 20:,.1f} MiB")
        elif done == total or time.monotonic() - self.last_plain > 10:
            self.last_plain = time.monotonic()
            out.print(f"tokenising the corpus: {done:,} of {total:,} bytes", markup=False)

    def update(self, record: dict) -> None:
        if not self.enabled:
            return
        event = record["event"]
        if event == "prepare":  # the task's data being made (a corpus tokenised), in bytes
            self._prepare(record["done"], record["total"])
        elif event == "start":
            sharing = f" sharded ({record['parallel']})" if record.get("parallel") == "fsdp" else ""
            recomputing = f", recomputing {record['recomputed']} block(s)" if record.get("recomputed") else ""
            recomputing += f", low-rank adapters on {record['adapted']} map(s)" if record.get("adapted") else ""
            trained = record.get("trained", record["parameters"])
            frozen = f" ({trained:,} trained, {record['parameters'] - trained:,} frozen)" \
                if trained != record["parameters"] else ""
            frozen = " (each stage's trained below)" if record.get("staged") else frozen
            line = (f"training {record['parameters']:,} parameters{frozen} on {record['device']} "
                    f"({record['world_size']} process(es){sharing}{recomputing}, modes {', '.join(record['plan'])} "
                    f"({'measured' if record.get('planning') == 'measured' else 'cost model'}), "
                    f"{'compiled' if record['compiled'] else 'eager'}), from step {record['step']}")
            out.print(line, markup=False)
            if record.get("init_weights"):  # what --init-weights gave the model, as a build's summary says it
                out.print("--init-weights: " + weights_text(record["init_weights"]).replace("\n", "; "),
                          markup=False)
            if self.progress is not None:
                self.task_id = self.progress.add_task("", total=record["steps"], completed=record["step"])
        elif event == "stage":  # a staged run's stage begins
            frozen = record["parameters"] - record["trained"]
            extra = (f", low-rank adapters on {record['adapted']} map(s)" if record.get("adapted") else "") + \
                (f", transferring blocks {', '.join(map(str, record['transferred']))}" if record.get("transferred") else "")
            out.print(f"stage {record['index'] + 1} of {record['count']}: {record['objective']}, steps "
                      f"{record['start'] + 1}-{record['end']}, lr {record['lr']:.3g}, {record['trained']:,} trained "
                      f"({frozen:,} frozen){extra}", markup=False)
        elif event == "eval":
            self.metric = f"(test at step {record['step']}: acc {record['accuracy']:.3f} ppl {record['perplexity']:.3g})"
            out.print(f"step {record['step']}: test {metrics_text(record)}", markup=False)
        elif event == "step":
            text = f"loss {record['loss']:.4f}  {self.metric}  {record['tokens_per_s']:,.0f} tok/s"
            if self.progress is not None:
                self.progress.update(self.task_id, completed=record["step"], description=text)
            elif time.monotonic() - self.last_plain > 10 or record["step"] == record["steps"]:
                self.last_plain = time.monotonic()
                out.print(f"step {record['step']}/{record['steps']}: {text}", markup=False)


def verify_table(report) -> Table:
    """A :class:`~attnspec.compiler.verify.VerifyReport`: each block's modes against its reference mode."""
    table = Table(title="mode equivalence (float64, vs. the reference mode; each distinct block once)")
    for column in ("layer", "blocks", "mode", "max abs diff", "max rel diff", "tolerance", "ok"):
        table.add_column(column, overflow="fold")  # a long word wraps rather than losing its end
    for row in report.rows:
        table.add_row(escape(row.layer), str(row.blocks), row.mode, f"{row.abs_diff:.2e}", f"{row.rel_diff:.2e}",
                      f"{row.tolerance:.0e}", "yes" if row.ok else "NO")
    return table


def evaluation_table(title: str, result) -> Table:
    """An :class:`~attnspec.training.evaluate.EvalResult` (the measures a task file's requests gave) or a
    :class:`~attnspec.training.evaluate.TextResult` (a text file's perplexity)."""
    table = Table(title=escape(title))
    table.add_column("measure")
    table.add_column("value", justify="right")
    if hasattr(result, "bits_per_byte"):
        for name, value in (("tokens scored", f"{result.tokens:,}"), ("windows", f"{result.windows:,}"),
                            ("stride", f"{result.stride:,}"), ("perplexity (per token)", f"{result.perplexity:.4f}"),
                            ("bits per byte", f"{result.bits_per_byte:.4f}"),
                            ("word perplexity", f"{result.word_perplexity:.4f}")):
            table.add_row(name, value)
        return table
    rows = [("requests", f"{result.requests:,}"), ("mean log-likelihood", result.mean_loglikelihood),
            ("perplexity (continuation tokens)", result.perplexity), ("greedy matches", result.greedy_accuracy),
            ("questions", f"{result.questions:,}" if result.questions else None), ("accuracy", result.accuracy),
            ("accuracy_norm (per token)", result.accuracy_norm), ("chance", result.chance)]
    for name, value in rows:
        if value is not None:
            table.add_row(name, value if isinstance(value, str) else f"{value:.4f}")
    if result.truncated:
        table.add_row("cut to max_len (context from the left)", f"{result.truncated:,}")
    if result.continuation_tokens_cut:
        table.add_row("continuation tokens cut (not scored)", f"{result.continuation_tokens_cut:,}")
    return table


def weights_text(fit: dict) -> str:
    """A manifest's ``weights`` record: how many tensors loaded, and every one repeated, initialised, of
    another shape or dtype, or left over, grouped by what they are across the blocks (``mixer.k_proj.weight,
    mixer.v_proj.weight in blocks 0-29: file (192, 576), model (576, 576)``: one line for 60 tensors), and
    what to do where a swapped layer's projections did not fit."""
    lines = [f"{fit['loaded']} tensor(s) loaded"]
    repeated = fit.get("repeated") or []
    if repeated:
        lines.append(f"{len(repeated)} of them with each shared key/value head repeated for the heads it served: "
                     + _across_blocks([(e["name"], f"file {tuple(e['file'])}, model {tuple(e['model'])}")
                                       for e in repeated]))
    mismatched = {entry["name"]: entry for entry in fit["mismatched"]}
    missing = [name for name in fit["initialised"] if name not in mismatched]
    if missing:
        lines.append(f"{len(missing)} not in the file, initialised by the spec's init: "
                     + _across_blocks([(name, "") for name in missing]))
    if mismatched:
        def kind(entry: dict, side: str) -> str:  # the dtypes where they differ
            differ = entry.get("file_dtype") != entry.get("model_dtype")
            return f"{tuple(entry[side])}" + (f" {entry[side + '_dtype']}" if differ else "")

        lines.append(f"{len(mismatched)} of another shape or dtype, initialised: " + _across_blocks(
            [(name, f"file {kind(entry, 'file')}, model {kind(entry, 'model')}") for name, entry in mismatched.items()]))
        if any(entry["file"] != entry["model"] for entry in mismatched.values()):
            lines.append("to load them instead, give those blocks the file's widths (a swapped mixer: the source's "
                         "heads, d_qk and d_v; kv_heads as many as the source's or a multiple of them)")
    if fit["ignored"]:
        lines.append(f"{len(fit['ignored'])} in the file the model has no place for, ignored: "
                     + _across_blocks([(name, "") for name in fit["ignored"]]))
    return "\n".join(lines)


def _across_blocks(named: list[tuple[str, str]]) -> str:
    """Tensor names with a detail each, grouped: the names of one block-relative part with the same detail
    become one ``part in blocks 0-2, 5``, and parts over the same blocks with the same detail share it
    (``mixer.k_proj.weight, mixer.v_proj.weight in blocks 3: file (192, 576), model (576, 576)``); groups
    are separated by ``; `` in the order of their first tensor."""
    blocks_of: dict[tuple[str, str], list[int]] = {}
    for name, detail in named:
        found = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
        part, block = (found.group(2), int(found.group(1))) if found else (name, -1)
        blocks_of.setdefault((part, detail), []).append(block)
    parts_of: dict[tuple[tuple[int, ...], str], list[str]] = {}
    for (part, detail), blocks in blocks_of.items():
        parts_of.setdefault((tuple(blocks), detail), []).append(part)
    groups = []
    for (blocks, detail), parts in parts_of.items():
        where = "" if blocks == (-1,) else f" in blocks {_ranges(blocks)}"
        groups.append(", ".join(parts) + where + (f": {detail}" if detail else ""))
    return "; ".join(groups)


def _ranges(numbers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5, 7, 8)`` as ``0-2, 5, 7-8``."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
