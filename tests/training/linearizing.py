"""Shared by the linearizing tests (attention transfer, stages): a two-block softmax teacher trained here on MQAR,
and the student that swaps its second block's attention for linear attention."""

from __future__ import annotations

from pathlib import Path

import pytest

import attnspec

MQAR = ["seq_len=16", "vocab_size=32", "num_kv_pairs=2"]
SETTINGS = {"batch_size": 8, "eval_every": 0, "test_examples": 8, "lr": 3e-3}
LINEAR = {"kind": "linear", "heads": 2, "feature_map": "elu1", "position": {"kind": "rope"}}
FROZEN = ["embed.*", "final_norm.*", "blocks.0.*", "blocks.1.norm*", "blocks.1.mlp.*"]
"""Everything but the swapped block's mixer."""


def spec(second: dict | None = None, blocks: int = 2) -> dict:
    """``blocks`` pre-norm blocks of softmax attention and a GLU, the second's mixer ``second`` where given."""
    attention = {"kind": "softmax", "heads": 2, "position": {"kind": "rope"}}
    layers = [{"mixer": attention, "mlp": {"kind": "glu", "expansion": 2}, "norm": "rmsnorm"} for _ in range(blocks)]
    if second is not None:
        layers[1] = {**layers[1], "mixer": second}
    return {"name": "transfer", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 16,
            "layers": layers}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """The teacher: the softmax model trained 30 steps (a run directory)."""
    directory = tmp_path_factory.mktemp("teacher") / "run"
    attnspec.train(spec(), task="mqar", task_overrides=MQAR, output=directory, steps=30, **SETTINGS)
    return directory
