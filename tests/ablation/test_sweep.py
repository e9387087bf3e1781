"""Sweep files: strict validation with located errors, expansion into keyed runs, each variant's
differences from the base, the JSON Schema, and ``attnspec ablate --dry-run``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from attnspec.ablation.ablate import plan_sweep
from attnspec.ablation.sweep import expand, load_sweep, resolve_variants, sweep_json_schema_text
from attnspec.errors import SpecError
from tests.ablation.sweeps import BASE, ROOT, sweep, write_sweep

ABLATIONS = sorted((ROOT / "ablations").glob("*.yaml"))


def _errors(source) -> str:
    with pytest.raises(SpecError) as error:
        expand(load_sweep(source))
    return str(error.value)


def test_expansion_is_variants_x_points_x_seeds_x_lrs_with_content_keys():
    data = sweep(seeds=[0, 1], lr=[0.001, 0.003], grid={"d_model": [16, 32]},
                 tasks=[{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32},
                         "grid": {"num_kv_pairs": [1, 2, 3]}}])
    runs = expand(load_sweep(data))
    assert len(runs) == 2 * 2 * 3 * 2 * 2 and len({run.key for run in runs}) == len(runs)
    assert {run.variant for run in runs} == {"softmax[d_model=16]", "softmax[d_model=32]", "linear[d_model=16]",
                                             "linear[d_model=32]"}
    # the key is the content: renaming a variant keeps every key, changing a value changes it
    renamed = sweep(seeds=[0, 1], lr=[0.001, 0.003], grid={"d_model": [16, 32]}, tasks=data["tasks"],
                    variants={"softmax-renamed": {}, "linear": data["variants"]["linear"]})
    assert {run.key for run in expand(load_sweep(renamed))} == {run.key for run in runs}
    first = runs[0]
    assert first.spec_data["seed"] == first.seed and first.config_data["seed"] == first.seed
    assert first.spec_data["name"] == first.variant  # each run is named after its variant, not the base spec
    assert first.config_data["lr"] == first.lr and first.config_data["task"]["num_kv_pairs"] == 1


def test_run_keys_are_stable_across_releases():
    """A run's key names its directory, so a changed key orphans every finished run of every user's
    sweep directory (`attnspec ablate` would train them all again). Keys hash the resolved spec and
    training configuration without the values at their defaults: adding a field whose default keeps
    the old behaviour changes nothing here. If this fails, either a default leaked into the key (fix
    that) or the computation of a run really changed (then bump KEY_FORMAT and say so); editing
    specs/softmax-transformer.yaml or the toy sweep changes these keys legitimately."""
    assert [run.key for run in expand(load_sweep(sweep()))] == ["4c7b878cd5f81adf", "9a061c60afe2c792"]


def test_each_variant_lists_exactly_the_fields_it_changes():
    loaded = load_sweep(sweep(variants={"base": {}, "heads": {"blocks[*].mixer.heads": 4},
                                        "same": {"blocks[*].mixer.heads": 2}}))
    variants = {variant.name: variant for variant in resolve_variants(loaded)}
    assert variants["base"].differences == [] and variants["same"].differences == []
    changed = {path.rsplit(".", 1)[-1]: (old, new) for path, old, new in variants["heads"].differences}
    assert changed == {"heads": (2, 4), "d_qk": (8, 4), "d_v": (8, 4), "scale": (8 ** -0.5, 0.5)}


def test_variants_that_resolve_to_one_model_share_their_runs_and_are_reported():
    plan = plan_sweep(sweep(variants={"a": {}, "b": {"blocks[*].mixer.heads": 2}}))
    assert len(plan.runs) == 2 and len(plan.unique_runs) == 1 and plan.duplicates() == [("a", "b")]


@pytest.mark.parametrize("change, located, words", [
    ({"variants": {"bad": {"blocks[*].mixer.heads": 0}}}, ":4:", "must be greater than 0"),
    ({"variants": {"bad": {"blocks[99].mixer.heads": 2}}}, ":4:", "matches nothing"),
    ({"grid": {"blocks[*].mixer.kind": ["softmax", "nope"]}}, ":5:", "unknown kind 'nope'"),
    ({"tasks": [{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32}, "grid": {"pairs": [1]}}]}, ":6:",
     "'pairs' is not a parameter of the mqar task"),
    ({"tasks": [{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32}, "grid": {"seq_len": [16, 64]}}]}, ":6:",
     "seq_len = 64 is over the spec's max_len = 16"),
    ({"tasks": [{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 64}}]}, ":6:", "uses 64 token ids"),
    ({"tasks": [{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32}, "difficulty": "seq_len"}]}, ":6:",
     "difficulty axis 'seq_len' must be one of this task's grid parameters"),
    ({"train": {"steps": 0}}, ":9:", "train.steps: must be greater than 0"),
    ({"train": {"stepz": 10}}, ":9:", "unknown key 'stepz'"),
    ({"seeds": [0, 1, 2], "lr": [0.1, 0.2], "max_runs": 5}, ":10:", "expands to 6 runs, over max_runs = 5"),
])
def test_problems_are_located_in_the_sweep_file(tmp_path: Path, change, located, words):
    base = {"name": "t", "base": BASE, "set": {"d_model": 16, "max_len": 16, "input.vocab_size": 32}}
    body = {"variants": {"base": {}}, "grid": {}, "tasks": [{"task": {"kind": "mqar", "seq_len": 16,
                                                                      "vocab_size": 32}}],
            "seeds": [0], "lr": [0.001], "train": {"steps": 5}, "max_runs": 100}
    body.update(change)
    lines = [f"{key}: {json.dumps(value)}" for key, value in {**base, **body}.items()]
    # one top-level key per line: name 1, base 2, set 3, variants 4, grid 5, tasks 6, seeds 7, lr 8, train 9
    (tmp_path / "s.yaml").write_text("\n".join(lines) + "\n")
    message = _errors(tmp_path / "s.yaml")
    assert f"s.yaml{located}" in message and words in message, message


def test_unknown_keys_and_a_missing_base_are_located(tmp_path: Path):
    (tmp_path / "s.yaml").write_text("name: t\nbase: nope.yaml\nvariantz: {}\ntasks: [{task: mqar}]\n")
    message = _errors(tmp_path / "s.yaml")
    assert "s.yaml:3:1" in message and "unknown key 'variantz'" in message
    (tmp_path / "s.yaml").write_text("name: t\nbase: nope.yaml\ntasks: [{task: mqar}]\n")
    message = _errors(tmp_path / "s.yaml")
    assert "s.yaml:2:7" in message and "no such file" in message


def test_schema_is_committed_and_the_shipped_sweeps_are_valid():
    assert (ROOT / "schema" / "sweep.schema.json").read_text() == sweep_json_schema_text(), \
        "run `attnspec schema --sweep -o schema/sweep.schema.json`"
    validator = jsonschema.Draft7Validator(json.loads(sweep_json_schema_text()))
    assert ABLATIONS, "ablations/ ships at least one sweep"
    for path in ABLATIONS:
        data = yaml.safe_load(path.read_text())
        assert not list(validator.iter_errors(data)), path
        assert expand(load_sweep(path)), path
    assert list(validator.iter_errors({"name": "x", "base": "b.yaml", "tasks": [{"task": "mqar"}], "seedz": [1]}))


def test_dry_run_validates_everything_and_lists_runs_and_differences(tmp_path: Path):
    path = write_sweep(tmp_path / "s.yaml", seeds=[0, 1])
    result = subprocess.run([sys.executable, "-m", "attnspec", "ablate", str(path), "--dry-run"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "4 runs (4 distinct)" in text and "variant softmax: the base spec" in text
    assert "mixer.kind: 'softmax' -> 'linear'" in text and "mixer.feature_map.kind: (absent) -> 'elu1'" in text
    # a field only one kind has, at its default there (softmax's sinks, window, softcap), is no difference
    assert "sinks" not in text and "window" not in text and "softcap" not in text
    assert "state size" in text and "FLOPs / run" in text and "4 run(s) to do" in text
    assert not (tmp_path / "runs").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("heads: 2", "heads: -2"))
    result = subprocess.run([sys.executable, "-m", "attnspec", "ablate", str(bad), "--dry-run"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "bad.yaml:" in result.stderr and "must be greater than 0" in result.stderr


def test_a_sweep_text_with_a_relative_base_resolves_next_to_the_file(tmp_path: Path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "base.yaml").write_text(Path(BASE).read_text())
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: rel
        base: specs/base.yaml
        set: {d_model: 16, max_len: 16, input.vocab_size: 32}
        tasks: [{task: {kind: mqar, seq_len: 16, vocab_size: 32}}]
        """))
    (run,) = expand(load_sweep(tmp_path / "s.yaml"))
    assert run.spec.d_model == 16 and run.variant == "base"
