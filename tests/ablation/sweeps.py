"""Toy sweeps for the ablation tests: one softmax block of width 16 on MQAR, a few steps per run."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = str(ROOT / "specs" / "softmax-transformer.yaml")

TINY_SWEEP = {
    "name": "toy",
    "base": BASE,
    "set": {"d_model": 16, "max_len": 16, "input.vocab_size": 32, "position": "learned", "layers[0].repeat": 1,
            "blocks[*].mixer.heads": 2},
    "variants": {
        "softmax": {},
        "linear": {"blocks[*].mixer": {"kind": "linear", "heads": 2, "feature_map": "elu1"}},
    },
    "tasks": [{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32}, "grid": {"num_kv_pairs": [2]}}],
    "seeds": [0],
    "lr": [0.003],
    "train": {"steps": 20, "batch_size": 8, "eval_every": 10, "test_examples": 16},
}


def sweep(**changes) -> dict:
    """The toy sweep with top-level ``changes`` (``train`` is merged, not replaced)."""
    data = copy.deepcopy(TINY_SWEEP)
    for key, value in changes.items():
        data[key] = {**data[key], **value} if key == "train" else value
    return data


def write_sweep(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump(sweep(**changes), sort_keys=False))
    return path
