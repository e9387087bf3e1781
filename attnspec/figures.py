"""Figures and tables as files: matplotlib without a display, and CSV written atomically.

The reports of ``attnspec ablate`` and the diagnostics write their plots through here, so every
plot is a PNG and an SVG made the same way. Labels come from users' sweeps (variant names, grid
values), so text is drawn literally (matplotlib's mathtext off: ``$x$`` is not TeX), CSV cells that
a spreadsheet would run as a formula are neutralised, and every file is written atomically and
never through a link (:mod:`attnspec.io`).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Iterable


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet runs a cell starting with one of these as a formula (OWASP, "CSV injection")."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the non-interactive Agg backend (no display, no server) and text drawn
    literally: ``text.parse_math`` off, so a label such as ``$\\frac{}$`` is never parsed as TeX."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcParams["text.parse_math"] = False
    matplotlib.rcParams["text.usetex"] = False
    import matplotlib.pyplot as plt

    return plt


def log_scale(panel: Any, axis: str = "y", base: float = 10) -> None:
    """Put ``panel``'s ``axis`` ("x" or "y") on a log scale whose tick labels are plain text ("0.3", "10",
    "1e-16"): matplotlib labels log ticks with mathtext, which :func:`pyplot` turns off, so its own
    labels would print as ``$\\mathdefault{10^{0}}$``."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):  # LogFormatter picks which ticks to label; this, how
            return f"{x:g}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")

    scale_axis = panel.xaxis if axis == "x" else panel.yaxis
    (panel.set_xscale if axis == "x" else panel.set_yscale)("log", base=base)
    scale_axis.set_major_formatter(PlainLogFormatter(base))
    scale_axis.set_minor_formatter(PlainLogFormatter(base, labelOnlyBase=False))


def save_figure(figure: Any, directory: Path, stem: str) -> list[Path]:
    """Write ``figure`` as ``stem.png`` and ``stem.svg`` in ``directory`` (tight layout), atomically and
    never through a link, close it and return the two paths."""
    from attnspec.io import write_with

    try:
        figure.tight_layout()
        paths = []
        for suffix in ("png", "svg"):
            path = directory / f"{stem}.{suffix}"
            write_with(path, lambda tmp: figure.savefig(tmp, dpi=110, format=suffix,
                                                        metadata={"Date": None} if suffix == "svg" else None))
            paths.append(path)
    finally:
        pyplot().close(figure)
    return paths


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: floats keep every digit (``repr``), None is empty, and text a spreadsheet
    would evaluate (``=cmd|...``, ``+1+1``, ``@SUM``) is prefixed with ``'`` (negative numbers stay numbers)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and value.startswith(FORMULA_START) and not _is_number(value):
        return "'" + value
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def write_csv(path: Path, header: list[str], rows: Iterable[Iterable[Any]]) -> Path:
    """A CSV file written atomically (:func:`csv_cell` for every cell)."""
    from attnspec.io import write_atomic

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([csv_cell(name) for name in header])
    for row in rows:
        writer.writerow([csv_cell(value) for value in row])
    write_atomic(path, buffer.getvalue())
    return path
