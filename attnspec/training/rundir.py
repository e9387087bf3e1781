"""The run directory: what a training run writes, atomically, and reads back to resume.

Layout (every file written to a temporary name and renamed into place)::

    RUN_DIR/
      run.json          format, versions, the resolved spec and configuration as data, the plan,
                        the parameter groups, status (running / stopped / done / diverged /
                        interrupted: by Ctrl-C or SIGTERM, at its latest checkpoint) and the last step
      spec.yaml         the resolved spec (``attnspec build RUN_DIR`` and humans read it)
      config.yaml       the resolved training configuration (repeat the run with --config)
      metrics.jsonl     one JSON object per line: training steps and evaluations
      checkpoint.json   which checkpoint is the latest ({"step": N, "directory": "checkpoints/step-N"})
      checkpoints/step-N/  model.safetensors, optimizer.safetensors (AdamW moments), state.json; or, from an
                        FSDP run, one shard-0000R-model-00001-of-00001.safetensors per process (its rows of
                        every weight and moment, ``model.`` and ``optimizer.``, with their offsets:
                        torch.distributed.checkpoint's safetensors format) and state.json (``shards``: N)
      result.json       the final evaluation, when the run ends

Nothing is pickled. A new run refuses a non-empty directory; ``--resume`` accepts only a run
directory attnspec wrote, and checks what it reads (steps in range, optimizer moments finite and of
the parameters' shapes). Only checkpoint directories this module wrote are ever removed, and no
write or delete goes through a link (:mod:`attnspec.io`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch

from attnspec.errors import RunError
# The read side of the format (what `attnspec build RUN_DIR` needs too) is in attnspec.io, the lowest layer.
from attnspec.io import (ADAPTERS_FILE, CHECKPOINT_FILES, CHECKPOINT_NAMES, CHECKPOINT_POINTER, MAX_JSON_BYTES,
                         MAX_STEP, RUN_FILE,
                         RUN_FORMAT as FORMAT, STATUSES, check_directory, checkpoint_tensors, ensure_directory,
                         is_step, json_lines, shard_count,
                         latest_checkpoint, open_append, owns_tree, read_json, read_run, remove_tree, save_tensors,
                         write_atomic)

KEEP_CHECKPOINTS = 2


def create(directory: Path) -> None:
    """Make a new run directory; an existing one must be empty (nothing of the user's is touched)."""
    check_new(directory)
    ensure_directory(directory)
    ensure_directory(directory / "checkpoints")


def check_new(directory: Path) -> None:
    """Refuse a new run's directory that exists and is not an empty directory (RunError saying what to do)."""
    if directory.exists() or directory.is_symlink():
        if not directory.is_dir() or directory.is_symlink():
            raise RunError(f"{directory}: exists and is not a directory")
        if any(directory.iterdir()):
            hint = ""
            if (directory / RUN_FILE).is_file():
                hint = (" (resume it with --resume)" if has_checkpoint(directory) else
                        " (a run stopped before its first checkpoint: nothing to resume; remove it to start again)")
            raise RunError(f"{directory}: exists and is not empty{hint}; choose a new run directory")


def has_checkpoint(directory: Path) -> bool:
    """Whether the run directory names a latest checkpoint (``checkpoint.json``; read and checked on resume)."""
    pointer = directory / CHECKPOINT_POINTER
    return pointer.exists() or pointer.is_symlink()


def recorded(directory: Path, record: dict):
    """The run's recorded spec and training configuration (from :func:`read_run`), validated: a
    problem is a RunError naming ``run.json``, as the file was tampered with or written by another
    attnspec. Returns ``(Spec, TrainConfig)``."""
    from attnspec.errors import SpecError
    from attnspec.spec.validate import validate_data
    from attnspec.training.config import load_config

    try:
        return validate_data(record["spec"]), load_config(record["config"])
    except SpecError as error:
        raise RunError(f"{directory / RUN_FILE}: the recorded spec or configuration is not valid "
                       f"({error.problems[0]}); this run directory was changed or written by another attnspec") from None


def recorded_modes(record: dict) -> list[str] | None:
    """The full mode of every block that the run's recorded plan (from :func:`read_run`) trained with, so
    a resumed run keeps its computation; None where run.json records no plan. A plan that is not a list
    of layers each naming a mode is a RunError (run.json was changed)."""
    plan = record.get("plan")
    if plan is None:
        return None
    layers = plan.get("layers") if isinstance(plan, dict) else None
    modes = [layer.get("full_mode") if isinstance(layer, dict) else None for layer in layers] \
        if isinstance(layers, list) else None
    if modes is None or not all(isinstance(mode, str) and len(mode) <= 40 for mode in modes):
        raise RunError(f"{RUN_FILE}: the recorded plan has no mode per block; this run directory was changed "
                       "or written by another attnspec")
    return modes


RUN_FILES = (RUN_FILE, "spec.yaml", "config.yaml", "metrics.jsonl", CHECKPOINT_POINTER, "result.json",
             "tokenizer.json", "tokenizer.tiktoken")  # the text task's tokenizer, copied in


def discard_unstarted(directory: Path) -> bool:
    """Remove a run directory that was killed before its first checkpoint, so it can start again.

    Only a directory holding nothing but files the trainer writes (and empty or scratch checkpoint
    directories, TensorBoard event files) is removed; returns False, touching nothing, for anything else.
    """
    if not directory.is_dir() or directory.is_symlink() or (directory / CHECKPOINT_POINTER).exists() \
            or (directory / CHECKPOINT_POINTER).is_symlink():
        return False
    entries = list(directory.iterdir())
    for entry in entries:
        if entry.name == "checkpoints" and entry.is_dir() and not entry.is_symlink():
            if any(not (part.name.startswith(".step-") and part.is_dir() and not part.is_symlink()
                        and all(f.name in CHECKPOINT_NAMES for f in part.iterdir())) for part in entry.iterdir()):
                return False
        elif entry.name == "tensorboard" and entry.is_dir() and not entry.is_symlink():
            if any(not (f.is_file() and f.name.startswith("events.out.tfevents.")) for f in entry.iterdir()):
                return False
        elif entry.is_symlink() or not entry.is_file() or not (entry.name in RUN_FILES or entry.name.startswith(".")
                                                               and ".tmp-" in entry.name):
            return False
    shutil.rmtree(directory)
    return True


def append_metrics(directory: Path, record: dict) -> None:
    """Add one line to metrics.jsonl (flushed, so a killed run keeps every line it wrote; never through a link)."""
    with open_append(directory / "metrics.jsonl") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def truncate_metrics(directory: Path, step: int) -> None:
    """On resume from step ``step``: drop the lines a stopped run wrote after its last checkpoint
    (and a last line cut short by a kill), and the scratch of a checkpoint it was writing."""
    check_directory(directory / "checkpoints")
    for partial in (directory / "checkpoints").glob(".step-*.tmp-*"):
        if owns_tree(partial, CHECKPOINT_NAMES):
            remove_tree(partial, CHECKPOINT_NAMES)
    path = directory / "metrics.jsonl"
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
        raise RunError(f"{path}: not a regular file of at most {MAX_JSON_BYTES:,} bytes; is this a run directory?")
    # the line a kill cut short, and lines that are not attnspec's (a step that is not a number) are dropped
    kept = [record for record in json_lines(path.read_text(errors="replace"))
            if is_step(record.get("step")) and record["step"] <= step]
    write_atomic(path, "".join(json.dumps(record) + "\n" for record in kept))


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(directory: Path, step: int, weights: dict[str, torch.Tensor], moments: dict[str, torch.Tensor],
                    state: dict, adapters: dict[str, torch.Tensor] | None = None) -> None:
    """Write checkpoint ``step`` whole (``weights``: name -> CPU tensor; ``moments``: AdamW's state as
    :func:`optimizer_tensors` names it; JSON ``state``; ``adapters``: a low-rank adapted run's own weights of
    its adapted maps and their adapters, :data:`ADAPTERS_FILE`): see :func:`publish_checkpoint`."""
    tmp = checkpoint_scratch(directory, step)
    try:
        save_tensors(tmp / "model.safetensors", weights)
        save_tensors(tmp / "optimizer.safetensors", moments)
        if adapters is not None:
            save_tensors(tmp / ADAPTERS_FILE, adapters)
    except OSError as error:
        raise RunError(f"{tmp}: cannot write the checkpoint ({error.strerror})") from None
    publish_checkpoint(directory, step, tmp, state)


def checkpoint_scratch(directory: Path, step: int) -> Path:
    """The empty folder checkpoint ``step`` is written in before :func:`publish_checkpoint` renames it (a
    stale one of an earlier attempt removed; every process of a sharded run writes its file there)."""
    root = directory / "checkpoints"
    check_directory(root)  # a linked checkpoints directory is refused: nothing of the user's is written or removed
    final = root / f"step-{step:09d}"
    tmp = scratch_folder(directory, step)
    if tmp.exists() or tmp.is_symlink():
        remove_tree(tmp, CHECKPOINT_NAMES)
    if final.exists() or final.is_symlink():  # a re-run of the same step after a resume: only our own checkpoint
        if not owns_tree(final, CHECKPOINT_NAMES):
            raise RunError(f"{final}: holds files attnspec did not write (or is a link), where this run writes its "
                           f"checkpoint of step {step}; move it away and resume")
    try:
        tmp.mkdir()
    except OSError as error:
        raise RunError(f"{tmp}: cannot write the checkpoint ({error.strerror})") from None
    return tmp


def scratch_folder(directory: Path, step: int) -> Path:
    """Where checkpoint ``step`` is written before it is published (the same path on every process)."""
    return directory / "checkpoints" / f".step-{step:09d}.tmp"


def publish_checkpoint(directory: Path, step: int, tmp: Path, state: dict) -> None:
    """Finish checkpoint ``step`` written in ``tmp`` (:func:`checkpoint_scratch`): its state.json, the rename to
    ``checkpoints/step-N``, checkpoint.json pointing at it, then checkpoints older than the last
    ``KEEP_CHECKPOINTS`` removed. ``state["shards"]``: the processes whose files a sharded checkpoint holds."""
    root = directory / "checkpoints"
    final = root / f"step-{step:09d}"
    try:
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}))
    except OSError as error:
        raise RunError(f"{tmp}: cannot write the checkpoint ({error.strerror})") from None
    if final.exists():
        remove_tree(final, CHECKPOINT_NAMES)
    os.replace(tmp, final)
    write_atomic(directory / CHECKPOINT_POINTER, json.dumps({"step": step, "directory": f"checkpoints/{final.name}"}))
    ours = sorted(p for p in root.iterdir() if p.name.startswith("step-") and p != final and owns_tree(p, CHECKPOINT_NAMES))
    for old in ours[:max(0, len(ours) - (KEEP_CHECKPOINTS - 1))]:
        remove_tree(old, CHECKPOINT_NAMES)  # only what we wrote; links and foreign folders were left out above


def load_checkpoint(directory: Path, max_step: int = MAX_STEP) -> tuple[int, dict[str, torch.Tensor],
                                                                        dict[str, torch.Tensor], dict]:
    """The latest checkpoint: (step, its weights, its optimizer tensors, state), whole tensors by name
    whether one process wrote it or each its shard (:func:`attnspec.io.checkpoint_tensors`); ``max_step``:
    the run's configured steps (a checkpoint beyond them is not this run's)."""
    step, where, state = latest_checkpoint(directory, max_step)
    return step, checkpoint_tensors(where, "model"), checkpoint_tensors(where, "optimizer"), state


def is_sharded(where: Path) -> bool:
    """Whether the checkpoint folder ``where`` holds each process's shard rather than whole tensors."""
    return shard_count(where, read_json(where / "state.json")) is not None


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    """AdamW's per-parameter state as flat tensors named ``{parameter}.{exp_avg|exp_avg_sq|step}``
    (``names``: the optimiser's parameters' names, in its order)."""
    state = optimizer.state_dict()["state"]
    return moment_tensors({name: state[index] for index, name in enumerate(names) if index in state})


def moment_tensors(moments: dict[str, dict]) -> dict[str, torch.Tensor]:
    """name -> {moment -> value} as flat CPU tensors named ``{name}.{moment}`` (what a checkpoint holds)."""
    return {f"{name}.{key}": (value if isinstance(value, torch.Tensor) else torch.tensor(value)).detach().cpu()
            .contiguous() for name, entry in moments.items() for key, value in entry.items()}


def checked_moments(tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> dict[str, dict]:
    """A checkpoint's AdamW tensors (:func:`moment_tensors`) grouped by parameter, each checked against
    the parameter's (whole) shape in ``shapes`` (name -> shape): name -> {moment -> tensor}."""
    moments = {}
    for name, shape in shapes.items():
        entry = {key.rsplit(".", 1)[1]: tensor for key, tensor in tensors.items() if key.rsplit(".", 1)[0] == name}
        if entry:
            _check_moments(name, entry, shape)
            moments[name] = entry
    if set(tensors) != {f"{name}.{key}" for name, entry in moments.items() for key in entry}:
        raise RunError("the checkpoint's optimizer state does not match the model's parameters")
    return moments


def restore_optimizer(optimizer: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor]) -> None:
    """Load AdamW moments saved by :func:`save_checkpoint` into ``optimizer`` (``names``: its parameters'
    names, in its order)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    moments = checked_moments(tensors, {name: tuple(p.shape) for name, p in zip(names, parameters)})
    state = {index: moments[name] for index, name in enumerate(names) if name in moments}
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _check_moments(name: str, entry: dict[str, torch.Tensor], shape: tuple[int, ...]) -> None:
    """AdamW's state of one parameter as AdamW leaves it: both moments of the parameter's shape and
    finite, the second non-negative, the step count a finite non-negative scalar. Anything else would
    resume into NaN weights (or crash), so it is refused."""
    where = f"the checkpoint's optimizer state of {name}"
    if set(entry) != {"exp_avg", "exp_avg_sq", "step"}:
        raise RunError(f"{where} has {sorted(entry)}, not AdamW's exp_avg, exp_avg_sq and step")
    for key in ("exp_avg", "exp_avg_sq"):
        moment = entry[key]
        if tuple(moment.shape) != tuple(shape) or not moment.is_floating_point():
            raise RunError(f"{where}: {key} has shape {tuple(moment.shape)} ({moment.dtype}), the parameter "
                           f"{tuple(shape)}")
        if not bool(torch.isfinite(moment).all()):
            raise RunError(f"{where}: {key} holds NaN or infinite values; the checkpoint is damaged")
    if bool((entry["exp_avg_sq"] < 0).any()):
        raise RunError(f"{where}: exp_avg_sq holds negative values; the checkpoint is damaged")
    count = entry["step"]
    if count.numel() != 1 or not math.isfinite(float(count)) or not 0 <= float(count) <= MAX_STEP:
        raise RunError(f"{where}: its step count is not a finite step number")


__all__ = ["ADAPTERS_FILE", "FORMAT", "RUN_FILE", "CHECKPOINT_POINTER", "CHECKPOINT_FILES", "STATUSES", "MAX_STEP", "is_step", "read_run",
           "read_json", "recorded", "create", "discard_unstarted", "append_metrics", "truncate_metrics",
           "save_checkpoint", "checkpoint_scratch", "scratch_folder", "publish_checkpoint", "is_sharded", "load_checkpoint", "optimizer_tensors", "moment_tensors", "checked_moments",
           "restore_optimizer", "RunError"]


def load_trained(directory: Path | str):
    """The model of a training run directory (its latest checkpoint's weights) or of a build directory,
    on the CPU, in eval mode: what ``attnspec eval`` and ``attnspec export-hf`` read.

    Raises:
        RunError / BuildError: the directory is neither, or its files do not match its spec.
    """
    from attnspec.compiler.load import load_model, load_weights
    from attnspec.nn.model import build_model_from_spec

    directory = Path(directory)
    if not (directory / RUN_FILE).is_file():
        return load_model(directory)
    spec, config = recorded(directory, read_run(directory))
    _, checkpoint, _ = latest_checkpoint(directory, max_step=config.steps)
    model = build_model_from_spec(spec)  # the run's master weights (float32 for a bfloat16 spec) cast to it
    load_weights(model, checkpoint_tensors(checkpoint, "model"), fix="the run's checkpoint does not match its spec",
                 cast=True)
    return model.eval()
