"""Planning: choose per mixer the execution mode for full sequences and for one-token decoding.

The cost model estimates, per mixer and per mode, the multiply-adds, the bytes moved through
memory and the number of sequential steps, from the sequence length L, the widths (feature
width m, value width d, head count H) and whether the transition is per channel or complex.
A mode's estimated time is

    macs / MAC_RATE + bytes / BANDWIDTH + sequential_steps * STEP_OVERHEAD

with rates for a 2-core CPU; ``auto`` takes the cheapest valid mode. Three regimes:

* full sequence (training, prefill): the model is compiled and exported with a dynamic length,
  so only modes without a Python loop over positions qualify (chunk, scan, quadratic); a
  forced ``recurrent`` is rejected for builds with the reason.
* training at a batch B: the multiply-adds and memory traffic scale with B and about 3x (the
  backward pass recomputes and stores what the forward did), the sequential steps only 2x, so at
  training batches the work, not the number of steps, decides (a per-channel quadratic mode that
  wins at batch 1 materialises B x L x L x m decays and loses). An eager (uncompiled) training
  run may use the recurrent mode's loop; a compiled one is traced at a fixed length, so may too.
* decoding: the recurrent step (constant-size state) for mixers that have one; softmax and
  Scatterbrain need the whole prefix, so a model containing them has no decoding step.

Where this machine has a calibration (:class:`Calibration`, measured by
:mod:`attnspec.compiler.calibrate`) for a mixer's structure, regime and shapes, ``auto`` takes the
fastest *measured* mode instead of the cheapest estimate; the estimates stay beside the
measurements in ``explain``. This module reads the calibration file without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnspec.errors import BuildError
from attnspec.io import VERSION, cache_directory, read_cache_file, write_cache_file
from attnspec.spec.ir import Spec, iter_blocks
from attnspec.spec.source import format_path

MAC_RATE = 40e9  # multiply-adds per second a 2-core CPU sustains on these shapes (measured order)
BANDWIDTH = 10e9  # bytes per second of memory traffic
STEP_OVERHEAD = 20e-6  # seconds per sequential step (a kernel launch / Python iteration)
# Eager training pays far more per sequential step: each position of the recurrent loop runs ~15
# small ops forward and their autograd nodes backward. Measured on the 2-core CPU (per-channel
# GateLoop, one layer, L = 64..2048): ~0.7 ms per position for forward + backward together.
TRAINING_STEP_OVERHEAD = 350e-6
BYTES = 4
MAX_BYTES = 2 << 30  # a calibration does not run a mode estimated to move more memory than this
REGIMES = ("inference", "training")


@dataclass
class Cost:
    """Estimated work of one mixer at one length (all heads, batch 1)."""

    macs: float
    bytes: float
    state_bytes: float
    sequential_steps: int
    step_overhead: float = STEP_OVERHEAD

    @property
    def seconds(self) -> float:
        return self.macs / MAC_RATE + self.bytes / BANDWIDTH + self.sequential_steps * self.step_overhead


@dataclass
class LayerPlan:
    """The plan of one block's mixer."""

    path: str
    mixer: str
    full_mode: str
    decode_mode: str | None
    cost: Cost
    reason: str
    candidates: dict[str, float] = field(default_factory=dict)
    """Estimated seconds of every valid mode."""
    measured: dict[str, float] | None = None
    """Measured seconds of the modes this machine's calibration ran (None: not calibrated)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Modes the calibration did not run, and why."""

    @property
    def seconds(self) -> float:
        """The chosen mode's time: measured where this machine's calibration has it, else estimated."""
        return (self.measured or {}).get(self.full_mode, self.cost.seconds)


@dataclass
class Plan:
    """The plan of a model at one length: one :class:`LayerPlan` per block, in execution order."""

    length: int
    layers: list[LayerPlan]
    batch: int = 1
    training: bool = False

    @property
    def full_modes(self) -> list[str]:
        return [layer.full_mode for layer in self.layers]

    @property
    def has_decode(self) -> bool:
        return all(layer.decode_mode is not None for layer in self.layers)

    def to_json(self) -> dict:
        return {"length": self.length, "batch": self.batch, "training": self.training,
                "layers": [asdict(layer) for layer in self.layers]}


def linear_costs(L: int, H: int, m: int, d: int, chunk: int, per_channel: bool, complex_: bool) -> dict[str, Cost]:
    """Estimated costs of each mode of (gated) linear attention; see the module docstring."""
    c = 2 if complex_ else 1  # real and imaginary parts of the state
    state = H * m * d * c
    n = -(-L // chunk)
    levels = max(0, math.ceil(math.log(max(n / 128, 1), 16)))  # grouping levels of the cross-chunk scan (chunk.TOP)
    intra_decay = L * chunk * (m if per_channel else 1)
    costs = {
        "recurrent": Cost(macs=H * L * m * d * 2 * c, bytes=H * L * (2 * m + d) * BYTES + L * state * BYTES,
                          state_bytes=state * BYTES, sequential_steps=L),
        "scan": Cost(macs=H * L * m * d * c * (1 + max(1, math.ceil(math.log2(max(L, 2))))),
                     bytes=H * L * m * d * c * BYTES * (2 + 2 * math.ceil(math.log2(max(L, 2)))),
                     state_bytes=state * BYTES, sequential_steps=math.ceil(math.log2(max(L, 2)))),
        # the cross-chunk scan is a recurrence over chunk states: ~2 multiply-adds and ~5 passes per entry
        "chunk": Cost(macs=H * (L * chunk * (m + d) + 2 * L * m * d * c + intra_decay + 2 * n * m * d * c),
                      bytes=H * (L * chunk * (1 + (m if per_channel else 0)) + n * m * d * c * 5 + L * (2 * m + 2 * d)) * BYTES,
                      state_bytes=state * BYTES, sequential_steps=2 * levels + 6),
        "quadratic": Cost(macs=H * (L * L * (m + d) + (L * L * m if per_channel else 0)),
                          bytes=H * L * L * (2 + (m if per_channel else 0)) * BYTES,
                          state_bytes=state * BYTES, sequential_steps=4),
    }
    return costs


def _softmax_cost(L: int, H: int, dk: int, dv: int) -> Cost:
    return Cost(macs=H * L * L * (dk + dv) / 2, bytes=H * L * (2 * dk + 2 * dv) * BYTES * 4, state_bytes=0,
                sequential_steps=4)


def plan_spec(spec: Spec, length: int | None = None, *, for_build: bool = False, batch: int = 1,
              training: bool = False, calibration: "Calibration | None" = None) -> Plan:
    """Plan every block of a resolved spec at ``length`` (default ``max_len``).

    With ``for_build`` a forced mode that cannot be compiled with a dynamic length is an error.
    ``batch`` and ``training``: the regime of a training run (forward and backward at that batch,
    fixed length, so the recurrent loop qualifies); the default is inference at batch 1.
    ``calibration``: measured times to choose by where they exist (default: this machine's cache,
    if any; pass ``Calibration.empty()`` to plan from the cost model alone).
    """
    L = length or spec.max_len
    if L < 1:
        raise BuildError(f"--length must be positive, got {L}")
    if batch < 1:
        raise BuildError(f"the batch must be positive, got {batch}")
    calibration = calibration if calibration is not None else Calibration.load()
    regime = "training" if training else "inference"
    layers = []
    for index, (path, block) in enumerate(iter_blocks(spec, expand=True)):
        entry = calibration.lookup(mixer_signature(spec, block.mixer), regime, batch, L)
        layers.append(_plan_mixer(block.mixer, f"blocks[{index}] ({format_path(path)})", L, for_build, batch, training,
                                  entry))
    return Plan(L, layers, batch, training)


def _regime(cost: Cost, batch: int, training: bool) -> Cost:
    """A batch-1 forward cost scaled to ``batch`` and, when training, to forward + backward."""
    work = batch * (3 if training else 1)
    return Cost(macs=cost.macs * work, bytes=cost.bytes * work, state_bytes=cost.state_bytes * batch,
                sequential_steps=cost.sequential_steps * (2 if training else 1),
                step_overhead=TRAINING_STEP_OVERHEAD if training else cost.step_overhead)


def regime_modes(mixer, regime: str) -> tuple[str, ...]:
    """The modes of ``mixer`` valid in ``regime``: inference (a build) excludes the recurrent mode's
    loop over positions for causal mixers, which cannot be exported with a dynamic length."""
    if mixer.softmax_kernel:
        return ("quadratic",)
    loops = mixer.causal and regime != "training"
    return tuple(mode for mode in mixer.modes() if mode != "recurrent" or not loops)


def estimated_costs(mixer, L: int, batch: int = 1, training: bool = False) -> dict[str, Cost]:
    """The cost model's estimate of every mode ``mixer`` has, at (batch, L) in the regime."""
    H = mixer.heads
    if mixer.softmax_kernel:
        return {"quadratic": _regime(_softmax_cost(L, H, mixer.d_qk, mixer.d_v), batch, training)}
    transition = getattr(mixer, "transition", None)
    per_channel = transition is not None and transition.per_channel
    complex_ = transition is not None and transition.is_complex
    d = mixer.d_v + (1 if getattr(mixer, "normalize", True) else 0)
    m = mixer.feature_width()
    costs = {mode: cost for mode, cost in linear_costs(L, H, m, d, mixer.chunk_size, per_channel, complex_).items()
             if mode in mixer.modes()}
    sparse = mixer.sparse_keys()
    for cost in costs.values():  # the exact part on a sparse support (Scatterbrain)
        cost.macs += H * L * sparse * (mixer.d_qk + mixer.d_v + m)
        cost.bytes += H * L * sparse * (mixer.d_qk + mixer.d_v) * BYTES
    if not mixer.causal:  # every mode but quadratic computes the linear form q (K^T V): no loop, no scan
        linear_form = Cost(macs=H * L * m * d * 2, bytes=H * L * (2 * m + 2 * d) * BYTES, state_bytes=0,
                           sequential_steps=3)
        costs = {name: (costs[name] if name == "quadratic" else linear_form) for name in costs}
    return {name: _regime(cost, batch, training) for name, cost in costs.items()}


def _plan_mixer(mixer, path: str, L: int, for_build: bool, batch: int = 1, training: bool = False,
                calibrated: dict | None = None) -> LayerPlan:
    costs = estimated_costs(mixer, L, batch, training)
    valid = regime_modes(mixer, "training" if training else "inference")
    seconds = {name: cost.seconds for name, cost in costs.items()}
    decode = "recurrent" if mixer.has_step else None
    measured = skipped = None
    if calibrated is not None:
        measured = {mode: t for mode, t in calibrated["seconds"].items() if mode in valid}
        skipped = {mode: why for mode, why in calibrated.get("skipped", {}).items() if mode in valid}
    if mixer.softmax_kernel:
        reason = ("the softmax kernel has no finite features: quadratic is the only mode; no constant-size decoding "
                  "state (the whole prefix is needed)")
        return LayerPlan(path, mixer.describe(), "quadratic", None, costs["quadratic"], reason, seconds, measured)
    if mixer.mode != "auto":
        if for_build and mixer.mode not in valid:
            raise BuildError(f"{path}: mixer.mode 'recurrent' loops over positions in Python, so it cannot be compiled "
                             "or exported with a dynamic sequence length; use `mode: auto` or `chunk` (decoding "
                             "uses the recurrent form anyway)")
        chosen = mixer.mode
        reason = f"forced by the spec (mode: {mixer.mode})"
    else:
        prefix = ("training " if training else "") + (f"at batch {batch}, " if batch > 1 else "")
        if measured and all(mode in measured or mode in skipped for mode in valid):
            ranked = sorted(measured, key=measured.get)
            chosen = ranked[0]
            reason = prefix + f"fastest measured on this machine ({_ms(measured[chosen])})"
            if len(ranked) > 1:
                reason += f"; next {ranked[1]}, {measured[ranked[1]] / max(measured[chosen], 1e-12):.1f}x slower"
        else:
            ranked = sorted(valid, key=lambda name: costs[name].seconds)
            chosen = ranked[0]
            reason = prefix + f"cheapest estimate ({_ms(costs[chosen].seconds)}; not calibrated)"
        if "recurrent" in costs and "recurrent" not in valid:
            reason += "; recurrent cannot be exported with a dynamic length"
    if decode is None:
        reason += "; no decoding step (" + ("it needs the whole prefix)" if mixer.causal else "non-causal)")
    return LayerPlan(path, mixer.describe(), chosen, decode, costs[chosen], reason, seconds, measured, skipped or {})


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


# ---------------------------------------------------------------------------------------- calibration
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
    """This machine and software, as far as speed goes: attnspec and torch versions, CPU model and count."""
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
    return f"attnspec {VERSION}, torch {torch_version}, {cpu}, {os.cpu_count()} cpus"


class Calibration:
    """This machine's measured mode times (:mod:`attnspec.compiler.calibrate`), from a JSON cache file.

    ``entries`` maps ``"signature|regime|B|L"`` to ``{"seconds": {mode: s}, "skipped": {mode: why}}``.
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
              skipped: dict[str, str]) -> None:
        self.entries[self.key(signature, regime, batch, length)] = {"seconds": seconds, "skipped": skipped}

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
    seconds, skipped = entry["seconds"], entry.get("skipped", {})
    return (all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0
                for t in seconds.values())
            and isinstance(skipped, dict)
            and all(isinstance(why, str) and len(why) <= MAX_REASON_CHARS for why in skipped.values()))
