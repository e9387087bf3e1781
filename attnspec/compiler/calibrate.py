"""Calibration: measure each mixer's modes on this machine, so that ``mode: auto`` picks by time.

The cost model (:mod:`attnspec.compiler.plan`) is a guess from multiply-adds, bytes and sequential
steps; on a 2-core CPU it was off by orders of magnitude for some layouts (a per-channel LRU
planned quadratic ran 10x slower than recurrent). A calibration runs each valid mode of each
distinct mixer once per regime at the regime's shapes and keeps the median time:

* ``inference``: the mixer's forward without gradients at batch B and length L (a build plans at
  batch 1 and ``max_len``), on the graph path the exported programs run (not the CPU chunk kernel);
  only modes a build can export (no Python loop over positions).
* ``training``: forward and backward at the run's micro-batch and length, every mode.

Decoding has one mode (the recurrent step), so there is nothing to calibrate there.

Measurements are keyed by the mixer's structure (its spec node without ``mode``, the model width,
``max_len`` and dtype: :func:`attnspec.compiler.plan.mixer_signature`), the regime and the shapes,
and cached per machine and attnspec version in a JSON file (:mod:`attnspec.compiler.plan` reads it
without importing torch). ``attnspec explain SPEC --calibrate [--refresh]`` measures on demand;
``attnspec build`` (and ``attnspec train`` with ``planning: measured``) measure what they plan for when the
cache lacks it; training plans by the cost model alone by default, so that a run repeats on any machine.

Bounds: every mode first runs at a quarter of the length (at least ``PROBE_MIN``) and half that, and
its time at L is predicted from the quarter's by the growth measured between the two, twice over (or
the cost model's growth where that is less); one predicted over ``SLOW_FACTOR`` x the fastest is not
run at full length (recorded as skipped, with the ratio). The others run at full length, interleaved
round-robin (the machine is noisy), up to ``REPEATS`` times within ``TIME_PER_MODE``. A mode whose
estimated memory traffic is over ``MAX_BYTES`` is not run at all (a quadratic per-channel form at
L = 4096 would need gigabytes).
Training at a large batch is measured at ``MAX_MEASURED_BATCH`` and scaled linearly (time per
example is flat there).

Sanity: each mode's spread (the interquartile range of its timed runs over their median) is stored
beside its time and shown by ``explain``. A measurement where a mode's spread is over ``MAX_SPREAD``
(the machine's load changed while it ran), or where the modes' measured / estimated ratios are more
than ``MAX_DISAGREEMENT`` apart (one mode ran under load: :attr:`Measured.disagreement`), is taken
again once; if it is still so it is not stored, and the plan for that mixer comes from the cost
model until a quieter calibration.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from attnspec.compiler.calibration import Calibration, mixer_signature
from attnspec.compiler.plan import MAX_BYTES, estimated_costs, regime_modes
from attnspec.ops.linear.backends import native
from attnspec.spec.ir import Spec, iter_blocks

SLOW_FACTOR = 8.0  # a mode predicted this much slower than the fastest is not run at full length
REPEATS = 15  # timed runs per mode at most (fewer when a run is long)
TIME_PER_MODE = 0.6  # seconds of timed runs per mode at most, after the first
MAX_MEASURED_BATCH = 8
PROBE_MIN = 64  # shorter probes measure fixed overheads only
MAX_SPREAD = 0.5  # a mode whose timed runs' interquartile range is over half their median is noise-bound
MAX_DISAGREEMENT = 20.0  # modes' measured / estimated ratios this far apart: one of them was measured under load


@dataclass
class Measured:
    """One calibration entry: seconds per call for each mode that ran, and why others did not."""

    seconds: dict[str, float]
    skipped: dict[str, str]
    measured_batch: int
    spread: dict[str, float] = field(default_factory=dict)
    """Per mode, the interquartile range of the timed runs over their median (0 with fewer than 4 runs)."""

    ratios: dict[str, float] = field(default_factory=dict)
    """Per mode, its measured time over the cost model's estimate at the measured shapes."""

    @property
    def noisy(self) -> list[str]:
        """The modes measured with a spread over ``MAX_SPREAD``."""
        return [mode for mode, spread in self.spread.items() if spread > MAX_SPREAD]

    @property
    def disagreement(self) -> float:
        """The largest over the smallest of the modes' measured / estimated ratios (1 with one mode).

        The cost model is off by a factor that depends on the machine and the shapes (2-6x at the
        MQAR-Zoology sizes on a 2-core CPU) but moves little from mode to mode of one mixer (at most
        3.5x there, once per-channel decays were costed); a mode measured hundreds of times slower than
        the others relative to their estimates (3,400x was seen) ran while something else held the cores.
        """
        values = [ratio for ratio in self.ratios.values() if ratio > 0]
        return max(values) / min(values) if len(values) > 1 else 1.0

    @property
    def trusted(self) -> bool:
        """Neither noisy nor in disagreement with the cost model beyond ``MAX_DISAGREEMENT``: storable."""
        return not self.noisy and self.disagreement <= MAX_DISAGREEMENT


def calibrate_spec(spec: Spec, *, regime: str, batch: int, length: int, calibration: Calibration | None = None,
                   refresh: bool = False) -> Calibration:
    """Measure every distinct ``mode: auto`` mixer of ``spec`` in ``regime`` at (batch, length) and store it.

    Args:
        spec: a resolved spec.
        regime: ``"inference"`` or ``"training"``.
        batch, length: the regime's shapes (training: the micro-batch).
        calibration: the cache to add to (default: this machine's, loaded).
        refresh: measure again even where the cache has an entry.

    Returns:
        The calibration, saved to its file.
    """
    calibration = calibration or Calibration.load()
    seen = set()
    for index, (_, block) in enumerate(iter_blocks(spec, expand=True)):
        if block.mixer.mode != "auto":
            continue  # the spec chose; nothing to measure
        signature = mixer_signature(spec, block.mixer)
        if signature in seen or (not refresh and calibration.lookup(signature, regime, batch, length) is not None):
            continue
        seen.add(signature)
        modes = regime_modes(block.mixer, regime)
        if len(modes) < 2:
            continue  # nothing to choose
        for _ in range(2):  # a noisy measurement (the load changed while it ran) is taken once more
            measured = measure_mixer(spec, block.mixer, regime=regime, batch=batch, length=length, modes=modes,
                                     seed=spec.seed + 7919 * index)
            if measured.trusted:
                calibration.store(signature, regime, batch, length, measured.seconds, measured.skipped,
                                  measured.spread)
                break
    calibration.save()
    return calibration


def measure_mixer(spec: Spec, node, *, regime: str, batch: int, length: int, modes: tuple[str, ...],
                  seed: int = 0, skip_slow: bool = True) -> Measured:
    """Median seconds per call of ``node``'s mixer in each of ``modes`` on random inputs (B, L, d_model).

    ``training`` times forward + backward through the input and the parameters; ``inference`` the
    forward under ``torch.no_grad``. Shapes as in :func:`calibrate_spec`. ``skip_slow=False`` runs
    every mode at full length (benchmarks), except those over the memory bound.
    """
    from attnspec.nn.model import DTYPES
    from attnspec.nn.registry import build

    torch.manual_seed(seed)
    mixer = build("mixer", node, d_model=spec.d_model, max_len=spec.max_len, seed=seed)
    dtype = DTYPES[spec.dtype]
    mixer = mixer.to(dtype)
    training = regime == "training"
    measured_batch = min(batch, MAX_MEASURED_BATCH) if training else batch
    scale = batch / measured_batch
    x = torch.randn(measured_batch, length, spec.d_model, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    estimates = estimated_costs(node, length, measured_batch, training)
    skipped = {mode: f"not run: would move ~{estimates[mode].bytes / 2**30:.1f} GiB"
               for mode in modes if estimates[mode].bytes > MAX_BYTES}
    order = sorted((mode for mode in modes if mode not in skipped), key=lambda mode: estimates[mode].seconds)

    def call(mode: str, n: int) -> float:
        start = time.perf_counter()
        if training:
            inputs = x[:, :n].detach().requires_grad_(True)
            mixer(inputs, mode).square().mean().backward()
        else:
            with torch.no_grad():
                mixer(x[:, :n], mode)
        return time.perf_counter() - start

    mixer.train(training)
    # Inference is measured on the graph path: the exported programs a build writes run it (the CPU
    # chunk kernel is not in them, so that they load without attnspec). Training never uses the kernel.
    with native.disabled():
        runs = _measure(call, order, length, measured_batch, node, training, estimates, skipped, skip_slow)
    mixer.zero_grad(set_to_none=True)
    return Measured({mode: statistics.median(times) * scale for mode, times in runs.items()}, skipped, measured_batch,
                    {mode: spread(times) for mode, times in runs.items()},
                    {mode: statistics.median(times) / estimates[mode].seconds for mode, times in runs.items()})


def spread(times: list[float]) -> float:
    """The interquartile range of ``times`` over their median (0 for fewer than 4: no spread to read)."""
    if len(times) < 4:
        return 0.0
    low, _, high = statistics.quantiles(times, n=4)
    return (high - low) / statistics.median(times)


def _measure(call, order: list[str], length: int, batch: int, node, training: bool, estimates: dict, skipped: dict,
             skip_slow: bool) -> dict[str, list[float]]:
    """The timed seconds of ``call(mode, length)`` for each mode in ``order`` (interleaved runs); adds the
    modes it skips to ``skipped``."""
    # Probe at an eighth and a quarter of the length (the first call pays lazy initialisation; the faster
    # of two calls at each, so that a busy moment cannot get the fastest mode skipped as "far slower") and
    # predict the time at L by the growth from L/8 to L/4 measured twice over (two more doublings), or by
    # the cost model's growth from L/4 to L where that is less. Neither alone: fixed costs make real growth
    # slower than the model's (a quadratic form measured growing 6x where the model said 16x), and some
    # forms grow faster than any fixed cap (the delta rule's quadratic form solves an L x L triangular
    # system: 149 ms at 512, 3.5 s at 2,048 on one core, where a cap of twice linear predicted 1.2 s and
    # ran it for 4 s in every cold import of a hybrid). A mode predicted SLOW_FACTOR x slower than the best
    # prediction is not run at L.
    probe_length = min(length, max(length // 4, PROBE_MIN))
    short_length = max(probe_length // 2, 1)
    model_growth = {mode: estimates[mode].seconds / estimated_costs(node, probe_length, batch, training)[mode].seconds
                    for mode in order}
    predicted = {}
    for mode in order:
        growth = 1.0  # a probe at the full length predicts itself
        if probe_length < length:
            call(mode, short_length)
            short = min(call(mode, short_length), call(mode, short_length))
            probe = min(call(mode, probe_length), call(mode, probe_length))
            growth = min(model_growth[mode], max(probe / short, 1.0) ** 2)
        else:
            call(mode, probe_length)
            probe = min(call(mode, probe_length), call(mode, probe_length))
        predicted[mode] = probe * growth
    best = min(predicted.values()) if predicted else 0.0
    for mode in order:
        if skip_slow and predicted[mode] > SLOW_FACTOR * best:
            skipped[mode] = f"predicted {predicted[mode] / best:.0f}x slower (measured at L = {probe_length})"
    candidates = [mode for mode in order if mode not in skipped]
    runs = {mode: [call(mode, length)] for mode in candidates}
    longest = max(times[0] for times in runs.values())
    rounds = max(1, min(REPEATS, int(TIME_PER_MODE / max(longest, 1e-4))))
    for _ in range(rounds - 1):  # interleaved: a noisy moment hits every mode alike
        for mode in candidates:
            runs[mode].append(call(mode, length))
    return runs


@dataclass
class PlanCheck:
    """One mixer's plan in one regime against a fresh measurement of its modes."""

    path: str
    mixer: str
    regime: str
    chosen: str
    """The calibrated plan's mode."""
    estimated: str
    """The mode the cost model alone would choose."""
    seconds: dict[str, float]
    """This measurement's seconds per mode (modes predicted far slower are absent)."""
    skipped: dict[str, str]

    @property
    def fastest(self) -> str:
        return min(self.seconds, key=self.seconds.get)

    def ratio(self, mode: str) -> float | None:
        """``mode``'s time over the fastest's (None: not measured)."""
        return self.seconds[mode] / self.seconds[self.fastest] if mode in self.seconds else None


def check_plan(spec: Spec, *, regime: str, batch: int, length: int, calibration: Calibration,
               skip_slow: bool = True) -> list[PlanCheck]:
    """Calibrate ``spec`` into ``calibration``, plan with it, then measure every distinct ``auto``
    mixer's valid modes again: the chosen mode against the fastest of this second measurement, and
    the cost model's choice beside it (what ``mode: auto`` did before calibration)."""
    from attnspec.compiler.plan import plan_spec

    training = regime == "training"
    calibrate_spec(spec, regime=regime, batch=batch, length=length, calibration=calibration)
    plan = plan_spec(spec, length, batch=batch, training=training, calibration=calibration)
    estimated = plan_spec(spec, length, batch=batch, training=training, calibration=Calibration.empty())
    checks, seen = [], set()
    for index, (path, block) in enumerate(iter_blocks(spec, expand=True)):
        signature = mixer_signature(spec, block.mixer)
        modes = regime_modes(block.mixer, regime)
        if block.mixer.mode != "auto" or len(modes) < 2 or signature in seen:
            continue
        seen.add(signature)
        fresh = measure_mixer(spec, block.mixer, regime=regime, batch=batch, length=length, modes=modes,
                              seed=spec.seed + 7919 * index + 1, skip_slow=skip_slow)
        layer = plan.layers[index]
        checks.append(PlanCheck(layer.path, layer.mixer, regime, layer.full_mode, estimated.layers[index].full_mode,
                                fresh.seconds, fresh.skipped))
    return checks


__all__ = ["Measured", "PlanCheck", "calibrate_spec", "check_plan", "measure_mixer"]
