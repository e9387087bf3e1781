"""Attention maps: the locality numbers on hand examples, and cos re-weighting (M = L) concentrating
a ReLU kernel's weight near the diagonal, as cosFormer's Fig. 3 shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnspec.diagnostics.maps import locality

ROOT = Path(__file__).resolve().parents[2]


def test_locality_of_hand_examples():
    identity = torch.eye(6, dtype=torch.float64).expand(1, 2, 6, 6)
    distance, near = locality(identity, window=1)
    assert torch.equal(distance, torch.zeros(2, dtype=torch.float64)) and torch.equal(near, torch.ones(2, dtype=torch.float64))
    first = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    first[..., 0] = 1  # every row attends to position 0: distances 0, 1, 2, 3
    distance, near = locality(first, window=2)
    assert distance.item() == pytest.approx(1.5) and near.item() == pytest.approx(0.5)


@pytest.mark.slow  # a subprocess and two models: the full suite runs it, the quick loop not
def test_cos_reweighting_concentrates_attention_near_the_diagonal(tmp_path: Path):
    variants = {}
    for name, reweighting in (("cos", "{kind: cos, M: 64}"), ("none", "none")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: relu-{name}\ninput: {{kind: tokens, vocab_size: 64}}\nd_model: 32\nmax_len: 64\n"
                        f"layers:\n  - mixer: {{kind: linear, heads: 4, feature_map: relu, reweighting: {reweighting}}}\n")
        variants[name] = path
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "maps", str(variants["cos"]),
                             str(variants["none"]), "-o", str(tmp_path / "m"), "--samples", "2", "--window", "8"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line.split(",") for line in (tmp_path / "m" / "maps.csv").read_text().splitlines()[1:]]
    share = {label: sum(float(r[4]) for r in rows if r[0] == label) / 4 for label in ("relu-cos", "relu-none")}
    distance = {label: sum(float(r[3]) for r in rows if r[0] == label) / 4 for label in ("relu-cos", "relu-none")}
    # at initialisation the ReLU scores are nearly flat, so the weights follow cos(pi/2 (i - j) / M): the
    # mean distance falls from ~L/4 (uniform causal rows) by about 12%; trained maps sharpen far more
    assert distance["relu-none"] == pytest.approx(64 / 4, rel=0.1)
    assert distance["relu-cos"] < 0.92 * distance["relu-none"] and share["relu-cos"] > share["relu-none"]
    assert {p.name for p in (tmp_path / "m").iterdir()} == {"maps.csv", "maps.png", "maps.svg", ".attnspec-diagnostics"}
    # again into the directory it wrote: allowed. Into a directory of the user's files: refused, untouched
    again = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "maps", str(variants["cos"]), "-o",
                            str(tmp_path / "m"), "--samples", "2"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "maps.csv").write_text("my data\n")
    refused = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "maps", str(variants["cos"]), "-o",
                              str(mine), "--samples", "2"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "did not write" in refused.stderr and "Traceback" not in refused.stderr
    assert (mine / "maps.csv").read_text() == "my data\n" and [p.name for p in mine.iterdir()] == ["maps.csv"]


@pytest.mark.parametrize("mixer", [
    "{kind: mamba}", "{kind: mla, heads: 2, d_qk: 8, d_v: 8, kv_rank: 8, rope_dim: 4, position: rope}",
    "{kind: parallel, branches: [{kind: linear, heads: 2}, {kind: softmax, heads: 2}]}"])
def test_a_mixer_without_a_query_key_value_form_is_refused_by_name_not_a_crash(mixer):
    from attnspec.diagnostics.attention import implied_attention
    from attnspec.diagnostics.paths import check_decomposable
    from attnspec.errors import AttnSpecError, ShapeError
    from attnspec.nn.model import build_model_from_spec
    from attnspec.spec import load_spec

    spec = load_spec({"name": "m", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 16, "max_len": 16,
                      "layers": [{"mixer": yaml.safe_load(mixer), "mlp": "none", "norm": "none"}]})
    model = build_model_from_spec(spec)
    kind = spec.layers[0].mixer.kind
    with pytest.raises(ShapeError, match=f"a {kind} mixer has no query/key/value form"):
        implied_attention(model.blocks[0].mixer, torch.randn(1, 5, 16))
    with pytest.raises(AttnSpecError, match=f"block 0's {kind} mixer is not linear in its values"):
        check_decomposable(model)


def test_the_map_of_lightning_attention_weighs_the_activated_values():
    """MiniMax's SiLU on v: the implied attention is the weights on silu(v), not on silu(I)."""
    from attnspec.diagnostics.attention import implied_attention
    from attnspec.nn.model import build_model_from_spec
    from attnspec.spec import load_spec

    base = {"kind": "linear", "heads": 2, "feature_map": "silu", "normalize": False,
            "transition": {"kind": "fixed", "init": "alibi", "learnable": False}}
    maps = []
    for activation in ("silu", "none"):
        spec = load_spec({"name": "m", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 16, "max_len": 16,
                          "layers": [{"mixer": {**base, "value_activation": activation}}]})
        torch.manual_seed(0)
        maps.append(implied_attention(build_model_from_spec(spec).blocks[0].mixer, torch.randn(1, 7, 16))[0])
    assert torch.equal(maps[0], maps[1])
