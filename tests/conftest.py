"""Shared test set-up: one Inductor cache directory for the whole run, small helpers."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# One Inductor/FX cache for every compiled test in this run (compiles cost 5-25 s each on 2 cores).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "attnspec-inductor-cache"))

# transformers (the reference semantics of released models) builds tiny random models from configs;
# nothing may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# A fresh mode calibration for the run: plans do not depend on what this machine measured before. The
# folder goes when the process does (every pytest-xdist worker made one, and they were left in /tmp).
os.environ["ATTNSPEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnspec-calibration-")
atexit.register(shutil.rmtree, os.environ["ATTNSPEC_CACHE_DIR"], ignore_errors=True)

# The suite runs in one pytest-xdist worker per core (pyproject's addopts). Each worker computes with one
# intra-op thread, and so do the processes it starts: at two threads per worker the workers' threads
# would contend for the same cores, which this project measured at 4-58x slower per op on 2 cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

# Without a CUDA device the Triton kernels run on Triton's CPU interpreter, so CI tests them too. The
# variable is read when a kernel is defined, so it is set before anything imports them; nothing else
# in attnspec or torch's CPU path uses Triton.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))


# Device-parametrised tests take ``device`` from DEVICES: CUDA cases run wherever a CUDA device is
# present and are skipped, with the reason shown, elsewhere.
import pytest  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="no CUDA device on this machine"))]


def table_text(lines: list[str]) -> str:
    """A rich table's text column by column (each column's pieces joined across the lines its cells wrap
    over), whitespace removed: what a cell says, however narrow the table drew it."""
    columns: dict[int, list[str]] = {}
    for line in lines:
        if line.startswith(("│", "┃")):
            for index, piece in enumerate(line.strip("│┃").split("│" if line.startswith("│") else "┃")):
                columns.setdefault(index, []).append(piece)
    return " | ".join("".join("".join(pieces).split()) for pieces in columns.values())
