"""examples/linearize/linearize.py at toy size: a softmax teacher trained on the Python documentation, linearized
into each student (a staged run: transfer, then a low-rank fine-tune) and trained from scratch, a row each."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import ROOT


@pytest.mark.slow  # nine tiny runs
def test_the_linearizing_example_trains_every_student_both_ways_and_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    source = importlib.util.spec_from_file_location("linearize", ROOT / "examples" / "linearize" / "linearize.py")
    example = importlib.util.module_from_spec(source)
    source.loader.exec_module(example)
    report = example.main([str(tmp_path / "out"), "--steps", "3", "--teacher-steps", "3", "--seeds", "1",
                           "--d-model", "16", "--seq-len", "32", "--vocab-size", "300"])
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(row["student"], row["how"]) for row in rows[1:]] == [
        (name, how) for name in ("lolcats", "gated-deltanet", "mamba2", "hybrid") for how in ("linearized", "scratch")]
    staged = json.loads((tmp_path / "out" / "runs" / "hybrid-linearized-0" / "run.json").read_text())
    assert [stage["objective"] for stage in staged["stages"]] == ["transfer", "lm"]
    assert staged["lora"]["adapted"] == [f"blocks.{i}.mixer.{p}_proj" for i in range(3) for p in ("k", "out", "q", "v")]
    assert staged["stages"][0]["metrics"]["objective"] > 0  # the transfer's own objective, at its end
    assert "| hybrid | linearized |" in report.read_text()
