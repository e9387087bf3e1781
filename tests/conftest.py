"""Shared test set-up: one Inductor cache directory for the whole run, small helpers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# One Inductor/FX cache for every compiled test in this run (compiles cost 5-25 s each on 2 cores).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "attnspec-inductor-cache"))

# A fresh mode calibration for the run: plans do not depend on what this machine measured before.
os.environ["ATTNSPEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnspec-calibration-")

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
