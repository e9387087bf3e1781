"""Generated recall and memory tasks: Zoology's MQAR, GateLoop's Memory Horizon, selective copying
and induction heads."""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import Tensor

from attnspec.spec import limits
from attnspec.spec.ir import Count
from attnspec.training.tasks.base import IGNORE, Task, generator, sample_without_replacement


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

    def trivial_accuracy(self) -> float:
        """1 / num_kv_pairs: answering any value of the context, which a model learns long before it
        learns to recall (the plateau MQAR curves sit on)."""
        return 1.0 / self.num_kv_pairs

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        V, L, n = self.vocab_size_, self.seq_len, self.num_kv_pairs
        half = V // 2
        keys = sample_without_replacement(torch.ones(half - 1, dtype=torch.float64), n, size, gen) + 1
        values = sample_without_replacement(torch.ones(V - half, dtype=torch.float64), n, size, gen) + half
        context = 2 * n
        space = (L - context) // 2
        gaps = torch.arange(1, space + 1, dtype=torch.float64)
        positions = sample_without_replacement(self.power_a * gaps ** (self.power_a - 1), n, size, gen)
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

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        L = self.seq_len
        numbers = torch.randint(0, self.max_number + 1, (size, L), generator=gen)
        reset = torch.zeros(size, L, dtype=torch.bool)
        if self.resets:
            where = sample_without_replacement(torch.ones(L, dtype=torch.float64), self.resets, size, gen)
            reset.scatter_(1, where, True)
        t = torch.arange(L).expand(size, L)
        start = _list_starts(reset)
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

    def answer_spans(self, inputs: Tensor) -> Tensor:
        """(B, L) -> (B, L): the positions each answer depends on (the list since the last reset,
        GateLoop's "required memory span", the x axis of its Fig. 7); 0 at reset tokens."""
        reset = inputs == self.max_number + 1
        span = torch.arange(inputs.shape[1]).expand_as(inputs) - _list_starts(reset) + 1
        return torch.where(reset, torch.zeros_like(span), span)


def _list_starts(reset: Tensor) -> Tensor:
    """(B, L) bool -> (B, L): the start of the current list, one after the last reset at or before
    each position (0 before the first reset)."""
    t = torch.arange(reset.shape[1]).expand_as(reset)
    return torch.cummax(torch.where(reset, t + 1, torch.zeros_like(t)), dim=1).values


class SelectiveCopyingTask(Task):
    """Selective copying (Gu & Dao 2023; MAD-Lab): ``num_tokens`` content tokens scattered among
    blanks (id 0), then ``num_tokens`` copy markers (id 1); the answers at the markers are the
    content tokens in order. Content ids come from [2, vocab_size)."""

    kind: Literal["selective_copying"]
    seq_len: Count(limits.MAX_LEN) = 256
    num_tokens: Count(4096) = 16
    vocab_size_: Annotated[int, Field(alias="vocab_size", ge=3, le=limits.MAX_VOCAB)] = 16

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if 2 * self.num_tokens > self.seq_len:
            found.append((("num_tokens",), f"{self.num_tokens} tokens and their copies need seq_len >= "
                                           f"{2 * self.num_tokens}"))
        return found

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        gen = generator(seed, split, step)
        L, n = self.seq_len, self.num_tokens
        region = L - n
        content = torch.randint(2, self.vocab_size_, (size, n), generator=gen)
        where = sample_without_replacement(torch.ones(region, dtype=torch.float64), n, size, gen).sort(-1).values
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

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.seq_len < 4:
            found.append((("seq_len",), "induction heads needs seq_len >= 4"))
        return found

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
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


