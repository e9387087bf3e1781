"""Gates: the transitions the model applies, read from its transition modules, against the values
their definitions give; the marked-token split; a Memory Horizon run marks its reset token."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import attnspec
from attnspec.diagnostics.gates import default_marked_token, diagnose, transitions
from attnspec.diagnostics.subject import load_subject, random_inputs

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"


def test_fixed_transitions_are_the_retnet_values_at_every_position():
    spec = attnspec.load_spec(SPECS / "retnet.yaml", ["layers[0].repeat=1"])
    model = attnspec.build(spec)
    inputs = random_inputs(spec, 2, 16)
    ((magnitude, phase),) = transitions(model, inputs).values()
    assert magnitude.shape == (2, 16, spec.layers[0].layers[0].mixer.heads)  # per head
    assert torch.equal(magnitude, magnitude[:1, :1].expand_as(magnitude))  # input-independent
    heads = torch.arange(magnitude.shape[-1], dtype=torch.float64)
    assert torch.allclose(magnitude[0, 0], 1 - 2.0 ** (-5 - heads), rtol=1e-6)  # |a_h| = 1 - 2^(-5-h)
    assert phase is not None


def test_data_transitions_are_sigmoid_gates_of_the_block_input():
    spec = attnspec.load_spec(SPECS / "gateloop.yaml", ["layers[0].repeat=2"])
    model = attnspec.build(spec).double()
    inputs = random_inputs(spec, 3, 24, seed=1)
    captured = transitions(model, inputs)
    assert sorted(captured) == [0, 1]
    block_input = model.blocks[0].norm1(model.embed(inputs))  # pre-norm: the mixer sees norm(x)
    expected = torch.sigmoid(model.blocks[0].mixer.transition.gamma(block_input))
    assert torch.allclose(captured[0][0], expected, rtol=1e-10)
    rows, _ = diagnose(model, inputs, marked_token=int(inputs[0, 0]))
    by = {(row.layer, row.positions): row for row in rows}
    assert by[(0, "marked")].count + by[(0, "other")].count == by[(0, "all")].count == 3 * 24  # positions
    assert 0 < by[(0, "all")].magnitude_quantiles[0] <= by[(0, "all")].magnitude_quantiles[2] < 1


def test_a_memory_horizon_run_marks_its_reset_token(tmp_path: Path):
    run = tmp_path / "run"
    attnspec.train(SPECS / "gateloop.yaml", output=run, task="memory_horizon", steps=2, batch_size=4, eval_every=0,
                   test_examples=4, overrides=["layers[0].repeat=1", "max_len=32"],
                   task_overrides=["seq_len=32", "resets=3"])
    subject = load_subject(run)
    assert default_marked_token(subject.task) == subject.task.max_number + 1
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "gates", str(run), "-o", str(tmp_path / "g"),
                             "--samples", "4"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "marked" in result.stdout
    assert {p.name for p in (tmp_path / "g").iterdir()} == {"gates.csv", "gates.png", "gates.svg", ".attnspec-diagnostics"}
    lines = (tmp_path / "g" / "gates.csv").read_text().splitlines()
    assert lines[0].startswith("layer,positions,count") and any(",marked,12," in line for line in lines)


def test_a_model_without_transitions_is_a_clear_error(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "gates", str(SPECS / "softmax-transformer.yaml"),
                             "-o", str(tmp_path / "g")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "no state transitions" in result.stderr and not (tmp_path / "g").exists()
