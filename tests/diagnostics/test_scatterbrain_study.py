"""Scatterbrain's study: sparse attention alone is exact on a full support, the paper's two
observations hold for the reference (top-k) support (sparse wins at low entropy, low-rank at high
entropy, and their sum beats both somewhere), the ratio follows the entropy, and the command runs on
synthetic and on trained q/k."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.diagnostics.attention import exact_attention, synthetic_qk
from attnspec.diagnostics.scatterbrain import RATIOS, entropy_ratio, sparse_attention, study, synthetic_sets
from attnspec.ops.support import topk_support


def test_sparse_attention_on_every_key_is_exact_and_its_rows_are_distributions():
    q, k = synthetic_qk(2, 3, 17, 8, sharpness=1.0, seed=1)
    for causal in (False, True):
        exact = exact_attention(q, k, 1 / math.sqrt(8), causal)
        full = sparse_attention(q, k, topk_support(q, k, 17, causal=causal), 1 / math.sqrt(8))
        assert torch.allclose(full, exact, atol=1e-14)
        partial = sparse_attention(q, k, topk_support(q, k, 4, causal=causal), 1 / math.sqrt(8))
        assert torch.allclose(partial.sum(-1), torch.ones(2, 3, 17, dtype=torch.float64))
        assert int((partial > 0).sum(-1).max()) <= 4
        if causal:
            assert partial.triu(1).abs().max() == 0


def test_the_ratio_gives_low_rank_more_of_the_budget_as_entropy_rises():
    length = 256
    shares = [entropy_ratio(h, length)[1] / sum(entropy_ratio(h, length)) for h in (0.0, 1.0, 2.5, 4.0, math.log(256))]
    assert shares == sorted(shares) and entropy_ratio(0.0, length) == RATIOS[0] and \
        entropy_ratio(math.log(length), length) == RATIOS[-1]


@pytest.fixture(scope="module")
def topk_rows():
    """L = 128, d_qk = 16, 2 heads, budget 1/4, causal, the exact top-k support, 3 entropies."""
    sets = synthetic_sets(heads=2, d_qk=16, length=128, sharpness=[0.25, 1.0, 3.0], samples=2, seed=0)
    return study(sets, causal=True, budgets=(0.25,), support={"kind": "topk"})


def test_sparse_wins_at_low_entropy_and_low_rank_at_high_entropy(topk_rows):
    error = {(row.source, row.method): row.error_mean for row in topk_rows}
    assert error[("sharpness=3", "sparse[topk]")] < 0.1 * error[("sharpness=3", "performer")]  # peaked rows
    assert error[("sharpness=0.25", "performer")] < 0.5 * error[("sharpness=0.25", "sparse[topk]")]  # diffuse rows
    # Observation 3 at high entropy: the sum beats both parts (mostly low-rank, the sparse part exact)
    best_sum = min(e for (source, method), e in error.items() if source == "sharpness=0.25" and "scatterbrain" in method)
    assert best_sum < min(error[("sharpness=0.25", "performer")], error[("sharpness=0.25", "sparse[topk]")])


def test_the_entropy_row_is_the_row_of_the_ratio_the_entropy_picks(topk_rows):
    for source in ("sharpness=0.25", "sharpness=1", "sharpness=3"):
        mine = {row.method: row for row in topk_rows if row.source == source}
        s, r = entropy_ratio(next(iter(mine.values())).entropy, 128)
        assert mine["scatterbrain[topk entropy]"].error_mean == mine[f"scatterbrain[topk {s}:{r}]"].error_mean
        assert {"performer", "sparse[topk]", *(f"scatterbrain[topk {a}:{b}]" for a, b in RATIOS)} < set(mine)


@pytest.mark.slow
def test_scatterbrain_command_on_synthetic_and_trained_q_k(tmp_path: Path):
    command = [sys.executable, "-m", "attnspec", "diagnose", "scatterbrain"]
    synthetic = subprocess.run([*command, "-o", str(tmp_path / "s"), "--length", "32", "--heads", "1", "--d-qk", "8",
                                "--budget", "0.25", "--sharpness", "1"], capture_output=True, text=True, timeout=120)
    assert synthetic.returncode == 0, synthetic.stderr
    assert {p.name for p in (tmp_path / "s").iterdir()} >= {"scatterbrain.csv", "scatterbrain_budget.png",
                                                            "scatterbrain_entropy.svg"}
    run = tmp_path / "run"
    attnspec.train(Path(attnspec.__file__).parents[1] / "specs" / "softmax-transformer.yaml", output=run, task="mqar",
                   steps=2, batch_size=4, eval_every=0, test_examples=4,
                   overrides=["layers[0].repeat=2", "d_model=32", "max_len=32", "input.vocab_size=64"],
                   task_overrides=["seq_len=32", "vocab_size=64"])
    trained = subprocess.run([*command, "-o", str(tmp_path / "t"), "--qk-from", str(run), "--budget", "0.25",
                              "--samples", "2"], capture_output=True, text=True, timeout=120)
    assert trained.returncode == 0, trained.stderr
    lines = (tmp_path / "t" / "scatterbrain.csv").read_text().splitlines()
    assert {line.split(",")[2] for line in lines[1:]} == {"layer 0", "layer 1"}
    wrong = subprocess.run([*command, "-o", str(tmp_path / "u"), "--support", "bogus"], capture_output=True, text=True,
                           timeout=120)
    assert wrong.returncode == 2 and "--support" in wrong.stderr and "Traceback" not in wrong.stderr
