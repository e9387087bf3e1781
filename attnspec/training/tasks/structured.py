"""Structured reasoning tasks: LRA's ListOps and the rank-collapse paper's "learning to sort"."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from attnspec.spec import limits
from attnspec.spec.ir import Count
from attnspec.training.tasks.base import IGNORE, Task, generator, numpy_generator

LISTOPS_OPERATORS = ("MAX", "MIN", "MED", "SM")
"""Ids 10..13 open an operator's list (``[MAX``); the digits 0..9 are ids 0..9."""


class ListOpsTask(Task):
    """ListOps (Nangia & Bowman 2018, as in the Long Range Arena): a nested expression such as
    ``[MAX 4 [MIN 2 9 ] 0 ]`` whose value is a digit. Operators: MAX, MIN, MED (the median, rounded
    down as LRA's ``int(np.median(...))``) and SM (the sum modulo 10).

    Tokens: digits 0-9 are ids 0-9, ``[MAX`` ``[MIN`` ``[MED`` ``[SM`` ids 10-13, ``]`` id 14, the
    padding id 15 and the answer marker ``=`` id 16. An example is the expression (at least
    ``min_length`` and at most ``seq_len - 1`` tokens), left-padded, then ``=``, whose answer is the
    value (10 classes); the answer is the only scored position, as LRA's classification.
    Expressions are drawn as LRA's generator does: a tree of at most ``max_depth`` levels and
    ``max_args`` arguments per operator, each argument a digit or (with probability ``p_nest``,
    until the depth is reached) a sub-expression; draws outside the length range are redrawn.
    """

    kind: Literal["listops"]
    seq_len: Count(limits.MAX_LEN) = 512
    min_length: Count(limits.MAX_LEN) = 16
    max_depth: Count(20) = 10
    max_args: Annotated[int, Field(ge=2, le=20)] = 10
    p_nest: Annotated[float, Field(ge=0, lt=1)] = 0.25
    CLOSE: ClassVar[int] = 14
    PAD: ClassVar[int] = 15
    EQUALS: ClassVar[int] = 16

    @property
    def vocab_size(self) -> int:
        return 17

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.min_length + 1 > self.seq_len:
            found.append((("min_length",), f"min_length = {self.min_length} leaves no room in seq_len = {self.seq_len} "
                                           "for the expression and `=`"))
        if self.min_length < 5:
            found.append((("min_length",), "an expression has at least 3 tokens and a list at least 2 arguments: "
                                           "min_length must be at least 5"))
        return found

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        rng = numpy_generator(seed, split, step)
        inputs = torch.full((size, self.seq_len), self.PAD, dtype=torch.long)
        targets = torch.full((size, self.seq_len), IGNORE, dtype=torch.long)
        for row in range(size):
            tokens, value = self._expression(rng)
            inputs[row, self.seq_len - 1 - len(tokens):-1] = torch.tensor(tokens)
            inputs[row, -1] = self.EQUALS
            targets[row, -1] = value
        return inputs, targets

    def _expression(self, rng: np.random.Generator) -> tuple[list[int], int]:
        """Tokens and value of one expression within the length range (redrawn until it fits)."""
        for _ in range(10_000):
            tokens, value = _draw_listops(rng, self.max_depth, self.max_args, self.p_nest, 1)
            if self.min_length <= len(tokens) <= self.seq_len - 1:
                return tokens, value
        raise RuntimeError("ListOps: no expression in the length range after 10,000 draws; widen "
                           "[min_length, seq_len - 1] or change max_depth / max_args / p_nest")


def _draw_listops(rng: np.random.Generator, max_depth: int, max_args: int, p_nest: float,
                  depth: int) -> tuple[list[int], int]:
    """One random expression whose root (an operator) is at ``depth``: (tokens, value)."""
    operator = int(rng.integers(len(LISTOPS_OPERATORS)))
    tokens = [10 + operator]
    values = []
    for _ in range(int(rng.integers(2, max_args + 1))):
        if depth + 1 < max_depth and rng.random() < p_nest:  # a child at depth + 1, as LRA's generate_tree
            sub, value = _draw_listops(rng, max_depth, max_args, p_nest, depth + 1)
            tokens += sub
        else:
            value = int(rng.integers(10))
            tokens.append(value)
        values.append(value)
    tokens.append(ListOpsTask.CLOSE)
    return tokens, listops_value(LISTOPS_OPERATORS[operator], values)


def listops_value(operator: str, values: list[int]) -> int:
    """The value of one list: MAX, MIN, MED (``int(np.median)``, LRA's rounding) or SM (sum mod 10)."""
    if operator == "MAX":
        return max(values)
    if operator == "MIN":
        return min(values)
    if operator == "MED":
        return int(np.median(values))
    return sum(values) % 10


class SortTask(Task):
    """Learning to sort (Dong et al. 2021, rank-collapse paper sec. 4.3): ``seq_len`` letters drawn
    uniformly with replacement from an alphabet of ``alphabet`` (ids 0..alphabet-1); the answer at
    every position is that letter's position in the stably sorted sequence (ids 0..seq_len-1).

    The answer at a position depends on the letters after it, so the task needs a model that sees
    the whole sequence (mixers with ``causal: false``), as the paper's encoder does."""

    kind: Literal["sort"]
    seq_len: Count(limits.MAX_LEN) = 8
    alphabet: Annotated[int, Field(ge=2, le=limits.MAX_VOCAB)] = 10

    @property
    def vocab_size(self) -> int:
        return max(self.alphabet, self.seq_len)

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        letters = torch.randint(0, self.alphabet, (size, self.seq_len), generator=generator(seed, split, step))
        order = torch.sort(letters, dim=1, stable=True).indices  # order[r] = the position holding rank r
        ranks = torch.empty_like(order).scatter_(1, order, torch.arange(self.seq_len).expand(size, -1))
        return letters, ranks


class ConvexHullTask(Task):
    """Convex hull (rank-collapse paper sec. 4.3): ``seq_len`` points; the answer at every point is 1
    if it is a vertex of the points' convex hull, else 0. The paper's points are real, uniform in
    [0, 1]^2 and shifted by a random normal offset; here each point is a cell of a ``grid`` x
    ``grid`` board (token id ``x * grid + y``), drawn without replacement from a ``spread`` x
    ``spread`` window placed at a random offset (the shift), so a token model takes them. Points on
    a hull edge but not at a corner answer 0.

    Like sorting, the answer depends on every point: the model must see the whole sequence
    (``causal: false``). The answers are unbalanced (with 10 points about 57% are corners), so
    compare with the majority answer, as the paper does."""

    kind: Literal["convex_hull"]
    seq_len: Count(limits.MAX_LEN) = 10
    grid: Annotated[int, Field(ge=2, le=256)] = 16
    spread: Annotated[int, Field(ge=2, le=256)] = 12

    @property
    def vocab_size(self) -> int:
        return self.grid * self.grid

    def problems(self, *, vocab_size: int | None, max_len: int) -> list[tuple[tuple, str]]:
        found = super().problems(vocab_size=vocab_size, max_len=max_len)
        if self.spread > self.grid:
            found.append((("spread",), f"spread = {self.spread} does not fit in grid = {self.grid}"))
        elif self.seq_len > self.spread * self.spread:
            found.append((("seq_len",), f"{self.seq_len} distinct points do not fit in a {self.spread} x "
                                        f"{self.spread} window; raise spread"))
        return found

    def sample(self, split: str, step: int, size: int, seed: int) -> tuple[Tensor, Tensor]:
        rng = numpy_generator(seed, split, step)
        inputs = torch.empty(size, self.seq_len, dtype=torch.long)
        targets = torch.empty(size, self.seq_len, dtype=torch.long)
        for row in range(size):
            cells = rng.choice(self.spread * self.spread, size=self.seq_len, replace=False)
            offset = rng.integers(0, self.grid - self.spread + 1, size=2)
            points = np.stack([cells // self.spread + offset[0], cells % self.spread + offset[1]], axis=1)
            inputs[row] = torch.from_numpy(points[:, 0] * self.grid + points[:, 1])
            targets[row] = torch.from_numpy(hull_vertices(points).astype(np.int64))
        return inputs, targets


def hull_vertices(points: np.ndarray) -> np.ndarray:
    """(n, 2) distinct integer points -> (n,) bool: the corners of their convex hull (Andrew's
    monotone chain; points on an edge between corners are not corners)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    corner = np.zeros(len(points), dtype=bool)
    if len(points) <= 2:
        corner[:] = True
        return corner

    def cross(o: int, a: int, b: int) -> int:
        return int((points[a][0] - points[o][0]) * (points[b][1] - points[o][1])
                   - (points[a][1] - points[o][1]) * (points[b][0] - points[o][0]))

    for sequence in (order, order[::-1]):  # lower hull, then upper hull
        chain: list[int] = []
        for i in sequence:
            while len(chain) >= 2 and cross(chain[-2], chain[-1], i) <= 0:
                chain.pop()
            chain.append(i)
        corner[chain] = True
    return corner
