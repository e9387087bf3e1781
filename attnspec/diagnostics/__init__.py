"""Diagnostics on any spec or trained run (``attnspec diagnose ...``): measurements the papers make,
each writing a table (CSV) and a plot (PNG and SVG).

**A diagnostic is one file.** A module of this package that defines ``DIAGNOSTIC``, a
:class:`Diagnostic`, is a command ``attnspec diagnose NAME``: the declaration says its name, its
parameters (:class:`Parameter`, data the CLI turns into arguments and options) and its ``run``, which
computes, writes its files and returns the :class:`Table` the CLI prints. The CLI finds the
diagnostics here (:func:`diagnostics`) and knows nothing else about them, so a new diagnostic is its
module, its test and its row in docs/ablation.md's table. The declarations import no torch, but their
modules do: the CLI imports them only when ``attnspec diagnose`` runs.

- :mod:`.rank_collapse`: the relative residual of every layer and the surgery variants (Dong et al. 2021);
- :mod:`.gates`: the transitions' magnitudes and phases over positions and at marked tokens (GateLoop);
- :mod:`.attention`: the attention matrix any mixer implies (run with V = I) and its error against exact
  softmax attention of the same q and k, across the entropy of synthetic scores;
- :mod:`.paths`: path isolation, the accuracy each length of attention path carries (Dong et al. 2021);
- :mod:`.span`: accuracy against the memory span an answer needs (GateLoop's Fig. 7);
- :mod:`.scatterbrain`: sparse, low-rank and their sum against exact attention by budget, ratio and
  entropy (Scatterbrain);
- :mod:`.maps`: every block's attention map on real inputs and its locality (cosFormer's Fig. 3);
- :mod:`.experts`: tokens per expert and the load-balancing loss of every mixture-of-experts block;
- :mod:`.subject`: what they look at, a spec at initialisation or a trained run, and the helpers
  that read a model's block inputs.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REQUIRED = ...
"""The default of a parameter the user must give."""


@dataclass(frozen=True)
class Parameter:
    """One command-line parameter of a diagnostic, passed to its ``run`` as the keyword ``name``."""

    name: str
    kind: type
    """int, float, str, bool or Path."""
    help: str
    default: Any = REQUIRED
    flags: tuple[str, ...] = ()
    """The option's spellings (default ``--name`` with dashes); ``("--a/--b",)`` for an on/off pair."""
    minimum: float | None = None
    maximum: float | None = None
    many: bool = False
    """Repeatable (an option) or several values (an argument); ``run`` gets a list, empty if none."""
    positional: bool = False
    metavar: str | None = None


@dataclass(frozen=True)
class Table:
    """What a diagnostic prints: a title, column names, rows of text."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    left: frozenset[str] = frozenset()
    """Columns aligned left (labels); the others are numbers, aligned right."""
    strong: frozenset[tuple[int, int]] = frozenset()
    """(row, column) cells to emphasise (the best of a row)."""


@dataclass(frozen=True)
class Result:
    """A diagnostic's outcome: the table to print and the files it wrote."""

    table: Table
    files: list[Path]


@dataclass(frozen=True)
class Diagnostic:
    """``attnspec diagnose NAME``: its summary (the command's help), parameters and computation."""

    name: str
    summary: str
    parameters: tuple[Parameter, ...]
    run: Callable[..., Result] = field(repr=False)


# Parameters several diagnostics share.
def output_option(files: str) -> Parameter:
    """The required ``--output/-o`` directory, naming the ``files`` the diagnostic writes there."""
    return Parameter("output", Path, f"Directory for {files}.", flags=("--output", "-o"))


OUTPUT_MARK = ".attnspec-diagnostics"
"""The empty file that marks a directory ``attnspec diagnose`` writes into (so it may write there again)."""


def output_directory(path: Path) -> Path:
    """The ``--output`` directory, ready for a diagnostic's files: created if missing, or an empty
    directory, or one a diagnostic wrote before (it holds :data:`OUTPUT_MARK`); never a link. A
    directory of the user's files is refused, so ``diagnose maps -o mine`` cannot replace their
    ``mine/maps.csv`` (the rule of build and report directories: attnspec replaces only what it wrote).

    Raises:
        RunError: the directory holds other files, or is a link or not a directory.
    """
    import os

    from attnspec.errors import RunError
    from attnspec.io import ensure_directory, write_atomic

    ensure_directory(path)
    mark = path / OUTPUT_MARK
    if not mark.is_file():
        try:
            entries = os.listdir(path)
        except OSError as error:
            raise RunError(f"{path}: cannot be read ({error.strerror})") from None
        if entries:
            raise RunError(f"{path}: holds files that attnspec diagnose did not write; a diagnostic writes only into "
                           "a new or empty directory, or one it wrote before. Choose another --output")
        write_atomic(mark, "")
    return path


SUBJECT = Parameter("source", Path, "A spec file, a run directory (its trained weights and its task's test inputs), or "
                    "a build directory (its weights: an imported transformers model, say).",
                    positional=True, metavar="SPEC_OR_DIR")
SEED = Parameter("seed", int, "Seed of the random inputs (a spec's).", default=0, minimum=0)
OVERRIDES = Parameter("overrides", str, "Override one value of the spec, e.g. --set layers[0].mixer.feature_map=relu. "
                      "Repeatable; the value is read as YAML.", default=None, flags=("--set", "-s"), many=True,
                      metavar="PATH=VALUE")


def diagnostics() -> dict[str, Diagnostic]:
    """Every diagnostic of this package, by name (imports their modules, and so torch)."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        declared = getattr(importlib.import_module(f"{__name__}.{module.name}"), "DIAGNOSTIC", None)
        if isinstance(declared, Diagnostic):
            found[declared.name] = declared
    return dict(sorted(found.items()))


__all__ = ["Diagnostic", "Parameter", "Table", "Result", "diagnostics", "output_option", "output_directory", "SUBJECT", "SEED", "OVERRIDES",
           "REQUIRED"]
