"""Staged runs (train config `stages`): attention transfer of a swapped mixer, then a low-rank fine-tune on the task,
in one run. Each stage trains what it names (its objective, its frozen parameters, its adapters) from a fresh AdamW
on its own warm-up and decay; the first stage's end is evaluated and checkpointed, the second's adapters merged at
the end; run.json records each stage and its results, the display names each as it begins; a run stopped anywhere
(within a stage, at the boundary) resumes to the uninterrupted run bit for bit; a stage that cannot be is a located
error."""

from __future__ import annotations

import fnmatch
import json

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.training.config import load_config
from tests.training.linearizing import FROZEN, LINEAR, MQAR, SETTINGS, spec as _spec, teacher  # noqa: F401 (fixture)

ADAPTED = ["blocks.*.mixer.q_proj", "blocks.*.mlp.up"]


def _stages(teacher_directory) -> dict:
    return {"init_weights": str(teacher_directory), "transfer": {"teacher": str(teacher_directory)},
            "stages": [{"objective": "transfer", "steps": 4, "lr": 3e-3, "freeze": FROZEN},
                       {"objective": "lm", "steps": 4, "lr": 1e-3, "warmup_steps": 2,
                        "lora": {"targets": ADAPTED, "rank": 2, "dropout": 0.1}}]}


def _run(teacher_directory, output=None, **flags):
    settings = {**SETTINGS, "eval_every": 3, "checkpoint_every": 1}
    return attnspec.train(_spec(LINEAR), task="mqar", task_overrides=MQAR, output=output,
                          **_stages(teacher_directory), **settings, **flags)


def test_each_stage_trains_its_objective_and_run_json_records_them(teacher, tmp_path):
    events = []
    run = _run(teacher, tmp_path / "run", on_progress=events.append)
    assert run.step == 8
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    first, second = record["stages"]
    assert (first["objective"], first["start"], first["end"], second["objective"], second["start"], second["end"]) \
        == ("transfer", 0, 4, "lm", 4, 8)
    assert first["metrics"]["objective"] > 0 and "objective" not in second["metrics"]  # a teacher in the first alone
    train = [r for r in run.history if r["split"] == "train"]
    assert [r["stage"] for r in train] == [0] * 4 + [1] * 4
    assert "transfer_mse" in train[0] and "transfer_mse" not in train[4]
    assert train[4]["lr"] == pytest.approx(1e-3 / 2)  # the second stage's own warm-up: step 1 of 2
    stages = [e for e in events if e["event"] == "stage"]
    assert [(e["index"], e["objective"], e["adapted"]) for e in stages] == [(0, "transfer", 0), (1, "lm", 4)]
    # what each stage trains is what gets gradients: the transferred mixers; then the adapters alone
    mixers = sum(p.numel() for name, p in run.model.named_parameters()
                 if any(name.startswith(f"blocks.{i}.mixer.") for i in stages[0]["transferred"])
                 and not any(fnmatch.fnmatchcase(name, pattern) for pattern in FROZEN))
    assert stages[0]["trained"] == mixers > 0
    maps = {name: p for name, p in run.model.named_parameters()
            if name.endswith(".weight") and any(fnmatch.fnmatchcase(name[:-7], t) for t in ADAPTED)}
    assert stages[1]["trained"] == sum(2 * (p.shape[0] + p.shape[1]) for p in maps.values())  # rank 2: A and B
    assert not any(".lora." in name for name in run.model.state_dict())  # merged at the end


def test_a_lora_stage_trains_its_adapters_alone_unless_lora_train_names_more(teacher, tmp_path):
    """As peft: the base model is frozen under adapters; `lora.train` (peft's modules_to_save) trains more."""
    config = _stages(teacher)
    lora = {**config["stages"][1]["lora"], "train": ["blocks.0.mixer.k_proj.*"]}
    stage = {**config["stages"][1], "lora": lora}
    events = []
    run = attnspec.train(_spec(LINEAR), task="mqar", task_overrides=MQAR, init_weights=config["init_weights"],
                         stages=[stage], on_progress=events.append, **SETTINGS)
    before, after = attnspec.load(teacher).state_dict(), run.model.state_dict()
    k_proj = after["blocks.0.mixer.k_proj.weight"]
    maps = [p for name, p in run.model.named_parameters()
            if name.endswith(".weight") and any(fnmatch.fnmatchcase(name[:-7], t) for t in ADAPTED)]
    (started,) = [e for e in events if e["event"] == "stage"]
    assert started["trained"] == k_proj.numel() + sum(2 * (p.shape[0] + p.shape[1]) for p in maps)
    assert not torch.equal(k_proj, before["blocks.0.mixer.k_proj.weight"])  # lora.train's
    for name in ("embed.weight", "final_norm.weight", "blocks.0.mixer.v_proj.weight", "blocks.0.mlp.down.weight"):
        assert torch.equal(after[name], before[name]), name  # neither adapted nor named: frozen
    with pytest.raises(SpecError, match=r"stages\[0\]\.lora\.train\[0\]"):
        attnspec.train(_spec(LINEAR), task="mqar", task_overrides=MQAR, init_weights=config["init_weights"],
                       stages=[{**stage, "lora": {**lora, "train": ["nothing.*"]}}], **SETTINGS)


def test_the_display_names_each_stage(monkeypatch):
    from attnspec.cli import display

    lines = []
    monkeypatch.setattr(display.out, "print", lambda text, **_: lines.append(text))
    display.TrainingDisplay(enabled=True).update({"event": "stage", "index": 1, "count": 2, "objective": "lm",
                                                  "start": 200, "end": 500, "lr": 1e-4, "parameters": 1000,
                                                  "trained": 40, "adapted": 8, "transferred": []})
    assert lines == ["stage 2 of 2: lm, steps 201-500, lr 0.0001, 40 trained (960 frozen), low-rank adapters on 8 "
                     "map(s)"]


@pytest.mark.parametrize("stop", [2, 4, 6], ids=["within-transfer", "at-the-boundary", "within-fine-tune"])
def test_a_staged_run_resumes_anywhere_to_the_uninterrupted_run(teacher, tmp_path, stop):
    whole = _run(teacher, tmp_path / "whole")
    _run(teacher, tmp_path / "split", stop_after=stop)
    resumed = attnspec.train(None, output=tmp_path / "split", resume=True)
    lines = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in lines if r["split"] == "train"] == whole.losses
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
    assert json.loads((tmp_path / "split" / "run.json").read_text())["stages"] == \
        json.loads((tmp_path / "whole" / "run.json").read_text())["stages"]


@pytest.mark.parametrize("change, where, words", [
    ({"stages": [{"objective": "distill", "steps": 2}]}, "stages", "no `distill` settings"),
    ({"steps": 5}, "steps", "stages' sum"),
    ({"lora": {"targets": ADAPTED}}, "lora", r"stages\[i\]\.lora"),
])
def test_a_configuration_of_stages_that_cannot_be_is_a_located_error(teacher, change, where, words):
    with pytest.raises(SpecError, match=words):
        load_config({"task": {"kind": "mqar"}, **_stages(teacher), **change})


@pytest.mark.parametrize("stage, where, words", [
    ({"objective": "lm", "steps": 2, "freeze": ["blocks.7.*"]}, "stages[1].freeze[0]", "names no parameter"),
    ({"objective": "lm", "steps": 2, "lora": {"targets": ["blocks.*.mixer.w_proj"]}}, "stages[1].lora.targets[0]",
     "names no linear map"),
])
def test_a_stage_naming_nothing_is_a_located_error_and_writes_nothing(teacher, tmp_path, stage, where, words):
    stages = _stages(teacher)
    stages["stages"][1] = stage
    with pytest.raises(SpecError) as refused:
        attnspec.train(_spec(LINEAR), task="mqar", task_overrides=MQAR, output=tmp_path / "run", **stages, **SETTINGS)
    assert where in str(refused.value) and words in str(refused.value)
    assert not (tmp_path / "run").exists()
