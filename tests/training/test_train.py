"""The trainer: optimiser groups from component facts, exact resume, export of a trained model,
data parallelism against one process, and the planner's training regime."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.errors import AttnSpecError, SpecError
from attnspec.training.optim import parameter_groups

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
TINY = ["d_model=16", "layers[0].repeat=1", "max_len=16", "input.vocab_size=32"]
MQAR = ["seq_len=16", "vocab_size=32", "num_kv_pairs=2"]


def _tiny_run(output=None, spec="softmax-transformer", extra=(), **flags):
    settings = {"steps": 20, "batch_size": 8, "eval_every": 5, "test_examples": 16, "lr": 3e-3} | flags
    return attnspec.train(SPECS / f"{spec}.yaml", overrides=[*TINY, "position=learned", *extra], task="mqar",
                          task_overrides=MQAR, output=output, **settings)


def test_optimiser_groups_follow_component_facts_and_overrides():
    model = attnspec.build(SPECS / "gateloop.yaml", "layers[0].repeat=1")
    groups = {(g.weight_decay, g.lr_multiplier): set(g.names) for g in parameter_groups(model)}
    assert groups[(False, 0.8)] == {"blocks.0.mixer.transition.gamma.weight", "blocks.0.mixer.transition.theta.weight",
                                    "blocks.0.mixer.transition.gamma.bias", "blocks.0.mixer.transition.theta.bias"}
    no_decay = groups[(False, 1.0)]
    assert {"embed.weight", "blocks.0.norm1.weight", "blocks.0.norm1.bias", "final_norm.weight"} <= no_decay
    assert "blocks.0.mixer.q_proj.weight" in groups[(True, 1.0)] and "blocks.0.mlp.up.weight" in groups[(True, 1.0)]
    overridden = parameter_groups(model, {"transition.data": {"lr_multiplier": 0.1, "weight_decay": True}})
    assert {(g.weight_decay, g.lr_multiplier) for g in overridden if "transition" in g.names[0]} == {(True, 0.1), (False, 0.1)}
    assert sum(len(g.names) for g in overridden) == len(list(model.parameters()))


def test_training_learns_and_records_everything(tmp_path):
    run = _tiny_run(tmp_path / "run")
    assert run.losses[-1] < run.losses[0]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "done" and record["step"] == 20 and record["plan"]["training"]
    assert record["config"]["task"]["vocab_size"] == 32 and record["spec"]["position"] == {"kind": "learned"}
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["split"] == "train"] == list(range(1, 21))
    assert [r["step"] for r in lines if r["split"] == "test"] == [5, 10, 15, 20]
    assert not run.model.training, "the returned model is in eval mode"
    repeat = attnspec.train(SPECS / "softmax-transformer.yaml", tmp_path / "run" / "config.yaml",
                            overrides=[*TINY, "position=learned"])
    assert repeat.losses == run.losses, "the recorded configuration repeats the run exactly"


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path):
    whole = _tiny_run(tmp_path / "whole", checkpoint_every=10)
    stopped = _tiny_run(tmp_path / "split", checkpoint_every=10, stop_after=10)
    assert stopped.step == 10 and json.loads((tmp_path / "split" / "run.json").read_text())["status"] == "stopped"
    resumed = attnspec.train(None, output=tmp_path / "split", resume=True)
    lines = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in lines if r["split"] == "train"]
    assert losses == whole.losses  # exact equality: same data, same state, same kernels
    assert resumed.metrics == whole.metrics
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_resume_takes_the_command_that_started_the_run_and_raises_steps(tmp_path):
    """Ctrl-C's advice, "add --resume to the same command", works: the same spec, task and flags continue
    the run as the uninterrupted one; a larger ``steps`` trains a finished run further; anything else that
    differs (a flag, the spec) or fewer steps is refused naming it, the run untouched."""
    whole = _tiny_run(tmp_path / "whole", steps=6, checkpoint_every=3)
    _tiny_run(tmp_path / "run", steps=6, checkpoint_every=3, stop_after=3)
    resumed = _tiny_run(tmp_path / "run", steps=6, checkpoint_every=3, resume=True)
    assert resumed.step == 6 and resumed.metrics == whole.metrics
    for wrong, match in (({"lr": 1e-3}, r"differs .*\(lr\)"), ({"extra": ["d_model=32"]}, "at `d_model`"),
                         ({"steps": 4}, "never lower them")):
        before = (tmp_path / "run" / "run.json").read_text()
        with pytest.raises(AttnSpecError, match=match):
            _tiny_run(tmp_path / "run", **{"steps": 6, "checkpoint_every": 3, **wrong}, resume=True)
        assert (tmp_path / "run" / "run.json").read_text() == before
    further = attnspec.train(None, output=tmp_path / "run", resume=True, steps=9)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert further.step == 9 and record["step"] == 9 and record["config"]["steps"] == 9 and record["status"] == "done"
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["split"] == "train"] == list(range(1, 10))


def test_resume_refuses_what_is_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(AttnSpecError, match="run.json"):
        attnspec.train(None, output=tmp_path, resume=True)
    with pytest.raises(AttnSpecError, match="not empty"):
        _tiny_run(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_task_that_does_not_fit_the_spec_is_a_located_error_and_writes_nothing(tmp_path):
    with pytest.raises(SpecError, match="vocab_size is 32"):
        attnspec.train(SPECS / "softmax-transformer.yaml", overrides=TINY, task="mqar", output=tmp_path / "run")
    with pytest.raises(SpecError, match="max_len = 16"):
        attnspec.train(SPECS / "softmax-transformer.yaml", overrides=TINY, task="mqar",
                       task_overrides=["seq_len=64", "vocab_size=32", "num_kv_pairs=2"], output=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_trained_model_exports_and_the_exported_program_predicts_like_it(tmp_path):
    run = _tiny_run(tmp_path / "run", steps=30)
    result = subprocess.run([sys.executable, "-m", "attnspec", "build", str(tmp_path / "run"), "-o",
                             str(tmp_path / "build"), "--no-compile", "--programs", "model"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    loaded = attnspec.load(tmp_path / "build")
    for name, tensor in run.model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    task = run.config.task
    inputs, targets = task.batch("test", 0, 4, run.config.seed)
    from attnspec.compiler.archive import load_program

    program = load_program(tmp_path / "build" / "model.pt2")
    with torch.no_grad():
        expected = run.model(inputs).argmax(-1)
        assert torch.equal(program.module()(inputs).argmax(-1), expected)
    shown = subprocess.run([sys.executable, "-m", "attnspec", "run", str(tmp_path / "build"), "--tokens",
                            " ".join(map(str, inputs[0].tolist()))], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    saved = attnspec.save(run.model, tmp_path / "saved", compile_check=False)
    assert saved.manifest["files"]["model.safetensors"]["sha256"] == \
        json.loads((tmp_path / "build" / "manifest.json").read_text())["files"]["model.safetensors"]["sha256"]


@pytest.mark.slow
def test_cli_train_errors_exit_2_without_a_traceback(tmp_path):
    cases = [
        ["train", str(SPECS / "softmax-transformer.yaml"), "--task", "mqqar", "-o", str(tmp_path / "a")],
        ["train", str(SPECS / "softmax-transformer.yaml"), "--task", "mqar", "--task-set", "seq_len=-3",
         "-o", str(tmp_path / "b")],
        ["train", "--resume", "--steps", "5", "-o", str(tmp_path / "c")],
    ]
    for args in cases:
        result = subprocess.run([sys.executable, "-m", "attnspec", *args], capture_output=True, text=True)
        assert result.returncode == 2 and "Traceback" not in result.stderr and "error:" in result.stderr, result.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_data_parallel_gloo_matches_one_process(tmp_path):
    """2 gloo processes with the global batch of one: the same losses in float64 over 10 steps."""
    args = ["train", str(SPECS / "softmax-transformer.yaml"), *sum((["--set", s] for s in
            [*TINY, "position=learned", "dtype=float64"]), []), "--task", "mqar",
            *sum((["--task-set", s] for s in MQAR), []), "--steps", "10", "--batch", "8", "--accumulate", "2",
            "--eval-every", "0", "--lr", "3e-3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "attnspec", *args, "-o", str(tmp_path / "one")],
                            capture_output=True, text=True, env=env)
    assert single.returncode == 0, single.stderr
    double = subprocess.run([sys.executable, "-m", "attnspec", *args, "--nproc", "2", "-o", str(tmp_path / "two")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert double.returncode == 0, double.stderr[-3000:]

    def losses(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]

    one, two = losses("one"), losses("two")
    assert len(one) == len(two) == 10
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5
    assert json.loads((tmp_path / "two" / "run.json").read_text())["world_size"] == 2


@pytest.mark.slow  # one torchrun launch of two ranks
def test_torchrun_errors_are_one_line_before_or_after_the_ranks_start(tmp_path):
    """``--nproc 2``: what a rank would refuse (the task's vocabulary past the spec's, a staged run, a run
    directory in use) is refused by the launching process, one line, exit 2, before torchrun starts; an error
    only a rank finds (a teacher that is no build) reaches the user as its one ``error:`` line, once, exit 2,
    without torchrun's report of the failed children."""
    base = [sys.executable, "-m", "attnspec", "train", str(SPECS / "softmax-transformer.yaml"),
            *sum((["--set", s] for s in [*TINY, "position=learned"]), []), "--task", "mqar", "--steps", "2",
            "--batch", "8", "--nproc", "2"]
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("mine")
    stages = tmp_path / "stages.yaml"
    stages.write_text("stages:\n  - {objective: lm, steps: 1}\n  - {objective: lm, steps: 1}\n")
    for extra, said in ((["--task-set", "vocab_size=64", "--task-set", "seq_len=16", "-o", str(tmp_path / "a")],
                         "vocab"),
                        ([*sum((["--task-set", s] for s in MQAR), []), "--config", str(stages), "-o",
                          str(tmp_path / "b")], "one process"),
                        ([*sum((["--task-set", s] for s in MQAR), []), "-o", str(tmp_path / "used")], "not empty")):
        refused = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 2 and len(lines) == 1 and said in lines[0], refused.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    distil = tmp_path / "distil.yaml"
    distil.write_text(f"distill: {{teacher: {tmp_path / 'used'}}}\n")
    failed = subprocess.run([*base, *sum((["--task-set", s] for s in MQAR), []), "--config", str(distil), "-o",
                             str(tmp_path / "c")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert failed.returncode == 2 and len(errors) == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert "ChildFailedError" not in failed.stderr and str(tmp_path / "used") in errors[0]


def test_training_plan_picks_a_mode_near_the_fastest_measured():
    """Per-channel GateLoop at L = 64, batch 32, forward + backward: the planner's training choice
    must be within 2x of the fastest mode measured here (at batch 1 inference it prefers other modes)."""
    from attnspec.compiler.plan import plan_spec

    model = attnspec.build(SPECS / "gateloop.yaml", "layers[0].repeat=1").train()
    plan = plan_spec(model.spec, 64, batch=32, training=True)
    tokens = torch.randint(0, 64, (32, 64))
    modes = model.blocks[0].mixer.modes
    seconds = {mode: float("inf") for mode in modes}
    for round_ in range(4):  # interleaved rounds, the best of each (the first is a warm-up): another
        for mode in modes:  # process on the cores slows whichever mode it overlaps, not every round
            model.set_modes([mode])
            start = time.perf_counter()
            model(tokens).logsumexp(-1).mean().backward()
            if round_:
                seconds[mode] = min(seconds[mode], time.perf_counter() - start)
    chosen = plan.full_modes[0]
    assert seconds[chosen] <= 2 * min(seconds.values()), (chosen, seconds)
    assert seconds["quadratic"] > 3 * seconds[chosen], "the regime matters: quadratic is far slower here"


def test_tensorboard_event_files_hold_the_metrics(tmp_path):
    pytest.importorskip("tensorboard")  # the `tensorboard` extra (installed with `dev`)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _tiny_run(tmp_path / "run", steps=10, tensorboard=True)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 11))
    assert [e.step for e in events.Scalars("test/accuracy")] == [5, 10]


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_losses(tmp_path):
    """SIGKILL at an arbitrary moment after the first checkpoint; --resume continues from the latest
    checkpoint (later lines of metrics.jsonl are dropped) and ends with the same losses."""
    import signal

    args = [sys.executable, "-m", "attnspec", "train", str(SPECS / "softmax-transformer.yaml"),
            *sum((["--set", s] for s in [*TINY, "position=learned"]), []), "--task", "mqar",
            *sum((["--task-set", s] for s in MQAR), []), "--steps", "300", "--batch", "8", "--eval-every", "0",
            "--lr", "3e-3"]
    whole = subprocess.run([*args, "-o", str(tmp_path / "whole")], capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    config = tmp_path / "config.yaml"
    config.write_text("task: {kind: mqar, seq_len: 16, vocab_size: 32, num_kv_pairs: 2}\ncheckpoint_every: 20\n")
    killed = subprocess.Popen([*args, "--config", str(config), "-o", str(tmp_path / "killed")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pointer = tmp_path / "killed" / "checkpoint.json"
    deadline = time.monotonic() + 120
    while not pointer.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    resumed = subprocess.run([sys.executable, "-m", "attnspec", "train", "--resume", "-o", str(tmp_path / "killed")],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr

    def losses(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]

    assert losses("killed") == losses("whole")


def test_compiled_training_step_matches_eager_without_recompiles(tmp_path):
    eager = _tiny_run(steps=6, compile="off")
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = _tiny_run(steps=6, compile="on")
    assert compiled.history and all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(compiled.losses, eager.losses))
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])  # forward+backward compiled once


def test_bfloat16_autocast_trains(tmp_path):
    run = _tiny_run(steps=10, precision="bfloat16")
    assert all(math.isfinite(loss) for loss in run.losses) and run.losses[-1] < run.losses[0]


@pytest.mark.slow
def test_build_with_weights_file(tmp_path):
    _tiny_run(tmp_path / "run", steps=5)
    weights = next((tmp_path / "run" / "checkpoints").iterdir()) / "model.safetensors"
    spec = tmp_path / "run" / "spec.yaml"
    ok = subprocess.run([sys.executable, "-m", "attnspec", "build", str(spec), "--weights", str(weights), "-o",
                         str(tmp_path / "b"), "--no-compile"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # another spec's model: what fits is loaded and the rest listed; --strict-weights refuses, writing nothing
    other = [sys.executable, "-m", "attnspec", "build", str(SPECS / "gateloop.yaml"), "--weights", str(weights),
             "--no-compile", "--no-calibrate"]
    lenient = subprocess.run([*other, "-o", str(tmp_path / "c")], capture_output=True, text=True)
    assert lenient.returncode == 0 and "initialised" in lenient.stdout, lenient.stderr
    strict = subprocess.run([*other, "-o", str(tmp_path / "d"), "--strict-weights"], capture_output=True, text=True)
    assert strict.returncode == 2 and "they must come from a model of this spec" in strict.stderr
    assert not (tmp_path / "d").exists()


def _interrupt_at(step: int):
    """An on_progress callback pressing Ctrl-C when ``step`` has been taken."""
    def on_progress(record):
        if record.get("event") == "step" and record["step"] == step:
            raise KeyboardInterrupt
    return on_progress


def test_an_interrupt_before_the_first_checkpoint_removes_the_run_so_the_same_command_starts_again(tmp_path):
    from attnspec.errors import RunInterrupted

    for step in (1, 4):
        with pytest.raises(RunInterrupted, match="was removed; the same command starts it again"):
            _tiny_run(tmp_path / "run", checkpoint_every=5, on_progress=_interrupt_at(step))
        assert not (tmp_path / "run").exists()
    assert _tiny_run(tmp_path / "run", steps=5).step == 5


def test_an_interrupt_after_a_checkpoint_marks_the_run_interrupted_and_resume_ends_as_the_whole_run(tmp_path):
    from attnspec.errors import RunInterrupted

    whole = _tiny_run(tmp_path / "whole", checkpoint_every=5)
    with pytest.raises(RunInterrupted, match="checkpoint of step 10.*--resume"):
        _tiny_run(tmp_path / "split", checkpoint_every=5, on_progress=_interrupt_at(13))
    record = json.loads((tmp_path / "split" / "run.json").read_text())
    assert (record["status"], record["step"]) == ("interrupted", 10)
    resumed = attnspec.train(None, output=tmp_path / "split", resume=True)
    assert resumed.metrics == whole.metrics
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_a_directory_killed_before_its_first_checkpoint_says_what_to_do(tmp_path):
    """SIGKILL leaves no chance to clean up: run.json without a checkpoint. Neither --resume nor a new run
    into it proceeds, and each says why and what to do."""
    import shutil

    _tiny_run(tmp_path / "run", steps=2)
    for name in ("checkpoint.json", "result.json"):  # as a run killed before its first checkpoint leaves it
        (tmp_path / "run" / name).unlink()
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    with pytest.raises(AttnSpecError, match="no checkpoint to resume from.*remove the directory"):
        attnspec.train(None, output=tmp_path / "run", resume=True)
    with pytest.raises(AttnSpecError, match="before its first checkpoint: nothing to resume; remove it"):
        _tiny_run(tmp_path / "run")


@pytest.mark.slow  # two CLI subprocesses
def test_sigterm_marks_a_cli_run_interrupted_at_its_checkpoint_and_says_how_to_resume(tmp_path):
    import signal

    args = [sys.executable, "-m", "attnspec", "train", str(SPECS / "softmax-transformer.yaml"),
            *sum((["--set", s] for s in [*TINY, "position=learned"]), []), "--task", "mqar",
            *sum((["--task-set", s] for s in MQAR), []), "--steps", "100000", "--batch", "8", "--eval-every", "0",
            "--lr", "3e-3"]
    config = tmp_path / "config.yaml"
    config.write_text("task: {kind: mqar, seq_len: 16, vocab_size: 32, num_kv_pairs: 2}\ncheckpoint_every: 20\n")
    running = subprocess.Popen([*args, "--config", str(config), "-o", str(tmp_path / "run")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pointer = tmp_path / "run" / "checkpoint.json"
    deadline = time.monotonic() + 120
    while not pointer.exists() and running.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    running.send_signal(signal.SIGTERM)
    _, stderr = running.communicate(timeout=60)
    assert running.returncode == 130 and "--resume" in stderr and "Traceback" not in stderr, stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "interrupted" and record["step"] % 20 == 0 and record["step"] >= 20


def test_the_training_log_and_result_show_chance_beside_accuracy(tmp_path):
    """MQAR at 2 pairs: accuracy is reported with the test set's chance level and whether it is beyond it."""
    from attnspec.cli.metrics import metrics_text

    run = _tiny_run(tmp_path / "run", steps=2)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert 0 < result["chance"] < 1 and result["learned"] is (result["accuracy"] > result["chance"] + 0.03)
    text = metrics_text(run.metrics)
    assert f"(chance {result['chance']:.3g}" in text and ("not learned" in text) is (not result["learned"])


def test_training_plans_by_the_cost_model_so_a_calibration_cannot_change_the_numbers(tmp_path, monkeypatch):
    """Issue 38: a run's modes come from the spec, the cost model and its shapes, not from a timing taken
    as it starts. A calibration cache claiming another mode is fastest leaves the weights bit-identical;
    `planning: measured` follows the cache, records the modes, and a resumed run keeps them whatever
    the cache on the machine that resumes says."""
    from attnspec.compiler.calibration import Calibration, calibration_path, machine_key, mixer_signature
    from attnspec.spec import load_spec
    from attnspec.spec.ir import iter_blocks

    overrides = [*TINY, "position=learned"]
    spec = load_spec(SPECS / "linear-elu.yaml", overrides)

    def claim(cache: str, fastest: str | None):
        """A calibration cache in ``cache`` where ``fastest`` beats every other mode by 1000x."""
        monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / cache))
        if fastest is not None:
            calibration = Calibration(calibration_path(), {}, machine_key())
            for _, block in iter_blocks(spec, expand=True):
                seconds = {mode: 1e-6 if mode == fastest else 1e-3
                           for mode in ("chunk", "scan", "recurrent", "quadratic")}
                calibration.store(mixer_signature(spec, block.mixer), "training", 8, 16, seconds, {})
            calibration.save()

    def run(name: str, **flags):
        return _tiny_run(tmp_path / name, spec="linear-elu", steps=4, eval_every=2, **flags)

    def modes(name: str, file: str = "run.json") -> list[str]:
        record = json.loads((tmp_path / name / file).read_text())
        if file == "run.json":
            return [layer["full_mode"] for layer in record["plan"]["layers"]]
        return record["plan"]["modes"]

    claim("none", None)
    plain = run("plain")
    model_modes = modes("plain")
    other = next(mode for mode in ("recurrent", "scan", "chunk") if mode not in model_modes)
    claim("claims", other)
    claimed = run("claimed")
    assert modes("claimed") == model_modes == modes("claimed", "result.json")
    assert claimed.losses == plain.losses
    weights = zip(plain.model.state_dict().values(), claimed.model.state_dict().values())
    assert all(torch.equal(a, b) for a, b in weights)
    assert run("again").losses == plain.losses, "repeated runs are bit-identical"

    measured = run("measured", planning="measured", stop_after=2)
    assert modes("measured") == [other] * len(model_modes)
    claim("none-again", None)  # another machine, whose cache holds nothing (it would measure and choose afresh)
    resumed = attnspec.train(None, output=tmp_path / "measured", resume=True)
    assert resumed.step == 4 and modes("measured") == [other] * len(model_modes) == modes("measured", "result.json")
    assert not (tmp_path / "none-again").exists(), "the resumed run measured nothing"
