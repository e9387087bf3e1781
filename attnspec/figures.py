"""Figures and tables as files: matplotlib without a display, and CSV written atomically.

The reports of ``attnspec ablate`` and the diagnostics write their plots through here, so every
plot is a PNG and an SVG made the same way.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Iterable


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the non-interactive Agg backend (no display, no server)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, directory: Path, stem: str) -> list[Path]:
    """Write ``figure`` as ``stem.png`` and ``stem.svg`` in ``directory`` (tight layout), close it and
    return the two paths."""
    figure.tight_layout()
    paths = []
    for suffix in ("png", "svg"):
        path = directory / f"{stem}.{suffix}"
        figure.savefig(path, dpi=110, metadata={"Date": None} if suffix == "svg" else None)
        paths.append(path)
    pyplot().close(figure)
    return paths


def write_csv(path: Path, header: list[str], rows: Iterable[Iterable[Any]]) -> Path:
    """A CSV file written atomically; floats keep every digit (``repr``), None is empty."""
    from attnspec.training.rundir import write_atomic

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if value is None else repr(value) if isinstance(value, float) else value
                         for value in row])
    write_atomic(path, buffer.getvalue())
    return path
