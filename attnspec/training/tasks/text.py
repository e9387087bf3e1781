"""Language modelling on local files: the user's text as bytes, nanoGPT token arrays, or the Python
standard library's sources (a corpus every machine has)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from attnspec.spec import limits
from attnspec.spec.ir import Count
from attnspec.ops.documents import Documents, from_starts
from attnspec.training.tasks.base import IGNORE, MAX_DATA_BYTES, Task, TaskError, generator
from attnspec.training.tasks.corpus import Corpus, file_size, read_bytes, regular_files, tokenized

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
        files = regular_files(Path(self.path))
        total = sum(file_size(f) for f in files)
        if total > MAX_DATA_BYTES:
            raise TaskError(f"{self.path}: {total:,} bytes, over the limit of {MAX_DATA_BYTES:,} read into memory; "
                            "tokenise it into a nanoGPT .bin file (task `tokens`), which is memory-mapped")
        data = np.frombuffer(b"".join(read_bytes(f) for f in files), dtype=np.uint8)
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
        for file in regular_files(root):
            relative = file.relative_to(root)
            if file.suffix != ".py" or {"site-packages", "dist-packages", "test", "tests"} & set(relative.parts):
                continue
            data = read_bytes(file)
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
            size = file_size(file)
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




class TextTask(_TextTask):
    """Language modelling on a local text corpus through a local tokenizer (:mod:`attnspec.tokenizer`):
    ``path`` is a file or directory of documents (:mod:`.corpus`: each ``.jsonl`` line's ``text_field``,
    else each file, split at ``separator``), tokenised once into a cached token file. Each document ends
    with the tokenizer's end-of-document id.

    ``packing`` says how documents fill a row of ``seq_len`` tokens:

    * ``pack``: windows at random offsets of the documents laid end to end, each document computed as if
      alone (positions restart, recurrent states reset: :mod:`attnspec.ops.documents`); the position of
      an end-of-document id has no target (the next document's first token cannot be predicted from it);
    * ``pad``: one document per row from its start, cut at ``seq_len + 1`` tokens, padded with the
      end-of-document id; padding has no target and is a document of its own, so it changes nothing;
    * ``stream``: windows of the token stream as they are (nanoGPT's way: the model reads across
      documents).
    """

    kind: Literal["text"]
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    tokenizer: Annotated[str, Field(min_length=1, max_length=4096)]
    """A Hugging Face ``tokenizer.json`` (or a directory holding one), or a tiktoken ``.tiktoken`` file."""
    eos: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The end-of-document token; None: the first of the usual names the vocabulary holds."""
    encoding: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    """For a tiktoken file: the encoding whose pattern it uses (default: its file name)."""
    text_field: Annotated[str, Field(min_length=1, max_length=256)] = "text"
    separator: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    packing: Literal["pack", "pad", "stream"] = "pack"
    seq_len: Count(limits.MAX_LEN) = 256
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    _loaded: object = PrivateAttr(default=None)
    _corpus: Corpus | None = PrivateAttr(default=None)
    _progress: object = PrivateAttr(default=None)

    def text_tokenizer(self):
        """The task's :class:`~attnspec.tokenizer.Tokenizer` (read once; a TaskError where it cannot be)."""
        from attnspec.tokenizer import TokenizerError, load_tokenizer

        if self._loaded is None:
            try:
                self._loaded = load_tokenizer(self.tokenizer, self.eos, self.encoding)
            except TokenizerError as error:
                raise TaskError(str(error)) from None
        return self._loaded

    @property
    def vocab_size(self) -> int:
        return self.text_tokenizer().vocab_size

    def prepare(self, progress=None) -> None:
        self._progress = progress
        self.arrays()

    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = tokenized(self.path, self.text_tokenizer(), separator=self.separator,
                                     text_field=self.text_field, val_fraction=self.val_fraction,
                                     progress=self._progress)
        return self._corpus

    def read(self) -> dict[str, np.ndarray]:
        return self.corpus().tokens

    def data_identity(self) -> dict:
        return {"tokenizer": self.text_tokenizer().identity(), "corpus": self.corpus().key}

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        eos = self.text_tokenizer().eos_id
        if self.packing != "pad":
            inputs, targets = super().sample(split, step, size, seed)
            if self.packing == "pack":
                targets = targets.masked_fill(inputs == eos, IGNORE)
            return inputs, targets
        data, starts = self.arrays()[split], self.corpus().starts[split]
        if split == "train":
            chosen = torch.randint(0, len(starts), (size,), generator=generator(seed, split, step)).tolist()
        else:
            chosen = np.linspace(0, len(starts) - 1, size).round().astype(np.int64).tolist()
        ends = np.append(starts[1:], len(data))
        rows = np.full((size, self.seq_len + 1), eos, dtype=np.int64)
        for row, document in enumerate(chosen):
            start = int(starts[document])
            tokens = np.asarray(data[start:min(int(ends[document]), start + self.seq_len + 1)], dtype=np.int64)
            rows[row, :len(tokens)] = tokens
        windows = torch.from_numpy(rows)
        inputs, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        # a target is a document's own next token: none at its end-of-document id or past it
        ended = torch.cumsum((inputs == eos).long(), dim=1) > 0
        return inputs, targets.masked_fill(ended, IGNORE)

    @property
    def packs_documents(self) -> bool:
        return self.packing != "stream"

    def documents(self, inputs: Tensor) -> Documents | None:
        """Each document of a row starts after an end-of-document id (``pack`` and ``pad``; None for ``stream``)."""
        if self.packing == "stream":
            return None
        after = inputs[:, :-1] == self.text_tokenizer().eos_id
        return from_starts(torch.cat([torch.ones_like(after[:, :1]), after], dim=1))
