"""What every task is: a strict model of its parameters with a seeded batch generator and a metric."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import PrivateAttr
from torch import Tensor

from attnspec.errors import AttnSpecError
from attnspec.spec import limits
from attnspec.spec.ir import Count, Node

IGNORE = -100
"""Target value of positions that carry no answer (``F.cross_entropy``'s ``ignore_index``)."""
MAX_DATA_BYTES = 1 << 32
"""A text corpus read into memory: at most 4 GiB (token files are memory-mapped, any size)."""
SPLITS = {"train": 0, "test": 1}
MAX_TRAIN_EXAMPLES = 1 << 22



NOISE = 0.03
"""Accuracy within this of chance (or within two seed standard deviations, if more) is "not learned":
about two standard errors of a test set of 512 answers at accuracy 0.5."""


def learned(accuracy: float | None, chance: float | None, spread: float = 0.0) -> bool | None:
    """Whether ``accuracy`` is beyond ``chance`` by more than noise, chance + max(NOISE, 2 ``spread``)
    (``spread``: the seeds' standard deviation); None without a chance level (perplexity tasks)."""
    if chance is None or accuracy is None:
        return None
    return accuracy > chance + max(NOISE, 2 * spread)

class TaskError(AttnSpecError):
    """A task cannot run: its files are missing or malformed, or it does not fit the model."""


def generator(seed: int, split: str, step: int) -> torch.Generator:
    """The generator of one batch: seeded by (seed, split, step) only."""
    mixed = (seed * 1_000_003 + SPLITS[split] * 998_244_353 + step * 7_919) % (1 << 62)
    return torch.Generator().manual_seed(mixed)


class Task(Node):
    """Base of every task: what it needs from the model and how its answers are scored."""

    slot: ClassVar[str] = "task"
    metric: ClassVar[Literal["accuracy", "perplexity"]] = "accuracy"
    """The headline metric: accuracy on the answer positions, or perplexity of every next token."""
    seq_len: Count(limits.MAX_LEN)
    train_examples: Count(MAX_TRAIN_EXAMPLES) | None = None
    """A finite training set of this many examples, sampled with replacement at every step (MAD's
    difficulty knob); None: fresh examples at every step."""
    _pool: tuple[int, Tensor, Tensor] | None = PrivateAttr(default=None)

    @property
    def vocab_size(self) -> int:
        """Token ids the inputs and targets use (the spec's vocabulary must be at least this): the
        field written ``vocab_size`` (``vocab_size_`` in Python) where a task has one; tasks with a
        fixed vocabulary override this."""
        if "vocab_size_" in type(self).model_fields:
            return self.vocab_size_
        raise NotImplementedError

    def batch(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        """Examples of ``split`` (``train``: batch ``step``; ``test``: the fixed test set, step 0):
        inputs (size, seq_len) int64 and targets (size, seq_len) int64, ``IGNORE`` where no answer.

        With ``train_examples`` the training batches are drawn (by the step's generator) from one
        fixed set of that many examples, generated once per seed from the training stream's step 0
        and never from the test stream."""
        if split != "train" or self.train_examples is None:
            return self.sample(split, step, size, seed)
        if self._pool is None or self._pool[0] != seed:
            self._pool = (seed, *self.sample("train", 0, self.train_examples, seed))
        chosen = torch.randint(0, self.train_examples, (size,), generator=generator(seed, "train", step + 1))
        return self._pool[1][chosen], self._pool[2][chosen]

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        """``size`` fresh examples of ``split`` from the generator of (seed, split, step); see :meth:`batch`."""
        raise NotImplementedError

    def chance(self, seed: int = 0, examples: int = 256) -> float | None:
        """The accuracy of answering without the question: the most common answer's share of the test
        set (``examples`` of them, ``seed``'s), or the task's own trivial baseline
        (:meth:`trivial_accuracy`) where higher. None for perplexity. Reports label a result within
        noise of it "not learned"."""
        if self.metric != "accuracy":
            return None
        answers = self.batch("test", 0, examples, seed)[1]
        answers = answers[answers != IGNORE]
        if answers.numel() == 0:
            return None
        majority = float(answers.bincount().max()) / answers.numel()
        return max(majority, self.trivial_accuracy() or 0.0)

    def trivial_accuracy(self) -> float | None:
        """The accuracy of a strategy that needs none of the skill the task measures (MQAR: any value
        of the context), where a task has one beyond the majority answer."""
        return None

    def prepare(self, progress=None) -> None:
        """Make the task's data ready before the first batch (tokenise a corpus, read files), calling
        ``progress(done, total)`` as it goes where that takes a while. Generated tasks need nothing."""

    @property
    def packs_documents(self) -> bool:
        """Whether a row may hold several documents (:meth:`documents` says where); the plan records it."""
        return False

    def documents(self, inputs: Tensor):
        """The packed documents of a batch's ``inputs`` (B, L) (:class:`attnspec.ops.documents.Documents`),
        each computed as if alone; None: every row is one sequence."""
        return None

    def text_tokenizer(self):
        """The :class:`attnspec.tokenizer.Tokenizer` a text task reads its corpus with (a run keeps a copy
        beside its checkpoints, and a build from the run carries it); None for token tasks."""
        return None

    def data_identity(self) -> dict | None:
        """What identifies the data beyond the task's fields (a tokenizer's hash, a corpus's content), so a
        run resumed or evaluated on other data is refused; None where the fields say it all."""
        return None

    def answer_spans(self, inputs: Tensor) -> Tensor | None:
        """How far back each answer of ``inputs`` (B, L) reaches, (B, L) positions, for tasks where
        that is the difficulty (``attnspec diagnose span``); None where a task does not say."""
        return None

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


def numpy_generator(seed: int, split: str, step: int) -> np.random.Generator:
    """A NumPy generator for tasks generated example by example, seeded from :func:`generator`."""
    return np.random.default_rng(int(torch.randint(0, 1 << 62, (1,), generator=generator(seed, split, step))))


def sample_without_replacement(weights: Tensor, count: int, rows: int, gen: torch.Generator) -> Tensor:
    """(rows, count) distinct indices per row, drawn with probabilities ``weights`` (Gumbel top-k)."""
    gumbel = -torch.log(-torch.log(torch.rand(rows, weights.shape[0], generator=gen, dtype=torch.float64)
                                   .clamp_min(1e-300)))
    return torch.topk(torch.log(weights) + gumbel, count, dim=-1).indices

