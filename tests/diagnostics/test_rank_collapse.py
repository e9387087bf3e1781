"""Rank collapse: the composite norm on hand examples, the paper's claims at the shipped SAN spec's
widths (pure attention collapses doubly exponentially; skips stop it; MLPs and LayerNorm do not),
per-sublayer residual flags, and the diagnostic on a trained run and from the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.diagnostics.rank_collapse import composite_norm, diagnose, relative_residuals
from attnspec.diagnostics.subject import load_subject

ROOT = Path(__file__).resolve().parents[2]
SAN = ROOT / "specs" / "rank-collapse-san.yaml"


def _by_layer(rows, variant):
    return [row.composite_mean for row in rows if row.variant == variant]


def test_composite_norm_on_hand_examples():
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.float64)
    # ||X||_1 = max column abs-sum = max(4, 6) = 6; ||X||_inf = max row abs-sum = max(3, 7) = 7
    assert composite_norm(x) == pytest.approx((6 * 7) ** 0.5)
    assert composite_norm(-2.5 * x) == pytest.approx(2.5 * composite_norm(x))  # absolutely homogeneous
    same = torch.tensor([[1.0, 2.0]] * 5, dtype=torch.float64)
    composite, frobenius = relative_residuals(same)
    assert composite == 0 and frobenius == 0  # all tokens equal: rank 1, no residual
    composite, frobenius = relative_residuals(torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64))
    assert composite == pytest.approx(1.0) and frobenius == pytest.approx(1.0)  # mean zero: all residual


def test_pure_attention_collapses_and_skips_stop_it_at_the_shipped_widths():
    rows = diagnose(SAN, samples=16, length=64, variants=["san", "san+mlp"])
    san, san_mlp = _by_layer(rows, "san"), _by_layer(rows, "san+mlp")
    assert san[0] > 0.9 and san[4] < 1e-3 and san_mlp[4] < 1e-3  # below 1e-3 by depth 4, with or without MLPs
    assert san[2] < san[1] ** 2  # faster than geometric: the doubly exponential fall
    deep = diagnose(attnspec.load_spec(SAN, ["layers[0].repeat=12"]), samples=8, length=64,
                    variants=["san+skip", "transformer"])
    assert _by_layer(deep, "san+skip")[12] > 0.1 and _by_layer(deep, "transformer")[12] > 0.1


def test_layernorm_does_not_stop_collapse():
    spec = attnspec.load_spec(SAN, ["blocks[*].norm=layernorm"])
    assert _by_layer(diagnose(spec, samples=8, length=64, variants=["san"]), "san")[4] < 1e-3


def test_per_sublayer_residual_flags():
    spec = attnspec.load_spec(SAN, ["layers[0].repeat=1", "blocks[*].mlp={kind: mlp}",
                                    "blocks[*].residual={mixer: false, mlp: true}"])
    model = attnspec.build(spec).double()
    block = model.blocks[0]
    x = torch.randn(2, 8, 64, dtype=torch.float64)
    mixed = block.mixer(x)
    assert torch.allclose(block(x), mixed + block.mlp(mixed))  # no skip around the mixer, one around the MLP


@pytest.mark.slow
def test_a_trained_run_is_diagnosed_with_its_weights_and_its_task(tmp_path: Path):
    run = tmp_path / "run"
    attnspec.train(ROOT / "specs" / "softmax-transformer.yaml", output=run, task="mqar", steps=3, batch_size=4,
                   eval_every=0, test_examples=8, overrides=["d_model=16", "layers[0].repeat=2", "max_len=16",
                                                             "input.vocab_size=32"],
                   task_overrides=["seq_len=16", "vocab_size=32", "num_kv_pairs=2"])
    subject = load_subject(run)
    assert subject.trained and subject.task_inputs(4).shape == (4, 16)
    trained = diagnose(subject.spec, weights=subject.weights, inputs=subject.task_inputs(4), variants=["transformer"])
    initial = diagnose(subject.spec, inputs=subject.task_inputs(4), variants=["transformer"])
    assert len(trained) == 3 and _by_layer(trained, "transformer") != _by_layer(initial, "transformer")
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "rank-collapse", str(run), "-o",
                             str(tmp_path / "out"), "--samples", "4"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"rank_collapse.csv", "rank_collapse.png",
                                                              "rank_collapse.svg", ".attnspec-diagnostics"}
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "rank-collapse", str(run), "-o",
                             str(tmp_path / "x"), "--set", "d_model=8"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and not (tmp_path / "x").exists()
