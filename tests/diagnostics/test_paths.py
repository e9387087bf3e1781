"""Path isolation: the sum over every path is the network's output (Theorem 2.1, float64), the
path counts are C(L, l) H^l, softmax paths are row-stochastic, models outside the theorem are
refused, and the command reports each length of a trained run with its references."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnspec
from attnspec.diagnostics.paths import (all_paths, count_paths, isolate, path_output, path_terms, sample_paths)
from attnspec.diagnostics.subject import random_inputs
from attnspec.errors import AttnSpecError


def _san_skip(mixer: dict, depth: int = 3, **extra) -> dict:
    block = {"mixer": {"heads": 2, "causal": False, **mixer}, "mlp": "none", "norm": "none", "residual": True}
    return {"name": "paths", "input": {"kind": "tokens", "vocab_size": 11}, "d_model": 12, "max_len": 9,
            "position": "learned", "dtype": "float64", "layers": [{"repeat": depth, "layers": [block]}],
            "final_norm": "layernorm", "head": {"kind": "lm", "tied": False}, **extra}


def _last_block_output(model, inputs):
    found = []
    handle = model.blocks[-1].register_forward_hook(lambda module, args, out: found.append(out.detach()))
    with torch.no_grad():
        model(inputs)
    handle.remove()
    return found[0]


@pytest.mark.parametrize("mixer", [
    {"kind": "softmax"},
    {"kind": "softmax", "causal": True},
    {"kind": "linear", "feature_map": "elu1"},  # any value-linear mixer decomposes, through its implied attention
    {"kind": "linear", "feature_map": "relu", "reweighting": {"kind": "cos", "M": 9}, "causal": True},
], ids=["softmax", "causal-softmax", "linear-elu", "cosformer"])
def test_the_sum_over_every_path_is_the_network_output(mixer):
    spec = attnspec.load_spec(_san_skip(mixer))
    model = attnspec.build(spec).eval()
    inputs = random_inputs(spec, 3, 9, seed=2)
    terms = path_terms(model, inputs)
    total = sum(path_output(terms, path) for path in all_paths(terms.depth, terms.heads))
    expected = _last_block_output(model, inputs)
    # float64 sums of 27 products of three 9x9 matrices: rounding is ~1e-15 relative
    assert torch.allclose(total, expected, rtol=0, atol=1e-10 * float(expected.abs().max()))


def test_path_counts_and_samples():
    for depth, heads in ((3, 2), (6, 2), (4, 3)):
        for length in range(depth + 1):
            paths = all_paths(depth, heads, length)
            assert len(paths) == count_paths(depth, heads, length) == math.comb(depth, length) * heads ** length
        assert sum(count_paths(depth, heads, l) for l in range(depth + 1)) == (heads + 1) ** depth
    rng = np.random.default_rng(0)
    sampled = sample_paths(6, 2, 3, 5, rng)
    assert len(set(sampled)) == 5 and all(sum(h > 0 for h in p) == 3 and max(p) <= 2 for p in sampled)
    with pytest.raises(AttnSpecError, match="sample them"):
        all_paths(12, 3)  # 4^12 paths
    assert sorted(sample_paths(6, 2, 1, 100, rng)) == sorted(all_paths(6, 2, 1))  # fewer than asked: all of them


def test_softmax_paths_are_row_stochastic():
    spec = attnspec.load_spec(_san_skip({"kind": "softmax"}))
    terms = path_terms(attnspec.build(spec).eval(), random_inputs(spec, 2, 9))
    for path in all_paths(terms.depth, terms.heads):
        product = torch.eye(9, dtype=torch.float64).expand(2, 9, 9)
        for layer, head in enumerate(path):
            if head:
                product = terms.attention[layer][:, head - 1] @ product
        assert product.min() >= 0 and torch.allclose(product.sum(-1), torch.ones(2, 9, dtype=torch.float64),
                                                     atol=1e-12)


@pytest.mark.parametrize("change, named", [
    ({"mlp": {"kind": "mlp"}}, "MLP"),
    ({"norm": "layernorm"}, "normalises"),
    ({"residual": False}, "no skip"),
])
def test_models_outside_the_theorem_are_refused_with_what_to_change(change, named):
    data = _san_skip({"kind": "softmax"})
    data["layers"][0]["layers"][0].update(change)
    spec = attnspec.load_spec(data)
    with pytest.raises(AttnSpecError, match=named):
        path_terms(attnspec.build(spec).eval(), random_inputs(spec, 1, 9))


def test_isolation_reports_every_length_and_the_references():
    spec = attnspec.load_spec(_san_skip({"kind": "softmax"}))
    model = attnspec.build(spec).eval()
    inputs = random_inputs(spec, 4, 9)
    targets = torch.randint(0, 11, (4, 9))
    targets[:, 0] = -100
    rows = isolate(model, inputs, targets, subsets=(2, 1000), repeats=3)
    lengths = [row.length for row in rows]
    assert lengths == [0, 1, 2, 3, 0, 1, 2, 3, -1, -2]
    assert all(0 <= row.accuracy_mean <= 1 for row in rows)
    every = [row for row in rows if row.subset == 1000]
    assert all(row.summed == row.paths and row.accuracy_std == 0 for row in every)  # all paths: one evaluation
    with torch.no_grad():
        full = (model(inputs).argmax(-1) == targets)[targets != -100].double().mean()
    assert rows[-2].accuracy_mean == pytest.approx(float(full))


@pytest.mark.slow
def test_paths_command_on_a_trained_sort_run(tmp_path: Path):
    run = tmp_path / "run"
    attnspec.train(_san_skip({"kind": "softmax"}, depth=2), output=run, task="sort", steps=3, batch_size=8,
                   eval_every=0, test_examples=8, task_overrides=["seq_len=8", "alphabet=10"])
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "paths", str(run), "-o", str(tmp_path / "p"),
                             "--samples", "16", "--subset", "2", "--repeats", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "full model" in result.stdout and "majority answer" in result.stdout
    lines = (tmp_path / "p" / "paths.csv").read_text().splitlines()
    assert lines[0] == "path_length,paths,subset,summed,accuracy_mean,accuracy_std"
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1", "2", "full model", "majority answer"]
    refused = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "paths",
                              str(Path(attnspec.__file__).parents[1] / "specs" / "rank-collapse-san.yaml"),
                              "-o", str(tmp_path / "q")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "trained" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "q").exists()
