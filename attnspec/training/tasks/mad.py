"""MAD-Lab's recall and memorisation tasks (Poli et al. 2024, "Mechanistic Design and Scaling of
Hybrid Architectures"), with MAD's difficulty knobs: ``vocab_size``, ``seq_len``, the fraction of
noise, motif sizes and ``train_examples`` (a finite training set, see :class:`Task`).

Vocabulary layout, as MAD's generators: keys ``[0, K)``, values ``[K, 2K)`` with ``K = (V - 1 -
noise_vocab_size) // 2``, noise tokens after the values, and ``V - 1`` the copy prefix (before the
final probe) or padding. As in MAD, training targets are the next token everywhere (a language
model's loss) and test targets only the recalled values, so the test accuracy measures recall.
One difference: MAD's multi-query sequences use the last id as an ordinary token; here ``V - 1``
is always reserved, so every sequence has exactly ``seq_len`` positions.

Selective copying is :class:`~attnspec.training.tasks.synthetic.SelectiveCopyingTask`. MAD's
compression task is not here: it scores an encoder-decoder (the sequence reconstructed from the
representation at one token), which a next-token task of this package cannot express.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from attnspec.spec import limits
from attnspec.spec.ir import Count
from attnspec.training.tasks.base import IGNORE, Task, generator, numpy_generator


class _RecallBase(Task):
    """What the recall tasks share: the vocabulary layout and the language-model training targets."""

    seq_len: Count(limits.MAX_LEN) = 128
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=5, le=limits.MAX_VOCAB)] = 16
    multi_query: bool = True
    """Every value whose key appeared before is an answer (MAD's default); False: only the final probe."""
    noise_vocab_size: Annotated[int, Field(ge=0, le=limits.MAX_VOCAB)] = 0
    frac_noise: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Share of key-value slots filled with noise tokens instead."""

    @property
    def special(self) -> int:
        """The copy-prefix / padding id."""
        return self.vocab_size_ - 1

    @property
    def num_keys(self) -> int:
        return (self.vocab_size_ - 1 - self.noise_vocab_size) // 2

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.num_keys < 2:
            found.append((("vocab_size",), f"vocab_size = {self.vocab_size_} leaves {self.num_keys} key id(s) after "
                                           f"{self.noise_vocab_size} noise ids and the copy prefix; raise it"))
        if self.frac_noise > 0 and self.noise_vocab_size == 0:
            found.append((("noise_vocab_size",), "frac_noise > 0 needs noise ids: set noise_vocab_size"))
        return found

    def _finish(self, full: Tensor, answers: Tensor, split: str) -> tuple[Tensor, Tensor]:
        """``full`` (B, seq_len + 1) and a mask of its answer tokens -> inputs and targets, shifted."""
        inputs = full[:, :-1]
        following = full[:, 1:]
        if split == "train":
            targets = torch.where(following == self.special, IGNORE, following)
        else:
            targets = torch.where(answers[:, 1:], following, IGNORE)
        return inputs.contiguous(), targets.contiguous()


class InContextRecallTask(_RecallBase):
    """MAD's in-context recall: key-value pairs (each key keeps one value within a sequence), then
    the copy prefix, a key that appeared and its value. With ``frac_noise`` > 0 this is MAD's noisy
    in-context recall (see ``noisy_in_context_recall`` for its defaults)."""

    kind: Literal["in_context_recall"]

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        S = self.seq_len + 1
        K = self.num_keys
        n = (S - 3) // 2  # pairs before the final [copy prefix, key, value]
        lead = S - 3 - 2 * n
        mapping = torch.randint(K, 2 * K, (size, K), generator=gen)  # this sequence's value of each key
        keys = torch.randint(0, K, (size, n), generator=gen)
        values = mapping.gather(1, keys)
        noise = torch.rand(size, n, generator=gen) < self.frac_noise
        noise[torch.arange(size), torch.randint(0, n, (size,), generator=gen)] = False  # at least one real pair
        if self.frac_noise > 0:
            low = 2 * K
            keys = torch.where(noise, torch.randint(low, low + self.noise_vocab_size, (size, n), generator=gen), keys)
            values = torch.where(noise, torch.randint(low, low + self.noise_vocab_size, (size, n), generator=gen),
                                 values)
        scores = torch.rand(size, n, generator=gen).masked_fill(noise, -1.0)
        probe = keys.gather(1, scores.argmax(1, keepdim=True))  # a key that was presented
        seen = _seen_before(torch.where(noise, K, keys), K + 1) & ~noise
        full = torch.cat([torch.full((size, lead), self.special), torch.stack([keys, values], 2).flatten(1),
                          torch.full((size, 1), self.special), probe, mapping.gather(1, probe)], 1)
        answers = torch.zeros(size, S, dtype=torch.bool)
        if self.multi_query:
            answers[:, lead + 1:lead + 2 * n:2] = seen
        answers[:, -1] = True
        return self._finish(full, answers, split)


class NoisyInContextRecallTask(InContextRecallTask):
    """MAD's noisy in-context recall: in-context recall with ``frac_noise`` of the key-value slots
    filled with noise tokens (MAD's defaults: 16 noise ids in a vocabulary of 32, 20% noise)."""

    kind: Literal["noisy_in_context_recall"]
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=5, le=limits.MAX_VOCAB)] = 32
    noise_vocab_size: Annotated[int, Field(ge=1, le=limits.MAX_VOCAB)] = 16
    frac_noise: Annotated[float, Field(ge=0, lt=1)] = 0.2


class FuzzyInContextRecallTask(_RecallBase):
    """MAD's fuzzy in-context recall: keys and values are motifs of 1 to ``k_motif_size`` /
    ``v_motif_size`` adjacent tokens (test keys always have ``k_motif_size`` tokens); the answers are
    the tokens of a value whose key appeared before."""

    kind: Literal["fuzzy_in_context_recall"]
    k_motif_size: Count(8) = 3
    v_motif_size: Count(8) = 3

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.seq_len < 4 * (self.k_motif_size + self.v_motif_size) + 1:
            found.append((("seq_len",), f"seq_len must be at least {4 * (self.k_motif_size + self.v_motif_size) + 1} "
                                        "for pairs of these motif sizes"))
        return found

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        rng = numpy_generator(seed, split, step)
        rows = [self._one(rng, split) for _ in range(size)]
        full = torch.tensor(np.stack([row for row, _ in rows]), dtype=torch.long)
        answers = torch.tensor(np.stack([mask for _, mask in rows]))
        return self._finish(full, answers, split)

    def _one(self, rng: np.random.Generator, split: str) -> tuple[np.ndarray, np.ndarray]:
        K, S = self.num_keys, self.seq_len + 1
        key_sizes = [self.k_motif_size] if split == "test" else list(range(1, self.k_motif_size + 1))

        def motif(low: int, high: int, sizes: list[int]) -> tuple:
            return tuple(rng.integers(low, high, rng.choice(sizes)).tolist())

        mapping: dict[tuple, tuple] = {}
        tokens: list[int] = []
        answer: list[bool] = []
        room = S - 1 - self.k_motif_size - self.v_motif_size  # leave the final [copy prefix, key, value]
        while len(tokens) + self.k_motif_size + self.v_motif_size <= room:
            if self.frac_noise > 0 and rng.random() < self.frac_noise:
                width = rng.integers(2, self.k_motif_size + self.v_motif_size + 1)
                tokens += rng.integers(2 * K, 2 * K + self.noise_vocab_size, width).tolist()
                answer += [False] * width
                continue
            key = motif(0, K, key_sizes)
            repeated = key in mapping
            value = mapping.setdefault(key, motif(K, 2 * K, list(range(1, self.v_motif_size + 1))))
            tokens += [*key, *value]
            answer += [False] * len(key) + [repeated and self.multi_query] * len(value)
        if not mapping:  # only noise: add one pair
            key = motif(0, K, key_sizes)
            mapping[key] = motif(K, 2 * K, list(range(1, self.v_motif_size + 1)))
            tokens, answer = [*key, *mapping[key]], [False] * (len(key) + len(mapping[key]))
        probe = list(mapping)[rng.integers(len(mapping))]
        tail = [self.special, *probe, *mapping[probe]]
        tokens, answer = tokens + tail, answer + [False] * (1 + len(probe)) + [True] * len(mapping[probe])
        pad = S - len(tokens)
        return (np.array([self.special] * pad + tokens), np.array([False] * pad + answer))


class MemorizationTask(Task):
    """MAD's memorisation: a fixed key -> value map (drawn once from ``map_seed``, the same for every
    example and split) to learn into the weights; each example is ``seq_len / 2`` keys, each followed
    by the insert token, whose answer is the key's value. Keys ``[0, K)``, values ``[K, 2K)``,
    ``K = (V - 1) // 2``, insert token ``V - 1``."""

    kind: Literal["memorization"]
    seq_len: Count(limits.MAX_LEN) = 32
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=5, le=limits.MAX_VOCAB)] = 256
    map_seed: Annotated[int, Field(ge=0, le=limits.MAX_SEED)] = 12345

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.seq_len % 2:
            found.append((("seq_len",), f"memorization alternates key and insert token: seq_len must be even, "
                                        f"got {self.seq_len}"))
        return found

    def key_value_map(self) -> Tensor:
        """(K,) the value of each key."""
        K = (self.vocab_size_ - 1) // 2
        return torch.randperm(K, generator=torch.Generator().manual_seed(self.map_seed)) + K

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        mapping = self.key_value_map()
        keys = torch.randint(0, len(mapping), (size, self.seq_len // 2), generator=gen)
        inputs = torch.stack([keys, torch.full_like(keys, self.vocab_size_ - 1)], 2).flatten(1)
        targets = torch.stack([torch.full_like(keys, IGNORE), mapping[keys]], 2).flatten(1)
        return inputs, targets


def _seen_before(keys: Tensor, count: int) -> Tensor:
    """(B, n) keys in [0, count) -> (B, n) whether the same key occurs earlier in its row."""
    onehot = torch.nn.functional.one_hot(keys, count)
    before = onehot.cumsum(1) - onehot
    return before.gather(2, keys.unsqueeze(2)).squeeze(2) > 0
