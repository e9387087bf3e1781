"""Tasks: each generator against a plain Python statement of its definition, determinism, splits,
and the text tasks' file handling (the user's files are only read)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnspec.errors import SpecError
from attnspec.training.config import load_config
from attnspec.training.tasks import IGNORE, TaskError


def task(kind, *sets):
    return load_config(task=kind, task_overrides=list(sets)).task


def test_mqar_answers_are_the_values_of_the_queried_keys():
    mqar = task("mqar", "seq_len=64", "vocab_size=128", "num_kv_pairs=6")
    inputs, targets = mqar.batch("train", 3, 50, seed=1)
    assert inputs.shape == targets.shape == (50, 64)
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        pairs = dict(zip(row_in[0:12:2], row_in[1:12:2]))
        assert len(pairs) == 6 and all(1 <= k < 64 for k in pairs) and all(64 <= v < 128 for v in pairs.values())
        answered = [(t, v) for t, v in enumerate(row_out) if v != IGNORE]
        assert len(answered) == 6
        for t, value in answered:
            assert t >= 12 and (t - 12) % 2 == 0 and pairs[row_in[t]] == value
    again = mqar.batch("train", 3, 50, seed=1)
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)
    assert not torch.equal(mqar.batch("train", 4, 50, seed=1)[0], inputs)
    assert not torch.equal(mqar.batch("test", 3, 50, seed=1)[0], inputs)


def test_mqar_query_gaps_follow_the_power_law():
    mqar = task("mqar", "seq_len=256", "vocab_size=512", "num_kv_pairs=4", "power_a=0.01")
    _, targets = mqar.batch("train", 0, 400, seed=0)
    gaps = [(t - 8) // 2 for row in targets.tolist() for t, v in enumerate(row) if v != IGNORE]
    # p(gap) ~ gap^(a-1): the first quarter of the gaps holds far more than a quarter of the queries
    assert sum(g < 31 for g in gaps) / len(gaps) > 0.5


def _memory_horizon_reference(numbers, modulus):
    """GateLoop App. A, as the digest interprets it, in plain Python."""
    k = len(numbers)
    total, sign = 0, 1
    for i in range(k // 2):
        total += sign * numbers[i] * numbers[k - 1 - i]
        sign = -sign
    if k % 2:
        total += sign * numbers[k // 2]
    return total % modulus


def test_memory_horizon_matches_the_definition():
    horizon = task("memory_horizon", "seq_len=41", "resets=3")
    inputs, targets = horizon.batch("train", 0, 20, seed=5)
    reset = horizon.max_number + 1
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        assert row_in.count(reset) == 3
        current = []
        for token, target in zip(row_in, row_out):
            if token == reset:
                current = []
                assert target == IGNORE
                continue
            current.append(token)
            assert target == _memory_horizon_reference(current, 51)


def test_selective_copying_and_induction_heads():
    copying = task("selective_copying", "seq_len=40", "num_tokens=5", "vocab_size=10")
    inputs, targets = copying.batch("train", 0, 30, seed=0)
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        content = [t for t in row_in[:35] if t != 0]
        assert len(content) == 5 and row_in[35:] == [1] * 5 and row_out[35:] == content
        assert row_out[:35] == [IGNORE] * 35
    heads = task("induction_heads", "seq_len=30", "vocab_size=12")
    inputs, targets = heads.batch("train", 0, 30, seed=0)
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        first = row_in.index(1)
        assert row_in.count(1) == 2 and row_in[-1] == 1 and row_out[-1] == row_in[first + 1]
        assert row_out[:-1] == [IGNORE] * 29


def test_bytes_task_reads_a_directory_and_splits_validation(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"world " * 200)
    (tmp_path / "a.txt").write_bytes(b"hello " * 200)
    (tmp_path / ".hidden").write_bytes(b"\xff" * 5000)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    text = task("bytes", f"path={tmp_path}", "seq_len=16", "val_fraction=0.25")
    inputs, targets = text.batch("train", 0, 8, seed=0)
    assert inputs.shape == (8, 16) and torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.max()) < 255, "hidden files are skipped"
    test_inputs, _ = text.batch("test", 0, 4, seed=0)
    assert bytes(test_inputs[0].tolist()).decode().strip("world ") == ""  # the last quarter: b.txt's words
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_tokens_task_memory_maps_nanogpt_files(tmp_path):
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    (np.arange(300, dtype=np.uint16) % 7).tofile(tmp_path / "val.bin")
    tokens = task("tokens", f"path={tmp_path}", "vocab_size=1000", "seq_len=10")
    inputs, targets = tokens.batch("train", 2, 6, seed=0)
    assert torch.equal(targets, inputs + 1), "consecutive ids: the target is the next token"
    small = task("tokens", f"path={tmp_path}", "vocab_size=500", "seq_len=10")
    with pytest.raises(TaskError, match="not below vocab_size"):
        for step in range(50):
            small.batch("train", step, 16, seed=0)
    (tmp_path / "val.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(TaskError, match="whole number"):
        task("tokens", f"path={tmp_path}", "vocab_size=1000", "seq_len=10").batch("test", 0, 1, 0)


def test_missing_files_and_bad_parameters_are_clear_errors(tmp_path):
    with pytest.raises(TaskError, match="no such file"):
        task("bytes", f"path={tmp_path / 'nope'}").batch("train", 0, 1, 0)
    with pytest.raises(TaskError, match="missing"):
        task("tokens", f"path={tmp_path}", "vocab_size=10").batch("train", 0, 1, 0)
    with pytest.raises(SpecError, match="vocab_size"):
        task("tokens", f"path={tmp_path}")  # vocab_size is required: nanoGPT's meta.pkl is never unpickled


def test_config_file_errors_are_located(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("task:\n  kind: mqar\n  seq_len: 64\nsteps: 10\nbatch_sise: 8\nlr: -1\n")
    with pytest.raises(SpecError) as error:
        load_config(config)
    text = str(error.value)
    assert f"{config}:5:1: batch_sise: unknown key 'batch_sise' (did you mean 'batch_size'?)" in text
    assert f"{config}:6:5: lr: must be greater than 0" in text


def test_a_plugin_task_is_registered_like_a_built_in():
    from typing import Literal

    from attnspec.spec.components import register
    from attnspec.training.tasks import Task

    class EchoTask(Task):
        """Predict the current token (a user's task)."""

        kind: Literal["test_echo"]
        seq_len: int = 8

        @property
        def vocab_size(self) -> int:
            return 10

        def sample(self, split, step, size, seed):
            from attnspec.training.tasks import generator

            x = torch.randint(0, 10, (size, self.seq_len), generator=generator(seed, split, step))
            return x, x

    register("task", EchoTask)
    echo = task("test_echo", "seq_len=12")
    assert isinstance(echo, EchoTask) and echo.seq_len == 12
    with pytest.raises(SpecError, match="did you mean 'test_echo'"):
        task("test_ecko")
