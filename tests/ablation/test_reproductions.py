"""The shipped reproductions (``ablations/*.yaml``, docs/reproductions.md) at CI size: every sweep
file plans (every run validated as `attnspec train` would), and runs end to end at two steps per run,
one seed and the first point of each grid, followed by the diagnostics its documentation names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import attnspec
from attnspec.ablation.ablate import plan_sweep

pytestmark = pytest.mark.slow  # every shipped sweep run end to end at CI size

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "ablations").glob("*.yaml"))


def ci_sized(path: Path) -> dict:
    """The sweep with its base made absolute, 2 steps per run, one seed, one lr and the first grid point."""
    data = yaml.safe_load(path.read_text())
    if isinstance(data["base"], str):
        data["base"] = str((path.parent / data["base"]).resolve())
    data["seeds"], data["lr"] = data["seeds"][:1], data["lr"][:1]
    data["train"] = {**data["train"], "steps": 2, "batch_size": 4, "eval_every": 0, "test_examples": 4,
                     "warmup_steps": 0}
    for task in data["tasks"]:
        task["grid"] = {key: values[:1] for key, values in task.get("grid", {}).items()}
    return data


def test_every_shipped_sweep_is_documented_and_plans():
    documented = (ROOT / "docs" / "reproductions.md").read_text()
    assert len(SWEEPS) >= 6
    for path in SWEEPS:
        plan = plan_sweep(path)
        assert plan.runs, path.name
        assert f"ablations/{path.name}" in documented or path.name == "mqar-mixers.yaml", path.name


@pytest.mark.parametrize("path", SWEEPS, ids=[path.stem for path in SWEEPS])
def test_shipped_sweep_runs_at_ci_size(path: Path, tmp_path: Path):
    outcome = attnspec.ablate(ci_sized(path), tmp_path / "runs", workers=2, threads=1)
    assert outcome.ran > 0 and not outcome.failed, outcome.failed
    assert (tmp_path / "runs" / "report" / "results.csv").is_file()
    command = [sys.executable, "-m", "attnspec", "diagnose"]
    if path.stem == "rank-collapse-paths":
        runs = yaml.safe_load((tmp_path / "runs" / "sweep.json").read_text())["runs"]
        sort = next(run["key"] for run in runs if run["task"] == "sort")
        done = subprocess.run([*command, "paths", str(tmp_path / "runs" / "runs" / sort), "-o", str(tmp_path / "d"),
                               "--samples", "8", "--repeats", "1"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    if path.stem == "gateloop-memory-horizon":
        done = subprocess.run([*command, "span", str(tmp_path / "runs"), "-o", str(tmp_path / "d"), "--samples", "4"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
