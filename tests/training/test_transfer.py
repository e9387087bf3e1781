"""Attention transfer (train config `transfer`): a softmax teacher trained here, a student whose second block's
attention is swapped for linear attention (the rest started from the teacher's weights and frozen). The first
step's logged objective equals the mean squared difference of the two mixers computed by hand from forward hooks on
the teacher (its own input to the swapped block); training lowers it and moves the new mixer alone; a transformers
checkpoint teaches as a build does; a transfer with nothing to transfer, blocks that do not line up or a wrong block
are located errors that leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnspec
from attnspec.errors import SpecError
from attnspec.training.config import load_config
from attnspec.training.rundir import load_trained
from tests.training.linearizing import FROZEN, LINEAR, MQAR, SETTINGS, spec as _spec, teacher  # noqa: F401 (fixture)



def _student(teacher: Path, steps: int, output=None, second=LINEAR, **transfer):
    return attnspec.train(_spec(second), task="mqar", task_overrides=MQAR, output=output, steps=steps,
                          init_weights=str(teacher), freeze=FROZEN, transfer={"teacher": str(teacher), **transfer},
                          **SETTINGS)


def test_the_first_step_is_the_mixers_difference_on_the_teachers_input_computed_by_hand(teacher, tmp_path):
    run = _student(teacher, 1, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["transfer"] == {"blocks": [1]}
    student = attnspec.build(_spec(LINEAR)).train()
    trained_teacher = load_trained(teacher)
    student.load_state_dict({**student.state_dict(), **{k: v for k, v in trained_teacher.state_dict().items()
                                                        if k in student.state_dict()}})
    inputs, _ = load_config(task="mqar", task_overrides=MQAR).task.batch("train", 0, 8, 0)
    seen = {}
    mixer = trained_teacher.blocks[1].mixer
    mixer.register_forward_hook(lambda module, args, out: seen.update(h=args[0], y=out))
    with torch.no_grad():
        trained_teacher(inputs)
        expected = F.mse_loss(student.blocks[1].mixer(seen["h"]), seen["y"])
    assert run.history[0]["transfer_mse"] == pytest.approx(float(expected), rel=1e-5)
    assert run.history[0]["loss"] == pytest.approx(float(expected), rel=1e-5)


def test_transfer_lowers_the_difference_and_trains_the_new_mixer_alone(teacher, tmp_path):
    run = _student(teacher, 40, tmp_path / "run")
    mse = [record["transfer_mse"] for record in run.history if "transfer_mse" in record]
    assert mse[-1] < 0.75 * mse[0]  # measured 0.53 of it at 40 steps
    start = load_trained(teacher).state_dict()
    for name, tensor in run.model.state_dict().items():
        if name in start:  # what the teacher gave is as it was, but the swapped mixer (its q/k/v/o too)
            moved = not torch.equal(tensor, start[name])
            assert moved == name.startswith("blocks.1.mixer."), name


def test_an_imported_transformers_model_teaches_and_its_checkpoint_says_to_import_it(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnspec.interop.convert import import_hf
    from attnspec.spec import spec_to_data

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
                     ).save_pretrained(tmp_path / "llama")
    import_hf(tmp_path / "llama", tmp_path / "build", compile_check=False, calibrate=False, check=False)
    data = spec_to_data(attnspec.load(tmp_path / "build").spec)
    layers = data["layers"]
    blocks = [dict(block) for block in (layers[0]["layers"] * layers[0]["repeat"] if "repeat" in layers[0]
                                        else layers)]
    blocks[1]["mixer"] = {**LINEAR, "position": blocks[1]["mixer"].get("position", {"kind": "rope"})}
    run = attnspec.train({**data, "layers": blocks}, task="mqar", task_overrides=MQAR, steps=3,
                         transfer={"teacher": str(tmp_path / "build")}, **SETTINGS)
    assert run.history[0]["transfer_mse"] > 0
    with pytest.raises(SpecError, match="import it first"):
        attnspec.train({**data, "layers": blocks}, task="mqar", task_overrides=MQAR, steps=3,
                       transfer={"teacher": str(tmp_path / "llama")}, **SETTINGS)


@pytest.mark.parametrize("second, transfer, blocks, where, words", [
    (None, {}, 2, "transfer.blocks", "no block to transfer"),
    (LINEAR, {}, 3, "transfer.teacher", "do not line up"),
    (LINEAR, {"blocks": [2]}, 2, "transfer.blocks[0]", "is not a block"),
    (LINEAR, {"blocks": [1, 1]}, 2, "transfer.blocks[1]", "named twice"),
])
def test_a_transfer_that_cannot_be_is_a_located_error_and_writes_nothing(teacher, tmp_path, second, transfer, blocks,
                                                                           where, words):
    spec = _spec(second, blocks)
    with pytest.raises(SpecError) as refused:
        attnspec.train(spec, task="mqar", task_overrides=MQAR, output=tmp_path / "run", steps=2,
                       transfer={"teacher": str(teacher), **transfer}, **SETTINGS)
    assert where in str(refused.value) and words in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_transfer_and_distill_together_is_a_located_error(teacher):
    with pytest.raises(SpecError, match="one objective"):
        load_config({"task": {"kind": "mqar"}, "transfer": {"teacher": str(teacher)},
                     "distill": {"teacher": str(teacher)}})


@pytest.mark.slow  # two compiles of the objective (teacher pass and the new mixer in one graph)
def test_the_compiled_objective_equals_the_eager_one(teacher):
    runs = [attnspec.train(_spec(LINEAR), task="mqar", task_overrides=MQAR, steps=3, init_weights=str(teacher),
                           freeze=FROZEN, transfer={"teacher": str(teacher)}, compile=compile, **SETTINGS)
            for compile in ("off", "on")]
    eager, compiled = ([record["transfer_mse"] for record in run.history if "transfer_mse" in record] for run in runs)
    assert compiled == pytest.approx(eager, rel=1e-5)  # float32 rounding of fused kernels: measured 1e-7
