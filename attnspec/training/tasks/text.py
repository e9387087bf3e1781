"""Language modelling on local files: the user's text as bytes, nanoGPT token arrays, or the Python
standard library's sources (a corpus every machine has)."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from attnspec.spec import limits
from attnspec.spec.ir import Count
from attnspec.training.tasks.base import MAX_DATA_BYTES, Task, TaskError, generator

class _TextTask(Task):
    """Next-token prediction on a token array: training windows at seeded random offsets of the
    training part, the test set evenly spaced windows of the validation part."""

    metric: ClassVar[str] = "perplexity"
    _splits: dict[str, np.ndarray] | None = PrivateAttr(default=None)

    def arrays(self) -> dict[str, np.ndarray]:
        """``{"train": tokens, "test": tokens}``, read (or mapped) on first use."""
        if self._splits is None:
            self._splits = self.read()
            for split, array in self._splits.items():
                if len(array) <= self.seq_len:
                    raise TaskError(f"{self.kind}: the {split} part has {len(array):,} tokens, not more than "
                                    f"seq_len = {self.seq_len}; give more text or a shorter seq_len")
        return self._splits

    def read(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        data = self.arrays()[split]
        last = len(data) - self.seq_len - 1  # the last offset whose window and next token fit
        if split == "train":
            offsets = torch.randint(0, last + 1, (size,), generator=generator(seed, split, step)).tolist()
        else:
            offsets = np.linspace(0, last, size).round().astype(np.int64).tolist()
        windows = np.stack([np.asarray(data[o:o + self.seq_len + 1], dtype=np.int64) for o in offsets])
        if int(windows.max(initial=0)) >= self.vocab_size:
            raise TaskError(f"{self.kind}: token id {int(windows.max())} is not below vocab_size = {self.vocab_size}")
        tokens = torch.from_numpy(windows)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _read_bytes(file: Path) -> bytes:
    """A data file's bytes, or a TaskError saying why it cannot be read."""
    try:
        return file.read_bytes()
    except OSError as error:
        raise TaskError(f"{file}: cannot be read ({error.strerror}); fix its permissions or move it out of the "
                        "data directory") from None


def _size(file: Path) -> int:
    try:
        return file.stat().st_size
    except OSError as error:
        raise TaskError(f"{file}: cannot be read ({error.strerror})") from None


def _lstat(path: Path) -> os.stat_result | None:
    """``path``'s own status (a link is not followed); None where it does not exist; a TaskError where
    it cannot be read (``/proc/1/cwd`` raised PermissionError from ``is_file``)."""
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise TaskError(f"{path}: cannot be read ({error.strerror}); fix its permissions or move it out of the "
                        "data directory") from None


def _regular_files(root: Path) -> list[Path]:
    """The regular files at ``root`` (a file, or a directory walked in sorted order, no symlinks)."""
    status = _lstat(root)
    if status is None:
        raise TaskError(f"{root}: no such file or directory")
    if stat.S_ISLNK(status.st_mode):
        raise TaskError(f"{root}: is a symbolic link; give the file or directory itself")
    if stat.S_ISREG(status.st_mode):
        return [root]
    if not stat.S_ISDIR(status.st_mode):
        raise TaskError(f"{root}: not a regular file or a directory")
    files = []

    def refuse(error: OSError) -> None:  # an unreadable folder is an error, not a silently smaller corpus
        raise TaskError(f"{error.filename}: cannot be read ({error.strerror}); fix its permissions or move it out "
                        "of the data directory")

    for directory, subdirs, names in os.walk(root, onerror=refuse):
        subdirs.sort()
        for name in sorted(names):
            path = Path(directory) / name
            status = _lstat(path)
            if status is not None and stat.S_ISREG(status.st_mode) and not name.startswith("."):
                files.append(path)
    if not files:
        raise TaskError(f"{root}: holds no files")
    return files


class BytesTask(_TextTask):
    """A byte-level language model on the user's local text: ``path`` is a file or a directory (its
    files in sorted order, hidden files and symlinks skipped); the last ``val_fraction`` of the bytes
    is the validation part. Vocabulary: the 256 byte values."""

    kind: Literal["bytes"]
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    seq_len: Count(limits.MAX_LEN) = 256
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1

    @property
    def vocab_size(self) -> int:
        return 256

    def read(self) -> dict[str, np.ndarray]:
        files = _regular_files(Path(self.path))
        total = sum(_size(f) for f in files)
        if total > MAX_DATA_BYTES:
            raise TaskError(f"{self.path}: {total:,} bytes, over the limit of {MAX_DATA_BYTES:,} read into memory; "
                            "tokenise it into a nanoGPT .bin file (task `tokens`), which is memory-mapped")
        data = np.frombuffer(b"".join(_read_bytes(f) for f in files), dtype=np.uint8)
        cut = len(data) - max(1, math.ceil(len(data) * self.val_fraction))
        return {"train": data[:cut], "test": data[cut:]}


class PythonSourceTask(_TextTask):
    """A byte-level language model on the Python standard library's own ``.py`` files: a corpus every
    machine with Python has, with nothing to download. Files are those under ``sysconfig``'s
    ``stdlib`` directory (``site-packages`` and ``test`` directories excluded), in sorted order, up
    to ``max_bytes``; a file is in the validation part when the first byte of the SHA-256 of its
    relative path is below ``val_fraction * 256``, so the split is fixed by file names and the same
    on every machine with the same Python version (the run records the version in ``run.json``).
    Vocabulary: the 256 byte values."""

    kind: Literal["python_source"]
    seq_len: Count(limits.MAX_LEN) = 256
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    max_bytes: Annotated[int, Field(ge=1 << 16, le=MAX_DATA_BYTES)] = 16 << 20
    """Read at most this many bytes (about 30 MB are there in CPython 3.11; 16 MiB by default)."""

    @property
    def vocab_size(self) -> int:
        return 256

    def read(self) -> dict[str, np.ndarray]:
        import hashlib
        import sysconfig

        root = Path(sysconfig.get_paths()["stdlib"])
        parts: dict[str, list[bytes]] = {"train": [], "test": []}
        total = 0
        for file in _regular_files(root):
            relative = file.relative_to(root)
            if file.suffix != ".py" or {"site-packages", "dist-packages", "test", "tests"} & set(relative.parts):
                continue
            data = _read_bytes(file)
            if total + len(data) > self.max_bytes:
                break
            total += len(data)
            held_out = hashlib.sha256(relative.as_posix().encode()).digest()[0] < self.val_fraction * 256
            parts["test" if held_out else "train"].append(data)
        return {split: np.frombuffer(b"".join(chunks), dtype=np.uint8) for split, chunks in parts.items()}


class TokensTask(_TextTask):
    """nanoGPT token files: ``path`` is a directory with ``train.bin`` and ``val.bin``, flat arrays of
    ``dtype`` token ids (memory-mapped, read-only). ``vocab_size`` must be given: nanoGPT's
    ``meta.pkl`` is a pickle, and attnspec never unpickles."""

    kind: Literal["tokens"]
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=2, le=limits.MAX_VOCAB)]
    dtype: Literal["uint16", "uint32"] = "uint16"
    seq_len: Count(limits.MAX_LEN) = 256

    def read(self) -> dict[str, np.ndarray]:
        root = Path(self.path)
        arrays = {}
        for split, name in (("train", "train.bin"), ("test", "val.bin")):
            file = root / name
            if not file.is_file() or file.is_symlink():
                raise TaskError(f"{file}: missing (a nanoGPT token directory holds train.bin and val.bin)")
            itemsize = np.dtype(self.dtype).itemsize
            size = _size(file)
            if size == 0:
                raise TaskError(f"{file}: empty; a nanoGPT token file holds the {split} tokens as {self.dtype}")
            if size % itemsize:
                raise TaskError(f"{file}: {size} bytes is not a whole number of {self.dtype} tokens; "
                                "is `dtype` right?")
            try:
                arrays[split] = np.memmap(file, dtype=self.dtype, mode="r")
            except (OSError, ValueError) as error:
                raise TaskError(f"{file}: cannot be mapped ({error}); is it a readable token file?") from None
        return arrays


