"""Accuracy by memory span: Memory Horizon's spans are the list lengths its answers are computed
from, every answer falls in exactly one bin, and the command groups a sweep's runs by variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.diagnostics.span import correct_by_span, span_edges
from attnspec.training.tasks import IGNORE, MemoryHorizonTask, MqarTask

ROOT = Path(__file__).resolve().parents[2]


def test_memory_horizon_spans_count_the_numbers_since_the_last_reset():
    task = MemoryHorizonTask(kind="memory_horizon", seq_len=40, resets=3)
    inputs, targets = task.batch("test", 0, 16, 0)
    spans = task.answer_spans(inputs)
    reset = task.max_number + 1
    for row in range(16):
        since = 0
        for t in range(40):
            since = 0 if inputs[row, t] == reset else since + 1
            assert spans[row, t] == since
    assert torch.equal(spans == 0, targets == IGNORE)  # resets carry no answer and no span
    assert MqarTask(kind="mqar", seq_len=32).answer_spans(inputs) is None


def test_every_answer_falls_in_one_bin():
    task = MemoryHorizonTask(kind="memory_horizon", seq_len=50, resets=2)
    inputs, targets = task.batch("test", 0, 8, 0)
    edges = span_edges(50, 16)
    assert edges == [1, 17, 33, 49, 51]

    class Oracle(torch.nn.Module):  # answers right everywhere: correct == answers in every bin
        def forward(self, x):
            return torch.nn.functional.one_hot(targets.clamp_min(0), task.modulus).double()

    counts = correct_by_span(Oracle(), inputs, targets, task.answer_spans(inputs), edges)
    assert sum(answers for _, answers in counts) == int((targets != IGNORE).sum())
    assert all(correct == answers for correct, answers in counts)


@pytest.mark.slow
def test_span_command_groups_a_sweep_by_variant(tmp_path: Path):
    sweep = {"name": "span", "base": str(ROOT / "specs" / "gateloop.yaml"),
             "set": {"layers[0].repeat": 1, "max_len": 32, "blocks[*].mixer.heads": 4,
                     "blocks[*].mixer.transition.per": "head"},
             "variants": {"data": {}, "fixed": {"blocks[*].mixer.transition": {"kind": "fixed", "init": "retnet",
                                                                                 "per": "head"}}},
             "tasks": [{"task": {"kind": "memory_horizon", "seq_len": 32}}], "seeds": [0], "lr": [0.003],
             "train": {"steps": 2, "batch_size": 4, "eval_every": 0, "test_examples": 4}}
    outcome = attnspec.ablate(sweep, tmp_path / "runs", workers=2, threads=1)
    assert outcome.ran == 2 and not outcome.failed
    result = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "span", str(tmp_path / "runs"),
                             "-o", str(tmp_path / "s"), "--samples", "8", "--bin", "8"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "s" / "span.csv").read_text().splitlines()
    assert lines[0] == "label,span_low,span_high,answers,runs,accuracy_mean,accuracy_std"
    assert {line.split(",")[0] for line in lines[1:]} == {"data", "fixed"}
    assert {p.name for p in (tmp_path / "s").iterdir()} == {"span.csv", "span.png", "span.svg", ".attnspec-diagnostics"}
    refused = subprocess.run([sys.executable, "-m", "attnspec", "diagnose", "span", str(tmp_path),
                              "-o", str(tmp_path / "t")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "neither a spec file, a run directory" in refused.stderr
