"""The run directory: what a training run writes, atomically, and reads back to resume.

Layout (every file written to a temporary name and renamed into place)::

    RUN_DIR/
      run.json          format, versions, the resolved spec and configuration as data, the plan,
                        the parameter groups, status (running / stopped / done) and the last step
      spec.yaml         the resolved spec (``attnspec build RUN_DIR`` and humans read it)
      config.yaml       the resolved training configuration (repeat the run with --config)
      metrics.jsonl     one JSON object per line: training steps and evaluations
      checkpoint.json   which checkpoint is the latest ({"step": N, "directory": "checkpoints/step-N"})
      checkpoints/step-N/  model.safetensors, optimizer.safetensors (AdamW moments), state.json
      result.json       the final evaluation, when the run ends

Nothing is pickled. A new run refuses a non-empty directory; ``--resume`` accepts only a run
directory attnspec wrote. Only old checkpoint directories this module wrote are ever removed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from attnspec.errors import AttnSpecError

FORMAT = 1
RUN_FILE = "run.json"
CHECKPOINT_POINTER = "checkpoint.json"
CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "state.json")
KEEP_CHECKPOINTS = 2
MAX_JSON_BYTES = 64 << 20


class RunError(AttnSpecError):
    """A run directory cannot be created, read or resumed."""


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a temporary sibling renamed over it (readers see old or new, never half)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise RunError(f"{path}: cannot write: {error.strerror}") from None


def read_json(path: Path) -> Any:
    """A JSON file of the run directory (regular file, bounded size), or a RunError saying what is wrong."""
    if path.is_symlink() or not path.is_file():
        raise RunError(f"{path}: missing or not a regular file; is {path.parent} a run directory?")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise RunError(f"{path}: larger than {MAX_JSON_BYTES:,} bytes")
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise RunError(f"{path}: not valid JSON ({error})") from None


def create(directory: Path) -> None:
    """Make a new run directory; an existing one must be empty (nothing of the user's is touched)."""
    if directory.exists() or directory.is_symlink():
        if not directory.is_dir() or directory.is_symlink():
            raise RunError(f"{directory}: exists and is not a directory")
        if any(directory.iterdir()):
            hint = " (resume it with --resume)" if (directory / RUN_FILE).is_file() else ""
            raise RunError(f"{directory}: exists and is not empty{hint}; choose a new run directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "checkpoints").mkdir()
    except OSError as error:
        raise RunError(f"{directory}: cannot create: {error.strerror}") from None


def read_run(directory: Path) -> dict:
    """The run.json of an existing run directory (to resume or export it)."""
    if not directory.is_dir():
        raise RunError(f"{directory}: no such run directory")
    run = read_json(directory / RUN_FILE)
    if not isinstance(run, dict) or run.get("format") != FORMAT or not isinstance(run.get("spec"), dict) \
            or not isinstance(run.get("config"), dict):
        raise RunError(f"{directory}/{RUN_FILE}: not a run file of format {FORMAT} written by attnspec")
    return run


RUN_FILES = (RUN_FILE, "spec.yaml", "config.yaml", "metrics.jsonl", CHECKPOINT_POINTER, "result.json")


def discard_unstarted(directory: Path) -> bool:
    """Remove a run directory that was killed before its first checkpoint, so it can start again.

    Only a directory holding nothing but files the trainer writes (and empty or scratch checkpoint
    directories, TensorBoard event files) is removed; returns False, touching nothing, for anything else.
    """
    if not directory.is_dir() or directory.is_symlink() or (directory / CHECKPOINT_POINTER).exists():
        return False
    entries = list(directory.iterdir())
    for entry in entries:
        if entry.name == "checkpoints" and entry.is_dir() and not entry.is_symlink():
            if any(not (part.name.startswith(".step-") and part.is_dir() and not part.is_symlink()
                        and {f.name for f in part.iterdir()} <= set(CHECKPOINT_FILES)) for part in entry.iterdir()):
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
    """Add one line to metrics.jsonl (flushed, so a killed run keeps every line it wrote)."""
    with open(directory / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def truncate_metrics(directory: Path, step: int) -> None:
    """On resume from step ``step``: drop the lines a stopped run wrote after its last checkpoint
    (and a last line cut short by a kill), and the scratch of a checkpoint it was writing."""
    for partial in (directory / "checkpoints").glob(".step-*.tmp-*"):
        if partial.is_dir() and {f.name for f in partial.iterdir()} <= set(CHECKPOINT_FILES):
            shutil.rmtree(partial)
    path = directory / "metrics.jsonl"
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the line a kill cut short
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    write_atomic(path, "".join(line + "\n" for line in kept))


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(directory: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    names: list[str], state: dict) -> None:
    """Write checkpoint ``step`` (weights, AdamW moments by parameter name, JSON state), then point
    checkpoint.json at it, then remove checkpoints older than the last ``KEEP_CHECKPOINTS``."""
    root = directory / "checkpoints"
    final = root / f"step-{step:09d}"
    tmp = root / f".step-{step:09d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    save_file(weights, str(tmp / "model.safetensors"))
    save_file(_optimizer_tensors(optimizer, names), str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}))
    if final.exists():  # a re-run of the same step after a resume: replace our own checkpoint
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(directory / CHECKPOINT_POINTER, json.dumps({"step": step, "directory": f"checkpoints/{final.name}"}))
    ours = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and p != final)
    for old in ours[:max(0, len(ours) - (KEEP_CHECKPOINTS - 1))]:
        if {f.name for f in old.iterdir()} <= set(CHECKPOINT_FILES):  # only what we wrote
            shutil.rmtree(old)


def load_checkpoint(directory: Path) -> tuple[int, Path, dict[str, torch.Tensor], dict]:
    """The latest checkpoint: (step, its weights file, optimizer tensors, state)."""
    pointer = read_json(directory / CHECKPOINT_POINTER)
    name = pointer.get("directory") if isinstance(pointer, dict) else None
    if not isinstance(name, str) or not name.startswith("checkpoints/step-") or "/" in name[len("checkpoints/"):]:
        raise RunError(f"{directory}/{CHECKPOINT_POINTER}: does not name a checkpoint directory")
    where = directory / name
    for file in CHECKPOINT_FILES:
        if (where / file).is_symlink() or not (where / file).is_file():
            raise RunError(f"{where}: missing {file}; the checkpoint is incomplete")
    state = read_json(where / "state.json")
    try:
        moments = load_file(str(where / "optimizer.safetensors"))
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a bad file
        raise RunError(f"{where}/optimizer.safetensors: not a valid safetensors file ({error})") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise RunError(f"{where}/state.json: no step")
    return state["step"], where / "model.safetensors", moments, state


def _optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    """AdamW's per-parameter state as flat tensors named ``{parameter}.{exp_avg|exp_avg_sq|step}``."""
    state = optimizer.state_dict()["state"]
    tensors = {}
    for index, name in enumerate(names):
        for key, value in state.get(index, {}).items():
            tensors[f"{name}.{key}"] = (value if isinstance(value, torch.Tensor) else torch.tensor(value)) \
                .detach().cpu().contiguous()
    return tensors


def restore_optimizer(optimizer: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor]) -> None:
    """Load AdamW moments saved by :func:`save_checkpoint` into ``optimizer`` (same parameter order)."""
    current = optimizer.state_dict()
    state = {}
    for index, name in enumerate(names):
        entry = {key.rsplit(".", 1)[1]: tensor for key, tensor in tensors.items() if key.rsplit(".", 1)[0] == name}
        if entry:
            state[index] = entry
    expected = {f"{name}.{key}" for index, name in enumerate(names) for key in state.get(index, {})}
    if set(tensors) != expected:
        raise RunError("the checkpoint's optimizer state does not match the model's parameters")
    optimizer.load_state_dict({"state": state, "param_groups": current["param_groups"]})
