"""Reading and writing transformers checkpoint directories: ``config.json`` and safetensors.

A checkpoint is the user's data, read as such: ``config.json`` is bounded JSON (transformers writes
infinities for Mamba2's time-step limit, as ``Infinity`` or ``{"__float__": "Infinity"}``, so they
are allowed; NaN is not); weights come
from ``model.safetensors`` or the shards named by ``model.safetensors.index.json``, plain file
names inside the directory. Pickled weights (``pytorch_model.bin``) are refused, never loaded.
Links are followed for reading (the Hugging Face cache links snapshot files to blobs); nothing is
ever written here.
"""

from __future__ import annotations

import json
import os
import math
from pathlib import Path

import torch

from attnspec.errors import InteropError, RunError, shorten
from attnspec.io import (all_finite, read_json, read_safetensors_header, read_safetensors_tensor, safetensors_layout,
                         save_tensors)
from attnspec.spec import limits

MAX_CONFIG_BYTES = 4 << 20
MAX_WEIGHT_BYTES = limits.MAX_PARAMETERS * 8
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _infinity(name: str) -> float:
    if name in ("Infinity", "-Infinity"):
        return math.inf if name == "Infinity" else -math.inf
    raise ValueError(f"{name} is not a number attnspec reads")


def _tagged_float(value: dict):
    """transformers 5 writes infinities as ``{"__float__": "Infinity"}``."""
    if list(value) == ["__float__"] and isinstance(value["__float__"], str):
        return _infinity(value["__float__"])
    return value


def regular_file(path: Path, limit: int, what: str) -> Path:
    if not path.exists():
        raise InteropError(f"{path}: missing; {what}")
    if not path.is_file():
        raise InteropError(f"{path}: not a regular file")
    if path.stat().st_size > limit:
        raise InteropError(f"{path}: larger than {limit:,} bytes")
    return path


def read_json_file(path: Path, what: str) -> dict:
    """A JSON object from ``path`` (at most 4 MiB, links followed; :func:`attnspec.io.read_json`), or
    an InteropError saying what is wrong (``what``: what to do about a missing file)."""
    regular_file(path, MAX_CONFIG_BYTES, what)
    try:
        value = read_json(path, MAX_CONFIG_BYTES, follow_links=True, parse_constant=_infinity,
                          object_hook=_tagged_float)
    except RunError as error:
        raise InteropError(str(error)) from None
    if not isinstance(value, dict):
        raise InteropError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_config(directory: Path) -> dict:
    """The checkpoint's ``config.json``."""
    if not directory.is_dir():
        raise InteropError(f"{directory}: not a directory; give a transformers checkpoint directory (config.json "
                           "and safetensors weights)")
    try:
        str(directory.resolve()).encode("utf-8")
    except UnicodeEncodeError:  # Python keeps undecodable bytes as surrogates, which safetensors refuses
        shown = str(directory).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise InteropError(f"{shown}: the path is not UTF-8 text, and safetensors opens only UTF-8 paths; rename "
                           "the folder") from None
    return read_json_file(directory / CONFIG, "a transformers checkpoint directory has one")


def weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (one file, or the shards of an index)."""
    index = directory / INDEX
    if index.exists():
        data = read_json_file(index, "")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InteropError(f"{index}: `weight_map` must map tensor names to file names")
        files = {}
        for name, file in weight_map.items():
            if Path(file).name != file or file in ("", ".", ".."):
                raise InteropError(f"{index}: shard {shorten(file)} is not a plain file name in the directory")
            files[name] = directory / file
        return files
    single = directory / WEIGHTS
    if not single.exists():
        pickled = [name for name in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (directory / name).exists()]
        hint = (f" It has {pickled[0]}, a pickle, which attnspec never loads: convert it to safetensors "
                "(transformers' save_pretrained(safe_serialization=True) does)") if pickled else ""
        raise InteropError(f"{directory}: no {WEIGHTS} or {INDEX}.{hint}")
    regular_file(single, MAX_WEIGHT_BYTES, "")
    try:
        return dict.fromkeys(read_safetensors_header(single, follow_links=True), single)
    except RunError as error:
        raise InteropError(str(error)) from None


class ShardReader:
    """The checkpoint's tensors read one at a time with plain reads (each shard's header parsed once;
    :func:`attnspec.io.read_safetensors_tensor`): what an import holds at a time is one tensor, never the
    checkpoint, and no memory map of it stays resident (``files``: :func:`weight_files`)."""

    def __init__(self, files: dict[str, Path]):
        self.files, self.layouts = files, {}

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``name`` (floating point, finite) as ``dtype`` (None: as stored)."""
        path = self.files[name]
        try:
            if path not in self.layouts:
                regular_file(path, MAX_WEIGHT_BYTES, "the index names it")
                self.layouts[path] = safetensors_layout(path)
            if name not in self.layouts[path][1]:
                raise InteropError(f"{path}: has no tensor {shorten(name)}, which the index puts there")
            tensor = read_safetensors_tensor(path, name, self.layouts[path])
        except RunError as error:
            raise InteropError(f"{path}: not a valid safetensors file ({shorten(str(error), 160)})") from None
        if not tensor.is_floating_point():
            raise InteropError(f"{path}: tensor {shorten(name)} is {tensor.dtype}, not floating point")
        tensor = tensor if dtype is None else tensor.to(dtype)
        if not all_finite(tensor):
            raise InteropError(f"{path}: tensor {shorten(name)} holds NaN or infinite values")
        return tensor


def write_checkpoint(directory: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """``config.json`` and ``model.safetensors`` into ``directory`` (a scratch directory)."""
    text = json.dumps(config, indent=2, sort_keys=True, allow_nan=True)  # transformers writes Infinity too
    (directory / CONFIG).write_text(text + "\n")
    save_tensors(directory / WEIGHTS, {name: t.detach().contiguous().cpu() for name, t in tensors.items()},
                 metadata={"format": "pt"})


class DirectoryCheckpoint:
    """A transformers checkpoint directory: its ``config`` (``config.json``), the tensor names it holds
    (:meth:`bind`) and :meth:`read`; what :class:`attnspec.interop.gguf.GGUFCheckpoint` is for a GGUF file."""

    gguf = None
    """The GGUF file (None: a directory of safetensors)."""

    def __init__(self, directory: Path):
        self.path = Path(directory)
        self.config = read_config(self.path)
        self._files: dict[str, Path] | None = None
        self._reader: ShardReader | None = None

    def stores_weights(self) -> bool:
        """Whether the directory has a weights file or index at all (its config alone describes a model)."""
        return any(os.path.lexists(self.path / name) for name in (WEIGHTS, INDEX))

    def bind(self, names: list[str]) -> set[str]:
        """Every tensor name the checkpoint holds (``names``, what the family reads, need no mapping here)."""
        if self._files is None:
            self._files = weight_files(self.path)
        return set(self._files)

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``name`` as ``dtype`` (None: as stored); :class:`ShardReader`'s checks."""
        if self._reader is None:
            self._reader = ShardReader(self._files if self._files is not None else weight_files(self.path))
        return self._reader.read(name, dtype)


def open_checkpoint(path: Path | str):
    """The checkpoint at ``path``: a GGUF file (or a directory holding one and no ``config.json``) as a
    :class:`attnspec.interop.gguf.GGUFCheckpoint`, else a transformers directory as a
    :class:`DirectoryCheckpoint`.

    Raises:
        InteropError: what is wrong with the file or directory (nothing is read but headers and config).
    """
    from attnspec.interop.gguf import GGUFCheckpoint, find_gguf

    path = Path(path)
    found = find_gguf(path)
    if found is not None:
        return GGUFCheckpoint(found)
    if path.is_file():
        raise InteropError(f"{path}: a file; give a transformers checkpoint directory (config.json and safetensors "
                           "weights) or a .gguf file")
    return DirectoryCheckpoint(path)
