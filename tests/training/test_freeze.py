"""`freeze:` in the training configuration: the parameters its globs name are not trained (unchanged after the run,
outside the optimiser, recorded in run.json, counted at the start), the others are; a pattern naming nothing, or
patterns freezing everything, are located errors that leave nothing behind."""

from __future__ import annotations

import json

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from tests.training.test_train import MQAR, SPECS, TINY, _tiny_run


def _initial():
    """The model a tiny run starts from (the same spec, overrides and seed)."""
    return attnspec.build(SPECS / "softmax-transformer.yaml", *TINY, "position=learned")


def test_frozen_parameters_stay_as_they_started_and_the_rest_train(tmp_path):
    patterns = ["embed.*", "blocks.*.mixer.q_proj.*", "position.*"]
    run = _tiny_run(tmp_path / "run", freeze=patterns, steps=6, eval_every=3)
    start = _initial()
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    frozen = set(record["frozen"])
    names = {n for n, _ in start.named_parameters()}
    assert frozen == {n for n in names if n == "embed.weight" or n.startswith(("blocks.0.mixer.q_proj.", "position."))}
    assert "embed.weight" in frozen and "blocks.0.mixer.q_proj.weight" in frozen
    trained = [name for group in record["groups"] for name in group["parameters"]]
    assert not frozen & set(trained) and set(trained) | frozen == names
    after = dict(run.model.named_parameters())
    for name, parameter in start.named_parameters():
        moved = not torch.equal(parameter, after[name].detach().cpu())
        assert moved == (name not in frozen), name
    assert run.losses[-1] < run.losses[0]


def test_the_start_line_counts_the_parameters_trained(monkeypatch):
    from attnspec.cli import display

    lines = []
    monkeypatch.setattr(display.out, "print", lambda text, **_: lines.append(text))
    display.TrainingDisplay(enabled=True).update({"event": "start", "parameters": 1000, "trained": 400,
                                                  "device": "cpu", "world_size": 1, "plan": ["quadratic"],
                                                  "compiled": False, "step": 0})
    assert "training 1,000 parameters (400 trained, 600 frozen) on cpu" in lines[0]


@pytest.mark.parametrize("patterns, where, words", [
    (["blocks.9.*"], "freeze[0]", "names no parameter"),
    (["embed.*", "blocks.*.mlp.gate.*"], "freeze[1]", "names no parameter"),
    (["*"], "freeze", "freeze every parameter"),
])
def test_a_freeze_that_names_nothing_or_everything_is_a_located_error_and_writes_nothing(tmp_path, patterns, where,
                                                                                            words):
    with pytest.raises(SpecError) as refused:
        attnspec.train(SPECS / "softmax-transformer.yaml", overrides=[*TINY, "position=learned"], task="mqar",
                       task_overrides=MQAR, output=tmp_path / "run", steps=2, freeze=patterns)
    assert where in str(refused.value) and words in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_the_cli_freezes_by_flag_and_counts_it(tmp_path):
    import subprocess
    import sys

    args = ["train", str(SPECS / "softmax-transformer.yaml"), *[a for o in TINY + ["position=learned"]
                                                                  for a in ("--set", o)],
            "--task", "mqar", *[a for o in MQAR for a in ("--task-set", o)], "--steps", "2", "--eval-every", "0",
            "--test-examples", "8", "--batch", "4", "--freeze", "embed.*", "--freeze", "blocks.*.mlp.*",
            "-o", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "attnspec", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert " trained, " in done.stdout and " frozen) on " in done.stdout
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["config"]["freeze"] == ["embed.*", "blocks.*.mlp.*"] and "embed.weight" in record["frozen"]
