"""The implied attention matrix: for every shipped mixer kind, A v reproduces the mixer's own output
(so A is the mixer's mechanism, not a re-implementation); softmax's A is exact softmax attention;
causal masks hold; Performer's error against exact attention falls with its number of features."""

from __future__ import annotations

from pathlib import Path

import pytest
import subprocess
import sys

import torch

import attnspec
from attnspec.diagnostics.attention import (approximation_error, approximation_sweep, exact_attention,
                                            implied_attention, row_entropy, synthetic_qk)

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _mixer(spec_name: str, *sets: str):
    spec = attnspec.load_spec(SPECS / f"{spec_name}.yaml", ["layers[0].repeat=1", "dtype=float64", *sets])
    return attnspec.build(spec).blocks[0].mixer, spec.d_model


def _pre_output(mixer, x):
    """The mixer's output before its output stage, and its values, by running it unchanged."""
    captured = {}
    project = mixer._project

    def spy(h, *args, **kwargs):
        q, k, v, state = project(h, *args, **kwargs)
        captured["v"] = v
        return q, k, v, state

    mixer._project, mixer._output = spy, lambda o, h, v=None: captured.setdefault("o", o)
    try:
        with torch.no_grad():
            mixer(x)
    finally:
        del mixer._project, mixer._output
    return captured["o"], captured["v"]


@pytest.mark.parametrize("spec_name, sets", [
    ("softmax-transformer", ()), ("linear-elu", ()), ("performer", ()), ("cosformer", ()), ("scatterbrain", ()),
    ("retnet", ()), ("gateloop", ()), ("softmax-transformer", ("blocks[*].mixer.causal=false",)),
    ("linear-elu", ("blocks[*].mixer.conv={kind: short, width: 3}", "position=rope")),
])
def test_a_times_v_is_the_mixer_s_own_output(spec_name, sets):
    mixer, d = _mixer(spec_name, *sets)
    x = torch.randn(2, 37, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.5  # odd length
    A, q, k = implied_attention(mixer, x)
    o, v = _pre_output(mixer, x)
    assert A.shape == (2, mixer.heads, 37, 37) and torch.isfinite(A).all()
    assert torch.allclose(A @ v, o, rtol=1e-9, atol=1e-11)
    if mixer.causal:
        assert (A.triu(1) == 0).all()


def test_softmax_implies_exact_attention_and_its_entropy():
    mixer, d = _mixer("softmax-transformer", "position=rope")
    x = torch.randn(1, 50, d, dtype=torch.float64)
    A, q, k = implied_attention(mixer, x)
    exact = exact_attention(q, k, mixer.scale, mixer.causal)
    assert approximation_error(A, exact)["relative"].max() < 1e-12
    uniform = torch.full((1, 1, 8, 8), 1 / 8, dtype=torch.float64)
    assert row_entropy(uniform).item() == pytest.approx(torch.log(torch.tensor(8.0)).item())


def test_performer_error_against_exact_attention_falls_with_its_features():
    x = torch.randn(2, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5
    errors = []
    for features in (64, 512, 4096):
        mixer, _ = _mixer("performer", "d_model=64", f"blocks[*].mixer.feature_map.num_features={features}")
        A, q, k = implied_attention(mixer, x)
        errors.append(float(approximation_error(A, exact_attention(q, k, mixer.scale, mixer.causal))["relative"].mean()))
    assert errors[0] > errors[1] > errors[2], errors


def test_synthetic_sharpness_sets_the_entropy_and_the_sweep_scores_each_mixer():
    entropies = [float(row_entropy(exact_attention(*synthetic_qk(1, 2, 64, 16, sigma), 16 ** -0.5, False)).mean())
                 for sigma in (0.25, 1.0, 3.0)]
    assert entropies[0] > entropies[1] > entropies[2] and entropies[0] < torch.log(torch.tensor(64.0)).item()
    softmax, d = _mixer("softmax-transformer", "d_model=64")
    performer, _ = _mixer("performer", "d_model=64", "blocks[*].mixer.feature_map.num_features=1024")
    rows = approximation_sweep({"softmax": (softmax, d), "performer": (performer, d)}, length=48,
                               sharpness=[0.25, 2.0])
    error = {(r.mixer, r.sharpness): r.relative_error_mean for r in rows}
    assert error[("softmax", 0.25)] < 1e-12 and error[("softmax", 2.0)] < 1e-12  # exact is exact at any entropy
    assert error[("performer", 0.25)] < 0.1 < error[("performer", 2.0)]  # random features fail on peaked attention


def test_attention_command_writes_its_table_and_plot(tmp_path):
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "attention", str(SPECS / "performer.yaml"),
                             str(SPECS / "linear-elu.yaml"), "-o", str(tmp_path / "a"), "--length", "32",
                             "--sharpness", "0.5", "--sharpness", "2", "--set", "d_model=32"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "a" / "attention_error.csv").read_text().splitlines()
    assert lines[0].startswith("mixer,sharpness,entropy") and len(lines) == 1 + 2 * 2
    assert (tmp_path / "a" / "attention_error.png").is_file() and (tmp_path / "a" / "attention_error.svg").is_file()


def test_topk_support_is_the_largest_scores_and_full_support_scatterbrain_is_exact():
    from attnspec.ops.support import topk_support

    q, k = synthetic_qk(1, 2, 20, 8, 1.0, seed=3)
    support = topk_support(q, k, 5, causal=True)
    scores = (q @ k.transpose(-1, -2))[0, 0]
    for i in range(20):
        chosen = sorted(int(j) for j, ok in zip(support.index[0, 0, i], support.valid[0, 0, i]) if ok)
        assert chosen == sorted(sorted(range(i + 1), key=lambda j: -float(scores[i, j]))[:5])
    for causal in (True, False):  # a support holding every key leaves nothing to the low-rank part: exact
        mixer, d = _mixer("scatterbrain", "max_len=40", "blocks[*].mixer.budget=null",
                          "blocks[*].mixer.sparse={kind: topk, keys: 40}", f"blocks[*].mixer.causal={str(causal).lower()}")
        q, k = synthetic_qk(2, mixer.heads, 40, mixer.d_qk, 1.5, seed=1)
        A, _, _ = implied_attention(mixer, torch.zeros(2, 40, d, dtype=torch.float64), qk=(q, k))
        assert approximation_error(A, exact_attention(q, k, mixer.scale, causal))["relative"].max() < 1e-12


def test_scatterbrain_with_an_exact_support_beats_performer_on_peaked_attention():
    """The paper's Observation 2 at the shipped widths and budget (1/8, 3:1): with a support that holds
    the largest scores, the sparse part wins where attention is peaked; the shipped angular LSH
    support does not find them on independent q and k (measured in issue 12's note)."""
    mixers = {name: _mixer(spec, "max_len=128", *sets) for name, spec, sets in (
        ("performer", "performer", ()), ("topk", "scatterbrain", ("blocks[*].mixer.sparse={kind: topk}",)))}
    rows = approximation_sweep(mixers, length=128, sharpness=[3.0])
    error = {row.mixer: row.relative_error_mean for row in rows}
    assert error["topk"] < 0.1 * error["performer"], error
