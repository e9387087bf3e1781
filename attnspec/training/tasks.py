"""Training tasks: registered components (slot ``task``) with seeded generators and a metric.

A task is a strict pydantic model (its parameters, validated with located errors like a spec) that
produces batches: ``batch(split, step, size, seed)`` returns ``inputs`` (size, L) int64 and
``targets`` (size, L) int64, where ``IGNORE`` (-100) marks positions without an answer. A batch is
a pure function of (task, split, step, seed): the training split draws step ``s`` from the stream
seeded by (seed, "train", s), the test split from (seed, "test"), so the two never share a
generator seed, resuming at step ``s`` sees the same data, and data-parallel ranks slice one global
batch without overlap.

Synthetic tasks (Zoology's MQAR, GateLoop's Memory Horizon, selective copying, induction heads)
are generated; text tasks read the user's local files (a byte-level corpus, nanoGPT ``.bin`` token
files). Nothing is downloaded.

Plugins add tasks with ``@attnspec.spec.components.component("task")`` on a subclass of :class:`Task`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from attnspec.errors import AttnSpecError
from attnspec.spec import limits
from attnspec.spec.components import declare
from attnspec.spec.ir import Count, Node

IGNORE = -100
"""Target value of positions that carry no answer (``F.cross_entropy``'s ``ignore_index``)."""
MAX_DATA_BYTES = 1 << 32
"""A text corpus read into memory: at most 4 GiB (token files are memory-mapped, any size)."""
_SPLITS = {"train": 0, "test": 1}


class TaskError(AttnSpecError):
    """A task cannot run: its files are missing or malformed, or it does not fit the model."""


def generator(seed: int, split: str, step: int) -> torch.Generator:
    """The generator of one batch: seeded by (seed, split, step) only."""
    mixed = (seed * 1_000_003 + _SPLITS[split] * 998_244_353 + step * 7_919) % (1 << 62)
    return torch.Generator().manual_seed(mixed)


class Task(Node):
    """Base of every task: what it needs from the model and how its answers are scored."""

    slot: ClassVar[str] = "task"
    metric: ClassVar[Literal["accuracy", "perplexity"]] = "accuracy"
    """The headline metric: accuracy on the answer positions, or perplexity of every next token."""
    seq_len: Count(limits.MAX_LEN)

    @property
    def vocab_size(self) -> int:
        """Token ids the inputs and targets use (the spec's vocabulary must be at least this)."""
        raise NotImplementedError

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        """Examples of ``split`` (``train``: batch ``step``; ``test``: the fixed test set, step 0):
        inputs (size, seq_len) int64 and targets (size, seq_len) int64, ``IGNORE`` where no answer."""
        raise NotImplementedError

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        """Why this task cannot train a model with this vocabulary (None: not a token model) and max_len."""
        found = []
        if vocab_size is None:
            found.append(((), f"the {self.kind} task feeds token ids; the spec needs `input: {{kind: tokens, ...}}`"))
        elif vocab_size < self.vocab_size:
            found.append(((), f"the {self.kind} task uses {self.vocab_size} token ids but the spec's vocab_size is "
                              f"{vocab_size}; raise the spec's vocab_size or lower the task's"))
        if self.seq_len > max_len:
            found.append((("seq_len",), f"seq_len = {self.seq_len} is over the spec's max_len = {max_len}"))
        return found

    def describe(self) -> str:
        fields = ", ".join(f"{name}={value}" for name, value in self.model_dump(by_alias=True).items()
                           if name != "kind")
        return f"{self.kind}({fields})"


# --------------------------------------------------------------------------- synthetic tasks


def _sample_without_replacement(weights: Tensor, count: int, rows: int, gen: torch.Generator) -> Tensor:
    """(rows, count) distinct indices per row, drawn with probabilities ``weights`` (Gumbel top-k)."""
    gumbel = -torch.log(-torch.log(torch.rand(rows, weights.shape[0], generator=gen, dtype=torch.float64)
                                   .clamp_min(1e-300)))
    return torch.topk(torch.log(weights) + gumbel, count, dim=-1).indices


class MqarTask(Task):
    """Multi-query associative recall (Zoology, Arora et al. 2023): ``num_kv_pairs`` key-value pairs,
    then the keys again as queries at power-law distributed positions among random tokens; the
    answer at a query is its value. Keys come from [1, V/2), values from [V/2, V)."""

    kind: Literal["mqar"]
    seq_len: Count(limits.MAX_LEN) = 64
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=8, le=limits.MAX_VOCAB)] = 8192
    num_kv_pairs: Count(4096) = 4
    power_a: Annotated[float, Field(gt=0, le=1)] = 0.01
    """Query gaps are drawn with probability ~ a * gap^(a - 1) (small a: mostly short gaps)."""
    random_non_queries: bool = True
    """Fill the positions between queries with random tokens (Zoology's default) instead of 0."""

    @property
    def vocab_size(self) -> int:
        return self.vocab_size_

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.seq_len % 2:
            found.append((("seq_len",), f"MQAR places queries at even offsets: seq_len must be even, got {self.seq_len}"))
        if 4 * self.num_kv_pairs > self.seq_len:
            found.append((("num_kv_pairs",), f"{self.num_kv_pairs} pairs need seq_len >= {4 * self.num_kv_pairs} "
                                             "(the pairs, then room for every query)"))
        if self.num_kv_pairs >= self.vocab_size_ // 2:
            found.append((("num_kv_pairs",), f"{self.num_kv_pairs} distinct keys need vocab_size > "
                                             f"{2 * (self.num_kv_pairs + 1)}"))
        return found

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        V, L, n = self.vocab_size_, self.seq_len, self.num_kv_pairs
        half = V // 2
        keys = _sample_without_replacement(torch.ones(half - 1, dtype=torch.float64), n, size, gen) + 1
        values = _sample_without_replacement(torch.ones(V - half, dtype=torch.float64), n, size, gen) + half
        context = 2 * n
        space = (L - context) // 2
        gaps = torch.arange(1, space + 1, dtype=torch.float64)
        positions = _sample_without_replacement(self.power_a * gaps ** (self.power_a - 1), n, size, gen)
        inputs = torch.zeros(size, L, dtype=torch.long)
        inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
        query_at = context + 2 * positions
        inputs.scatter_(1, query_at, keys)
        targets = torch.full((size, L), IGNORE, dtype=torch.long)
        targets.scatter_(1, query_at, values)
        if self.random_non_queries:
            noise = torch.randint(0, V, (size, L), generator=gen)
            filler = inputs == 0
            filler[:, :context] = False
            inputs = torch.where(filler, noise, inputs)
        return inputs, targets


class MemoryHorizonTask(Task):
    """GateLoop's Memory Horizon (App. A, with the interpretation in the GateLoop digest): numbers in
    [0, max_number] with ``resets`` reset tokens; at each position the answer is the alternating sum
    of products of the numbers since the last reset paired from both ends (an odd list adds its
    middle number with the sign due), modulo ``modulus`` (non-negative). Ids: numbers 0..max_number,
    the reset token max_number + 1; answers 0..modulus - 1. Reset positions carry no answer."""

    kind: Literal["memory_horizon"]
    seq_len: Count(limits.MAX_LEN) = 1024
    max_number: Count(1000) = 4
    resets: Annotated[int, Field(ge=0, le=1000)] = 3
    modulus: Count(100_000) = 51
    """The paper's outputs are 0..50, so 51 (its exact modulus is unstated)."""

    @property
    def vocab_size(self) -> int:
        return max(self.max_number + 2, self.modulus)

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.resets >= self.seq_len:
            found.append((("resets",), f"{self.resets} resets do not fit in seq_len = {self.seq_len}"))
        return found

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        L = self.seq_len
        numbers = torch.randint(0, self.max_number + 1, (size, L), generator=gen)
        reset = torch.zeros(size, L, dtype=torch.bool)
        if self.resets:
            where = _sample_without_replacement(torch.ones(L, dtype=torch.float64), self.resets, size, gen)
            reset.scatter_(1, where, True)
        t = torch.arange(L).expand(size, L)
        # start of the current list: one after the last reset at or before t (0 if none)
        start = torch.cummax(torch.where(reset, t + 1, torch.zeros_like(t)), dim=1).values
        count = t - start + 1  # list length, including position t (0 at a reset: it holds no number)
        count = torch.where(reset, torch.zeros_like(count), count)
        result = torch.zeros(size, L, dtype=torch.long)
        for i in range((L + 1) // 2):  # pair i: (start + i, t - i), sign (-1)^i, while i < count // 2
            left = numbers.gather(1, (start + i).clamp(max=L - 1))
            right = numbers.gather(1, (t - i).clamp(min=0))
            sign = 1 - 2 * (i % 2)
            result += torch.where(i < count // 2, sign * left * right, 0)
        middle = numbers.gather(1, (start + count // 2).clamp(max=L - 1))
        middle_sign = 1 - 2 * ((count // 2) % 2)
        result += torch.where(count % 2 == 1, middle_sign * middle, 0)
        inputs = torch.where(reset, self.max_number + 1, numbers)
        targets = torch.where(reset, IGNORE, torch.remainder(result, self.modulus))
        return inputs, targets


class SelectiveCopyingTask(Task):
    """Selective copying (Gu & Dao 2023; MAD-Lab): ``num_tokens`` content tokens scattered among
    blanks (id 0), then ``num_tokens`` copy markers (id 1); the answers at the markers are the
    content tokens in order. Content ids come from [2, vocab_size)."""

    kind: Literal["selective_copying"]
    seq_len: Count(limits.MAX_LEN) = 256
    num_tokens: Count(4096) = 16
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=3, le=limits.MAX_VOCAB)] = 16

    @property
    def vocab_size(self) -> int:
        return self.vocab_size_

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if 2 * self.num_tokens > self.seq_len:
            found.append((("num_tokens",), f"{self.num_tokens} tokens and their copies need seq_len >= "
                                           f"{2 * self.num_tokens}"))
        return found

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        L, n = self.seq_len, self.num_tokens
        region = L - n
        content = torch.randint(2, self.vocab_size_, (size, n), generator=gen)
        where = _sample_without_replacement(torch.ones(region, dtype=torch.float64), n, size, gen).sort(-1).values
        inputs = torch.zeros(size, L, dtype=torch.long)
        inputs.scatter_(1, where, content)
        inputs[:, region:] = 1
        targets = torch.full((size, L), IGNORE, dtype=torch.long)
        targets[:, region:] = content
        return inputs, targets


class InductionHeadsTask(Task):
    """Induction heads (Olsson et al. 2022): random tokens with one trigger (id 1) followed by a token
    x; the sequence ends with the trigger again and the answer there is x. Other ids: [2, vocab_size)."""

    kind: Literal["induction_heads"]
    seq_len: Count(limits.MAX_LEN) = 256
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=3, le=limits.MAX_VOCAB)] = 32

    @property
    def vocab_size(self) -> int:
        return self.vocab_size_

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.seq_len < 4:
            found.append((("seq_len",), "induction heads needs seq_len >= 4"))
        return found

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        L = self.seq_len
        inputs = torch.randint(2, self.vocab_size_, (size, L), generator=gen)
        trigger_at = torch.randint(0, L - 2, (size, 1), generator=gen)
        inputs.scatter_(1, trigger_at, 1)
        answer = inputs.gather(1, trigger_at + 1)
        inputs[:, -1] = 1
        targets = torch.full((size, L), IGNORE, dtype=torch.long)
        targets[:, -1:] = answer
        return inputs, targets


# --------------------------------------------------------------------------- text from local files


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

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
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


def _regular_files(root: Path) -> list[Path]:
    """The regular files at ``root`` (a file, or a directory walked in sorted order, no symlinks)."""
    if root.is_symlink():
        raise TaskError(f"{root}: is a symbolic link; give the file or directory itself")
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise TaskError(f"{root}: no such file or directory")
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        for name in sorted(names):
            path = Path(directory) / name
            if path.is_file() and not path.is_symlink() and not name.startswith("."):
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
        total = sum(f.stat().st_size for f in files)
        if total > MAX_DATA_BYTES:
            raise TaskError(f"{self.path}: {total:,} bytes, over the limit of {MAX_DATA_BYTES:,} read into memory; "
                            "tokenise it into a nanoGPT .bin file (task `tokens`), which is memory-mapped")
        data = np.frombuffer(b"".join(f.read_bytes() for f in files), dtype=np.uint8)
        cut = len(data) - max(1, math.ceil(len(data) * self.val_fraction))
        return {"train": data[:cut], "test": data[cut:]}


class TokensTask(_TextTask):
    """nanoGPT token files: ``path`` is a directory with ``train.bin`` and ``val.bin``, flat arrays of
    ``dtype`` token ids (memory-mapped, read-only). ``vocab_size`` must be given: nanoGPT's
    ``meta.pkl`` is a pickle, and attnspec never unpickles."""

    kind: Literal["tokens"]
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=2, le=limits.MAX_VOCAB)]
    dtype: Literal["uint16", "uint32"] = "uint16"
    seq_len: Count(limits.MAX_LEN) = 256

    @property
    def vocab_size(self) -> int:
        return self.vocab_size_

    def read(self) -> dict[str, np.ndarray]:
        root = Path(self.path)
        arrays = {}
        for split, name in (("train", "train.bin"), ("test", "val.bin")):
            file = root / name
            if not file.is_file() or file.is_symlink():
                raise TaskError(f"{file}: missing (a nanoGPT token directory holds train.bin and val.bin)")
            itemsize = np.dtype(self.dtype).itemsize
            if file.stat().st_size % itemsize:
                raise TaskError(f"{file}: {file.stat().st_size} bytes is not a whole number of {self.dtype} tokens; "
                                "is `dtype` right?")
            arrays[split] = np.memmap(file, dtype=self.dtype, mode="r")
        return arrays


TaskUnion = declare("task", MqarTask, MemoryHorizonTask, SelectiveCopyingTask, InductionHeadsTask, BytesTask,
                    TokensTask, base=Task)
