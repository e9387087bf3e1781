"""The exceptions attnspec raises for mistakes a user can fix.

Every error a user can cause is an :class:`AttnSpecError`. The CLI prints its
``str()`` (no traceback) and exits with code 2. Errors about a spec carry one
or more :class:`Problem` entries, each with the file, line, column and dotted
path of the offending node, so the message reads like a compiler diagnostic::

    spec.yaml:14:9: layers[2].mixer.feature_map.kind: unknown value 'rleu' (did you mean 'relu'?)
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Sequence


class AttnSpecError(Exception):
    """Base class of every error a user of attnspec can cause and fix."""


@dataclass(frozen=True)
class Problem:
    """One problem found in a spec: where it is and what to do about it."""

    message: str
    path: str = ""
    source: str | None = None
    line: int | None = None
    column: int | None = None
    excerpt: str | None = None

    def __str__(self) -> str:
        where = []
        if self.source is not None:
            where.append(self.source)
            if self.line is not None:
                where.append(str(self.line))
                if self.column is not None:
                    where.append(str(self.column))
        prefix = ":".join(where)
        text = f"{prefix}: " if prefix else ""
        if self.path:
            text += f"{self.path}: "
        text += self.message
        if self.excerpt:
            text += "\n" + self.excerpt
        return text


class SpecError(AttnSpecError):
    """A spec could not be parsed or is invalid. ``problems`` lists every issue found."""

    def __init__(self, problems: Sequence[Problem] | Problem):
        if isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ShapeError(AttnSpecError, ValueError):
    """A tensor handed to an attnspec function has the wrong shape or dtype."""


class BuildError(AttnSpecError):
    """A build, export or load failed for a reason the user can act on."""


class RunError(AttnSpecError):
    """A run or runs directory, a report, task data or a cache cannot be read, written or resumed
    (missing, tampered, a link where attnspec writes, a file of someone else's in the way)."""


class RunInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C or SIGTERM; the message says what was kept (a run directory marked
    `interrupted` to resume, or none: it had no checkpoint and was removed). Still a KeyboardInterrupt,
    so whatever catches Ctrl-C (a sweep, the CLI) stops as it would."""


class InteropError(AttnSpecError):
    """A transformers checkpoint attnspec cannot import, or a model it cannot export (the message names
    the config field, the layers or the tensor, and what to do)."""


class TrainingDiverged(AttnSpecError):
    """Training met a non-finite loss or gradient norm and stopped; the run is recorded as diverged
    (``step``: the optimiser step whose loss or gradient was not finite)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def shorten(value: object, limit: int = 60) -> str:
    """``repr(value)`` (``str`` for strings, quoted), cut to ``limit`` characters with "..." so a
    message never carries a long value (a 1 MB string, a file's content)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_whole(name: str, value: object, low: int, high: int, unit: str = "") -> int:
    """``value`` where it is a whole number from ``low`` to ``high`` (a bool is not one); else an
    AttnSpecError naming ``name`` (an option, a field) and the range. Every numeric option of a command
    goes through this before any work."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AttnSpecError(f"{name} must be a whole number from {low:,} to {high:,}{unit}, got {shorten(value)}")
    return value


def excerpt_line(line: str, column: int, width: int = 100) -> str:
    """The source ``line`` with a caret under ``column`` (1-based), cut to ``width`` characters around it."""
    start = max(0, min(column - 1 - width // 2, len(line) - width))
    shown = line[start: start + width]
    if start > 0:
        shown = "..." + shown[3:]
    if start + width < len(line):
        shown = shown[:-3] + "..."
    return f"    {shown}\n    {' ' * (column - 1 - start)}^"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word)[:100], [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
