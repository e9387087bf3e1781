"""The measured plan: calibration cache, planning by measurements, and the plan against a fresh
measurement on this machine (a ratio measured inside the test, never a wall-clock bound)."""

from __future__ import annotations

import json

import pytest

from attnspec.compiler.calibrate import check_plan
from attnspec.compiler.calibration import Calibration, calibration_path, mixer_signature
from attnspec.compiler.plan import plan_spec
from attnspec.spec.walk import iter_blocks
from attnspec.compiler.lower import as_spec
from tests.conftest import SPECS

SPEC_DIR = SPECS[0].parent
AUTO_SPECS = [path for path in SPECS
              if len({mode for _, b in iter_blocks(as_spec(path), expand=True) for mode in b.mixer.modes()}) > 1]


def _first_mixer(spec):
    return iter_blocks(spec, expand=True)[0][1].mixer


@pytest.mark.slow
@pytest.mark.parametrize("regime, batch, length", [("inference", 1, 256), ("training", 4, 128)])
@pytest.mark.parametrize("path", AUTO_SPECS, ids=lambda p: p.stem)
def test_chosen_mode_is_within_1_5x_of_the_fastest_measured(path, regime, batch, length, tmp_path):
    """Shipped specs at their widths (CI lengths): calibrate, plan, then measure every valid mode
    again; the chosen mode's time over the fastest's must be <= 1.5. Modes predicted over 8x slower
    are not re-run (the cost model's growth in L decides that, from a measurement at L / 4).

    The machine is shared (CI runs other work beside it), and a busy moment during calibration can
    make the plan choose from a distorted measurement, so a ratio over 1.5 is tried again from
    scratch, up to ATTEMPTS times: a new calibration, a new plan, a new measurement. It fails only
    if every attempt measures the plan's choice over 1.5x the fastest (a wrong plan does every time)."""
    spec = as_spec(path)
    failing: dict[str, list] = {}
    for attempt in range(ATTEMPTS):
        calibration = Calibration(tmp_path / f"calibration-{attempt}.json", {}, "test")
        checks = check_plan(spec, regime=regime, batch=batch, length=length, calibration=calibration)
        failing = {check.path: [*failing.get(check.path, []), check] for check in checks
                   if (check.ratio(check.chosen) or float("inf")) > 1.5 and (attempt == 0 or check.path in failing)}
        if not failing:
            return
    raise AssertionError(f"{path.stem} {regime}: the plan's choice measured over 1.5x the fastest mode in "
                         f"{ATTEMPTS} independent attempts: {failing}")


ATTEMPTS = 3


def test_the_plan_follows_measurements_and_the_cost_model_fills_gaps(tmp_path):
    spec = as_spec(SPEC_DIR / "linear-elu.yaml")
    signature = mixer_signature(spec, _first_mixer(spec))
    calibration = Calibration(tmp_path / "c.json", {}, "test")
    assert plan_spec(spec, 8192, calibration=calibration).full_modes[0] == "chunk"  # the estimate
    calibration.store(signature, "inference", 1, 8192, {"chunk": 2.0, "scan": 3.0, "quadratic": 1.0}, {})
    plan = plan_spec(spec, 8192, calibration=calibration)
    assert plan.full_modes == ["quadratic"] * 4
    assert "fastest measured" in plan.layers[0].reason and plan.layers[0].measured["quadratic"] == 1.0
    assert plan.layers[0].seconds == 1.0  # what sweep estimates add up: the measurement, not the estimate
    # another regime or length has no measurement: estimated
    assert "estimate" in plan_spec(spec, 4096, calibration=calibration).layers[0].reason
    # a forced mode is not overridden by measurements
    forced = as_spec(SPEC_DIR / "linear-elu.yaml", ["layers[0].layers[0].mixer.mode=chunk"])
    calibration.store(mixer_signature(forced, _first_mixer(forced)), "inference", 1, 8192,
                      {"chunk": 2.0, "scan": 3.0, "quadratic": 1.0}, {})
    assert plan_spec(forced, 8192, calibration=calibration).full_modes == ["chunk"] * 4
    # a mode the calibration did not run (predicted far slower) does not block the measured choice
    calibration.store(signature, "inference", 1, 8192, {"chunk": 2.0, "scan": 3.0}, {"quadratic": "predicted 9x"})
    assert plan_spec(spec, 8192, calibration=calibration).full_modes[0] == "chunk"


def test_calibration_cache_is_per_machine_merged_and_survives_damage(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    path = calibration_path()
    assert path == tmp_path / "cache" / "calibration.json"
    first = Calibration.load()
    first.store("sig", "training", 8, 64, {"chunk": 1.0, "recurrent": 0.5}, {})
    first.save()
    second = Calibration.load()  # another process, same machine: sees it and adds its own
    assert second.lookup("sig", "training", 8, 64)["seconds"] == {"chunk": 1.0, "recurrent": 0.5}
    Calibration(path, {Calibration.key("other", "inference", 1, 8): {"seconds": {"scan": 1.0}, "skipped": {}}},
                second.machine).save()
    merged = Calibration.load()
    assert merged.lookup("sig", "training", 8, 64) and merged.lookup("other", "inference", 1, 8)
    data = json.loads(path.read_text())
    data["machines"]["another machine"] = {}
    path.write_text(json.dumps(data))
    assert Calibration.load().lookup("sig", "training", 8, 64)  # other machines' entries do not interfere
    bad_entries = {"a": {"seconds": {"chunk": "fast"}}, "b": {"seconds": {"chunk": float("nan")}}, "c": [],
                   "d": {"seconds": {"chunk": 1.0}, "skipped": {"scan": 3}}, "e": {"seconds": {"chunk": True}}}
    for damage in ("{not json", json.dumps({"format": 99, "machines": {}}), json.dumps({"format": 1, "machines": 3}),
                   json.dumps({"format": 1, "machines": {second.machine: bad_entries}}).replace("NaN", "NaN")):
        path.write_text(damage)
        assert Calibration.load().entries == {}  # a damaged cache is empty, never an error
    Calibration.load().save()
    assert json.loads(path.read_text())["format"] == 1  # and is rewritten on the next save
    assert not list(path.parent.glob(".*.tmp"))


def test_built_is_marked_constant_exactly_as_torch_would():
    """attnspec marks ``native.built`` without importing torch._dynamo (start-up); the marker must be
    the one torch's decorator sets."""
    import torch._dynamo

    from attnspec.ops.linear.backends import native

    marked = torch._dynamo.assume_constant_result(lambda: True)
    assert set(vars(marked)) == {"_dynamo_marked_constant"} and native.built._dynamo_marked_constant is True


def test_a_noisy_measurement_is_taken_again_and_never_stored(tmp_path, monkeypatch):
    """A mode whose timed runs spread over MAX_SPREAD (interquartile range / median: the load changed while
    it ran) is measured once more; still noisy, nothing is stored and the plan comes from the cost model.
    A quiet one is stored with its spread, which the plan carries for `explain`."""
    from attnspec.compiler import calibrate

    spec = as_spec(SPEC_DIR / "linear-elu.yaml")
    attempts = []

    def fake(spread):
        def measure(*args, **kwargs):
            attempts.append(spread)
            return calibrate.Measured({"chunk": 1.0, "scan": 2.0}, {}, 1, {"chunk": spread, "scan": 0.1})
        return measure

    monkeypatch.setattr(calibrate, "measure_mixer", fake(0.9))
    calibration = calibrate.calibrate_spec(spec, regime="inference", batch=1, length=64,
                                           calibration=Calibration(tmp_path / "c.json", {}, "test"))
    assert attempts == [0.9, 0.9] and calibration.entries == {}
    assert "not calibrated" in plan_spec(spec, 64, calibration=calibration).layers[0].reason
    monkeypatch.setattr(calibrate, "measure_mixer", fake(0.2))
    calibration = calibrate.calibrate_spec(spec, regime="inference", batch=1, length=64, calibration=calibration)
    layer = plan_spec(spec, 64, calibration=calibration).layers[0]
    assert layer.measured == {"chunk": 1.0, "scan": 2.0} and layer.spread == {"chunk": 0.2, "scan": 0.1}


def test_a_measurement_that_disagrees_with_the_cost_model_across_modes_is_not_stored(tmp_path, monkeypatch):
    """Issue 38: a mode whose measured / estimated ratio is over MAX_DISAGREEMENT times another mode's (it
    ran under load: 3,400x was seen) is measured once more; still so, nothing is stored. Ratios a
    machine-wide factor apart (every mode 5x its estimate) are stored."""
    from attnspec.compiler import calibrate

    spec = as_spec(SPEC_DIR / "linear-elu.yaml")
    attempts = []

    def fake(ratio):
        def measure(*args, **kwargs):
            attempts.append(ratio)
            return calibrate.Measured({"chunk": 1.0, "scan": 2.0}, {}, 1, {"chunk": 0.1, "scan": 0.1},
                                      {"chunk": 5.0, "scan": ratio})
        return measure

    assert calibrate.Measured({}, {}, 1, {}, {"chunk": 5.0, "scan": 3400.0}).disagreement == 680.0
    monkeypatch.setattr(calibrate, "measure_mixer", fake(3400.0))
    calibration = calibrate.calibrate_spec(spec, regime="inference", batch=1, length=64,
                                           calibration=Calibration(tmp_path / "c.json", {}, "test"))
    assert attempts == [3400.0, 3400.0] and calibration.entries == {}
    monkeypatch.setattr(calibrate, "measure_mixer", fake(6.0))
    calibration = calibrate.calibrate_spec(spec, regime="inference", batch=1, length=64, calibration=calibration)
    assert plan_spec(spec, 64, calibration=calibration).layers[0].measured == {"chunk": 1.0, "scan": 2.0}


def test_spread_is_the_interquartile_range_over_the_median():
    from attnspec.compiler.calibrate import spread

    assert spread([1.0, 1.0, 1.0]) == 0.0  # too few runs to read a spread
    assert spread([1.0, 1.0, 1.0, 1.0, 1.0]) == 0.0
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.5 - 1.5) / 3.0)


def test_a_mode_growing_faster_than_its_probe_suggests_is_predicted_by_the_growth_it_showed():
    """The probe at L/4 predicts a mode's time at L by the growth measured from L/8 to L/4, twice over, or
    the cost model's where that is less. Timings here are the delta rule's modes measured on one core
    (2026-11-28: chunk 17.5, 33.2, 118 ms and quadratic 38.5, 149, 3,500 ms at 256, 512, 2,048 tokens, as
    power laws through them): the quadratic form, 30x slower at 2,048, is skipped without being run
    there. A cap of twice linear growth predicted it 7x slower, under SLOW_FACTOR, and ran it for 4 s in
    every cold import of a hybrid. A mode whose fixed cost dominates its probes is never predicted
    slower than it is."""
    from attnspec.compiler import calibrate
    from attnspec.compiler.plan import estimated_costs

    node = _first_mixer(as_spec(SPEC_DIR / "gated-deltanet.yaml"))
    length = 2048
    laws = {"chunk": lambda n: 33.2e-3 * (n / 512) ** 0.91, "quadratic": lambda n: 149e-3 * (n / 512) ** 2.28}
    calls = []

    def call(mode, n):
        calls.append((mode, n))
        return laws[mode](n)

    estimates = estimated_costs(node, length, 1, False)
    order = sorted(laws, key=lambda mode: estimates[mode].seconds)
    skipped = {}
    runs = calibrate._measure(call, order, length, 1, node, False, estimates, skipped, True)
    assert set(runs) == {"chunk"} and skipped["quadratic"].startswith("predicted 3")  # 3,500 / 118 ms
    assert ("quadratic", length) not in calls and {n for _, n in calls} == {256, 512, length}

    laws = {"chunk": lambda n: 0.05 + 1e-8 * n, "quadratic": lambda n: 0.05 + 1e-9 * n * n}  # fixed costs first
    skipped, calls[:] = {}, []
    runs = calibrate._measure(call, order, length, 1, node, False, estimates, skipped, True)
    assert set(runs) == {"chunk", "quadratic"} and skipped == {}
