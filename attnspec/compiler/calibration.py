"""This machine's calibration store: measured mode times per mixer structure, regime and shape, in a
JSON cache file keyed by the machine (attnspec and torch versions, CPU model and count). The planner
reads it (:mod:`attnspec.compiler.plan`), :mod:`attnspec.compiler.calibrate` measures and writes it.
Reading it imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
from pathlib import Path

from attnspec.io import VERSION, cache_directory, read_cache_file, write_cache_file
from attnspec.spec.ir import Spec

MAX_REASON_CHARS = 1024
"""A calibration's reason for skipping a mode is one sentence; a longer one is not attnspec's (and would
not fit the manifest's 4,096-character text fields)."""


def mixer_signature(spec: Spec, mixer) -> str:
    """What a mixer's speed depends on: its spec node without ``mode``, the model width, ``max_len``
    (the scan depth) and the dtype, hashed. Blocks of the same structure share it."""
    data = {"mixer": mixer.model_dump(mode="json", exclude={"mode"}), "d_model": spec.d_model,
            "max_len": spec.max_len, "dtype": spec.dtype}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]


def calibration_path() -> Path:
    """The calibration file, ``calibration.json`` in :func:`cache_directory`."""
    return cache_directory() / "calibration.json"


def machine_key() -> str:
    """This machine and software, as far as speed goes: attnspec and torch versions, CPU model and count,
    and the threads asked for (``OMP_NUM_THREADS``, as sweep workers set it; a measurement at 1 thread
    does not plan a run at 2)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "?"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = os.environ.get("OMP_NUM_THREADS", "default")
    return f"attnspec {VERSION}, torch {torch_version}, {cpu}, {os.cpu_count()} cpus, {threads} threads"


class Calibration:
    """This machine's measured mode times (:mod:`attnspec.compiler.calibrate`), from a JSON cache file.

    ``entries`` maps ``"signature|regime|B|L"`` to ``{"seconds": {mode: s}, "skipped": {mode: why},
    "spread": {mode: interquartile range / median}}``.
    An unreadable or oversized file is treated as empty (it is a cache, rewritten on save).
    """

    def __init__(self, path: Path | None, entries: dict[str, dict], machine: str = ""):
        self.path, self.entries, self.machine = path, entries, machine

    @classmethod
    def empty(cls) -> "Calibration":
        """No measurements: plans come from the cost model alone."""
        return cls(None, {})

    @classmethod
    def load(cls, path: Path | None = None) -> "Calibration":
        path = path or calibration_path()
        machine = machine_key()
        return cls(path, _read_entries(path).get(machine, {}), machine)

    @staticmethod
    def key(signature: str, regime: str, batch: int, length: int) -> str:
        return f"{signature}|{regime}|{batch}|{length}"

    def lookup(self, signature: str, regime: str, batch: int, length: int) -> dict | None:
        return self.entries.get(self.key(signature, regime, batch, length))

    def store(self, signature: str, regime: str, batch: int, length: int, seconds: dict[str, float],
              skipped: dict[str, str], spread: dict[str, float] | None = None) -> None:
        self.entries[self.key(signature, regime, batch, length)] = {"seconds": seconds, "skipped": skipped,
                                                                    "spread": spread or {}}

    def save(self) -> None:
        """Merge into the file (other processes may have added entries) and replace it atomically."""
        if self.path is None:
            return
        machines = _read_entries(self.path)
        machines.setdefault(self.machine, {}).update(self.entries)
        write_cache_file(self.path, "machines", machines)


def _read_entries(path: Path) -> dict[str, dict]:
    machines = read_cache_file(path, "machines")
    return {name: {key: entry for key, entry in entries.items() if _valid_entry(entry)}
            for name, entries in machines.items() if isinstance(entries, dict)}


def _valid_entry(entry: object) -> bool:
    """A cache entry as :meth:`Calibration.store` writes it: finite non-negative seconds, reasons as text."""
    if not isinstance(entry, dict) or not isinstance(entry.get("seconds"), dict):
        return False
    seconds, skipped, spread = entry["seconds"], entry.get("skipped", {}), entry.get("spread", {})
    return (isinstance(spread, dict) and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                             and math.isfinite(t) and t >= 0
                                             for t in (*seconds.values(), *spread.values()))
            and isinstance(skipped, dict)
            and all(isinstance(why, str) and len(why) <= MAX_REASON_CHARS for why in skipped.values()))


__all__ = ["Calibration", "MAX_REASON_CHARS", "calibration_path", "machine_key", "mixer_signature"]
