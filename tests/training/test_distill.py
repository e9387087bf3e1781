"""Distillation (train config `distill`): a softmax teacher trained here, a linear student trained against
it. The first step's logged terms equal the objective computed by hand in plain PyTorch from the same
batch, the student's initial weights and the teacher's (KL at temperature T times T², cross-entropy,
block-output matching); training lowers the KL; a teacher that cannot be matched is a located error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnspec
from attnspec.errors import SpecError
from attnspec.training.config import load_config
from attnspec.training.rundir import load_trained
from attnspec.training.tasks import IGNORE

SPECS = Path(__file__).resolve().parents[2] / "specs"
TINY = ["d_model=16", "layers[0].repeat=1", "max_len=16", "input.vocab_size=32", "position=learned"]
MQAR = ["seq_len=16", "vocab_size=32", "num_kv_pairs=2"]
SETTINGS = {"batch_size": 8, "eval_every": 0, "test_examples": 8, "lr": 3e-3}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("teacher") / "run"
    attnspec.train(SPECS / "softmax-transformer.yaml", overrides=TINY, task="mqar", task_overrides=MQAR,
                   output=directory, steps=30, **SETTINGS)
    return directory


def _student(teacher: Path, steps: int, output=None, spec: str = "linear-elu", **distill):
    return attnspec.train(SPECS / f"{spec}.yaml", overrides=TINY, task="mqar", task_overrides=MQAR, output=output,
                          steps=steps, distill={"teacher": str(teacher), **distill}, **SETTINGS)


def test_the_first_step_is_the_objective_computed_by_hand(teacher):
    distill = {"temperature": 2.0, "weight": 0.7, "hidden": 0.5}
    run = _student(teacher, 1, **distill)
    first = run.history[0]
    # by hand: the student's initial weights, the teacher's, the same first batch
    student = attnspec.build(SPECS / "linear-elu.yaml", *TINY).train()
    trained_teacher = load_trained(teacher)
    task = load_config(task="mqar", task_overrides=MQAR).task
    inputs, targets = task.batch("train", 0, 8, 0)
    outputs = {"s": [], "t": []}
    for key, model in (("s", student), ("t", trained_teacher)):
        for block in model.blocks:
            block.register_forward_hook(lambda m, a, out, key=key: outputs[key].append(out))
    with torch.no_grad():
        logits, wanted = student(inputs), trained_teacher(inputs)
    answer = targets != IGNORE
    n = int(answer.sum())
    ce = F.cross_entropy(logits[answer], targets[answer], reduction="sum") / n
    p_teacher = F.softmax(wanted[answer] / 2.0, -1)
    kl = (p_teacher * (p_teacher.log() - F.log_softmax(logits[answer] / 2.0, -1))).sum() * 4.0 / n
    hidden = sum(((s - t) ** 2).mean() for s, t in zip(outputs["s"], outputs["t"]))
    assert first["distill_ce"] == pytest.approx(float(ce), rel=1e-5)
    assert first["distill_kl"] == pytest.approx(float(kl), rel=1e-5)
    assert first["distill_hidden"] == pytest.approx(float(hidden), rel=1e-5)
    assert first["loss"] == pytest.approx(float(0.3 * ce + 0.7 * kl + 0.5 * hidden), rel=1e-5)


@pytest.mark.slow  # compiles the student's and the teacher's forward into one graph (about 30 s here)
def test_a_compiled_distillation_takes_the_steps_the_eager_one_takes(teacher):
    """`compile: on`: the whole objective (student, teacher, block matching) is one fullgraph compiled
    function; three steps of it log the terms the eager run logs and end at its weights (float32; 1e-5
    relative: the compiled kernels sum in another order)."""
    distill = {"temperature": 2.0, "weight": 0.5, "hidden": 0.5}
    eager = _student(teacher, 3, **distill)
    compiled = attnspec.train(SPECS / "linear-elu.yaml", overrides=TINY, task="mqar", task_overrides=MQAR, steps=3,
                              distill={"teacher": str(teacher), **distill}, compile="on", **SETTINGS)
    steps = [[record for record in run.history if record["split"] == "train"] for run in (compiled, eager)]
    assert len(steps[0]) == len(steps[1]) == 3
    for mine, theirs in zip(*steps):
        for name in ("loss", "distill_ce", "distill_kl", "distill_hidden"):
            assert mine[name] == pytest.approx(theirs[name], rel=1e-5), name
    for (name, mine), theirs in zip(compiled.model.state_dict().items(), eager.model.state_dict().values()):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-6), name


def test_distillation_lowers_the_kl_to_the_teacher(teacher, tmp_path):
    run = _student(teacher, 25, output=tmp_path / "student", temperature=1.0, weight=1.0)
    kls = [record["distill_kl"] for record in run.history if "distill_kl" in record]
    assert len(kls) == 25 and sum(kls[-5:]) / 5 < 0.8 * sum(kls[:5]) / 5
    assert (tmp_path / "student" / "metrics.jsonl").read_text().count("distill_kl") == 25


def test_a_distillation_reports_the_objective_and_the_teacher_on_held_out_answers(teacher, tmp_path):
    """The run's evaluation gives, on the test set's answer positions, the objective trained, the teacher's
    perplexity and accuracy, the KL from teacher to student and their top-1 agreement: each equal to the same
    numbers computed here in plain PyTorch from the two final models."""
    run = _student(teacher, 3, output=tmp_path / "student", temperature=2.0, weight=0.7)
    config = load_config(None, task="mqar", task_overrides=MQAR, steps=3, **SETTINGS)
    inputs, targets = config.task.batch("test", 0, config.test_examples, config.seed)
    mask = targets != IGNORE
    with torch.no_grad():
        ours, theirs = run.model.eval()(inputs).double(), load_trained(teacher)(inputs).double()
    ours_at, theirs_at, wanted = ours[mask], theirs[mask], targets[mask]
    n = int(mask.sum())
    ce = F.cross_entropy(ours_at, wanted, reduction="sum")
    kl_t = F.kl_div((ours_at / 2).log_softmax(-1), (theirs_at / 2).log_softmax(-1), log_target=True,
                    reduction="sum") * 4
    expected = {"objective": float(0.3 * ce + 0.7 * kl_t) / n,
                "teacher_perplexity": float(torch.exp(F.cross_entropy(theirs_at, wanted))),
                "teacher_accuracy": float((theirs_at.argmax(-1) == wanted).double().mean()),
                "kl_to_teacher": float(F.kl_div(ours_at.log_softmax(-1), theirs_at.log_softmax(-1), log_target=True,
                                                reduction="sum")) / n,
                "top1_agreement": float((ours_at.argmax(-1) == theirs_at.argmax(-1)).double().mean())}
    for name, value in expected.items():  # float32 evaluation against float64 here
        assert run.metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert 0 <= run.metrics["top1_agreement"] <= 1 and run.metrics["kl_to_teacher"] >= 0


def test_the_console_says_what_init_weights_loaded_initialised_and_ignored(teacher, tmp_path):
    """The start of a run from `init_weights` carries its fit (as run.json records it), and the training
    display prints it the way a build's summary does."""
    from attnspec.cli.display import TrainingDisplay, out

    events = []
    attnspec.train(SPECS / "linear-elu.yaml", overrides=TINY, task="mqar", task_overrides=MQAR, output=tmp_path / "r",
                   steps=1, init_weights=str(teacher), on_progress=events.append, **SETTINGS)
    (start,) = [event for event in events if event["event"] == "start"]
    assert start["init_weights"]["loaded"] > 0
    with out.capture() as captured, TrainingDisplay(enabled=True) as display:
        display.update(start)
    assert f"--init-weights: {start['init_weights']['loaded']} tensor(s) loaded" in captured.get()


@pytest.mark.parametrize("distill, words", [
    ({"hidden": 1.0}, "same blocks and width"),
    ({"teacher": "no-such-directory"}, "not a build or run directory"),
])
def test_a_teacher_that_cannot_be_matched_is_a_located_error_and_nothing_is_written(teacher, tmp_path, distill,
                                                                                     words):
    settings = {"teacher": str(teacher), **distill}
    with pytest.raises(SpecError, match=words) as error:
        attnspec.train(SPECS / "linear-elu.yaml", overrides=[*TINY, "layers[0].repeat=2"], task="mqar",
                       task_overrides=MQAR, output=tmp_path / "run", steps=2, distill=settings, **SETTINGS)
    assert "distill." in str(error.value) and not (tmp_path / "run").exists()


def test_a_run_starts_from_another_models_weights_where_they_fit(teacher, tmp_path):
    """`init_weights`: the teacher's run (softmax attention) starts a student of linear attention: every
    tensor that fits by name and shape (q/k/v/o, norms, MLP, embeddings) comes from the teacher, run.json
    says how it fitted; a path that holds no weights is a located error."""
    import json

    from attnspec.training.rundir import load_trained

    run = attnspec.train(SPECS / "linear-elu.yaml", overrides=TINY, task="mqar", task_overrides=MQAR,
                         output=tmp_path / "run", steps=1, init_weights=str(teacher), **{**SETTINGS, "lr": 1e-12})
    record = json.loads((tmp_path / "run" / "run.json").read_text())["init_weights"]
    assert record["loaded"] > 0 and record["ignored"] == []
    source = load_trained(teacher).state_dict()
    trained = run.model.state_dict()
    assert torch.allclose(trained["blocks.0.mixer.q_proj.weight"], source["blocks.0.mixer.q_proj.weight"], atol=1e-6)
    with pytest.raises(SpecError, match="init_weights"):
        attnspec.train(SPECS / "linear-elu.yaml", overrides=TINY, task="mqar", task_overrides=MQAR, steps=1,
                       init_weights=str(tmp_path / "nothing"), **SETTINGS)


def test_init_weights_map_renames_the_source_tensors_before_they_fit(teacher):
    """An explicit mapping: the teacher's first MLP feeds the student's second block (longest prefix
    first: `blocks.0.mlp.up.` before `blocks.0.`), the rest by name."""
    from attnspec.training.rundir import load_trained

    renames = {"blocks.0.": "unused.", "blocks.0.mlp.up.": "blocks.1.mlp.up."}
    run = attnspec.train(SPECS / "linear-elu.yaml", overrides=[*TINY, "layers[0].repeat=2"], task="mqar",
                         task_overrides=MQAR, steps=1, init_weights=str(teacher), init_weights_map=renames,
                         **{**SETTINGS, "lr": 1e-12})
    source, trained = load_trained(teacher).state_dict(), run.model.state_dict()
    assert torch.allclose(trained["blocks.1.mlp.up.weight"], source["blocks.0.mlp.up.weight"], atol=1e-6)
    assert not torch.allclose(trained["blocks.0.mlp.up.weight"], source["blocks.0.mlp.up.weight"], atol=1e-3)
