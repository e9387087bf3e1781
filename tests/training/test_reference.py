"""Proof that training works, against a reference nobody here tuned: attnspec's softmax Transformer
vs a plain nanoGPT written in tests/training/reference.py, on MQAR with the same data (seeded
batches from the same task), optimiser (AdamW, warm-up + cosine, clip 1) and budget.

Setting (small enough for the CPU CI, hard enough to need an induction circuit): 2 layers,
d_model 64, 2 heads, learned positions, MQAR with seq_len 32, vocabulary 64, 2 key-value pairs,
batch 64, lr 1e-3 (the reference's better rate of {1e-3, 3e-3}), evaluation every 100 steps
on 256 test examples. Measured on the 2-core machine (2026-11-24, attnspec's default tied-head scale
1/d_model): the reference reaches 99% at step 1300, attnspec at step 400 (with the unscaled head of
spec version 1 it took 600, measured before the scale existed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.training.config import load_config

from tests.training.reference import NanoGPT, train_reference

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["d_model=64", "layers[0].repeat=2", "max_len=32", "input.vocab_size=64", "layers[0].layers[0].mixer.heads=2"]
TASK = ["seq_len=32", "vocab_size=64", "num_kv_pairs=2"]
BUDGET = {"batch_size": 64, "lr": 1e-3, "warmup_steps": 100, "weight_decay": 0.1, "betas": [0.9, 0.98],
          "eval_every": 100, "test_examples": 256, "seed": 0}
MAX_STEPS = 1500


@pytest.mark.slow
def test_softmax_spec_solves_mqar_within_1_2x_the_reference_steps(record_property):
    task = load_config(task="mqar", task_overrides=TASK).task
    torch.manual_seed(0)
    reference = NanoGPT(64, 64, 2, 2, 32)
    ref_steps, ref_accuracy = train_reference(reference, task, steps=MAX_STEPS, target=0.99,
                                              **{k: v for k, v in BUDGET.items() if k not in ("warmup_steps", "lr")},
                                              lr=BUDGET["lr"], warmup=BUDGET["warmup_steps"])
    assert ref_steps is not None, f"the reference did not solve MQAR in {MAX_STEPS} steps ({ref_accuracy:.3f})"
    run = attnspec.train(ROOT / "specs" / "softmax-transformer.yaml", overrides=[*MODEL, "position=learned"],
                         task="mqar", task_overrides=TASK, steps=MAX_STEPS, target=0.99, **BUDGET)
    record_property("reference_steps", ref_steps)
    record_property("attnspec_steps", run.step)
    assert run.metrics["accuracy"] >= 0.99, run.metrics
    assert run.step <= 1.2 * ref_steps, (run.step, ref_steps)

    # The steps softmax needed, for a linear-attention spec with a short convolution: reported, not
    # required to solve the task (linear attention's fixed-size state is what MQAR probes).
    linear = attnspec.train(ROOT / "specs" / "linear-elu.yaml",
                            overrides=[*MODEL, "position=learned", "layers[0].layers[0].mixer.conv=short"],
                            task="mqar", task_overrides=TASK, steps=run.step, **BUDGET)
    record_property("linear_conv_accuracy", linear.metrics["accuracy"])
    print(f"\nMQAR steps to 99%: reference {ref_steps}, attnspec softmax {run.step}; "
          f"linear-elu + short conv after {run.step} steps: accuracy {linear.metrics['accuracy']:.3f}")
    assert linear.metrics["accuracy"] > 2 / 32, "above chance (1/32 values)"
