"""``attnspec eval``: the scores of a task file against a direct float64 computation, multiple choice
with a known answer, a run directory as the subject, and malformed files refused by line."""

from __future__ import annotations

import json
import math

import pytest
import torch

import attnspec
from attnspec.training.evaluate import evaluate_file
from attnspec.training.rundir import load_trained
from attnspec.training.tasks.base import TaskError
from tests.conftest import ROOT
from tests.test_cli import attnspec as attnspec_cli

SPEC = ["d_model=32", "layers[0].repeat=2", "max_len=24", "input.vocab_size=300"]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    directory = tmp_path_factory.mktemp("eval") / "build"
    torch.manual_seed(0)
    attnspec.save(attnspec.build(ROOT / "specs" / "softmax-transformer.yaml", *SPEC).eval(), directory,
                  compile_check=False)
    return directory


def _write(path, lines) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_loglikelihoods_equal_a_direct_float64_computation(build, tmp_path):
    model = load_trained(build)
    requests = [{"context": [5, 6, 7], "continuation": [8, 9]}, {"context": "ab", "continuation": "cd"},
                {"context": list(range(40)), "continuation": [1, 2, 3]}]  # 43 tokens: cut to max_len + 1
    _write(tmp_path / "task.jsonl", requests)
    result = evaluate_file(model, tmp_path / "task.jsonl")
    double = load_trained(build).double()
    total, tokens, greedy = 0.0, 0, 0
    for request in requests:
        to_ids = (lambda v: list(v.encode()) if isinstance(v, str) else v)
        sequence = (to_ids(request["context"]) + to_ids(request["continuation"]))[-25:]
        n = len(to_ids(request["continuation"]))
        with torch.no_grad():
            logits = double(torch.tensor([sequence[:-1]]))[0, -n:]
        target = torch.tensor(sequence[-n:])
        total += float(torch.log_softmax(logits, -1)[torch.arange(n), target].sum())
        greedy += bool((logits.argmax(-1) == target).all())
        tokens += n
    assert result.requests == 3 and result.truncated == 1
    assert result.mean_loglikelihood == pytest.approx(total / 3, rel=1e-5)  # float32 model vs float64
    assert result.perplexity == pytest.approx(math.exp(-total / tokens), rel=1e-5)
    assert result.greedy_accuracy == greedy / 3
    assert result.questions == 0 and result.accuracy is None


def test_multiple_choice_picks_the_most_likely_choice(build, tmp_path):
    model = load_trained(build)
    questions = []
    for start in range(6):
        context = [start, start + 1, start + 2]
        with torch.no_grad():
            best = int(model(torch.tensor([context]))[0, -1].argmax())
        others = [t for t in (10, 11, 12) if t != best][:2]
        choices = [[others[0]], [best], [others[1]]]
        choices[1], choices[start % 3] = choices[start % 3], choices[1]  # the best one at the label
        questions.append({"context": context, "choices": choices, "label": start % 3})
    _write(tmp_path / "mc.jsonl", questions)
    result = evaluate_file(model, tmp_path / "mc.jsonl")
    assert result.questions == 6 and result.accuracy == 1.0 and result.accuracy_norm == 1.0
    assert result.chance == pytest.approx(1 / 3)
    assert result.mean_loglikelihood is None


@pytest.mark.parametrize("line, words", [
    ("{not json", ["task.jsonl:2", "JSON"]),
    ('{"context": [1], "continuation": [400]}', ["task.jsonl:2", "[0, 300)"]),
    ('{"context": [], "continuation": [1]}', ["task.jsonl:2", "empty"]),
    ('{"context": [1], "choices": [[1], [2]], "label": 2}', ["task.jsonl:2", "label"]),
    ('{"context": [1]}', ["task.jsonl:2", "continuation"]),
])
def test_a_malformed_request_is_refused_by_line(build, tmp_path, line, words):
    (tmp_path / "task.jsonl").write_text('{"context": [1], "continuation": [2]}\n' + line + "\n")
    with pytest.raises(TaskError) as caught:
        evaluate_file(load_trained(build), tmp_path / "task.jsonl")
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_the_cli_scores_a_run_directory_and_prints_json(tmp_path):
    run = attnspec.train(ROOT / "specs" / "softmax-transformer.yaml", overrides=[*SPEC, "position=learned"],
                         task="mqar", task_overrides=["seq_len=16", "vocab_size=32", "num_kv_pairs=2"],
                         output=tmp_path / "run", steps=4, batch_size=4, eval_every=4, test_examples=8)
    assert run.step == 4
    _write(tmp_path / "task.jsonl", [{"context": [1, 2, 3], "continuation": [4]}])
    result = attnspec_cli("eval", str(tmp_path / "run"), "--task", str(tmp_path / "task.jsonl"), "--json")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert scores["requests"] == 1 and scores["mean_loglikelihood"] < 0
    bad = attnspec_cli("eval", str(tmp_path / "run"), "--task", str(tmp_path / "missing.jsonl"))
    assert bad.returncode == 2 and "missing.jsonl" in bad.stderr and "Traceback" not in bad.stderr


def test_a_continuation_longer_than_max_len_is_scored_over_the_tokens_scored(build, tmp_path):
    """The audit's case: perplexity divided a cut continuation's log-likelihood by its full length
    (4.55 reported, 20.7 over the tokens scored)."""
    model = load_trained(build)
    continuation = [(7 * i) % 300 for i in range(30)]  # max_len 24: its first 6 tokens cannot be scored
    _write(tmp_path / "task.jsonl", [{"context": [1, 2], "continuation": continuation}])
    result = evaluate_file(model, tmp_path / "task.jsonl")
    sequence = ([1, 2] + continuation)[-25:]
    with torch.no_grad():
        logits = load_trained(build).double()(torch.tensor([sequence[:-1]]))[0]
    total = float(torch.log_softmax(logits, -1)[torch.arange(24), torch.tensor(sequence[1:])].sum())
    assert result.truncated == 1 and result.continuation_tokens_cut == 6
    assert result.perplexity == pytest.approx(math.exp(-total / 24), rel=1e-5)


def test_task_lines_end_at_newline_only_and_are_bounded_before_parsing(build, tmp_path):
    model = load_trained(build)
    # U+2028, U+2029 and U+0085 are valid inside JSON strings: not line ends
    (tmp_path / "task.jsonl").write_text(json.dumps({"context": "a\u2028b\u2029c\u0085d", "continuation": "e"},
                                                    ensure_ascii=False) + "\n", encoding="utf-8")
    assert evaluate_file(model, tmp_path / "task.jsonl").requests == 1
    # a question of a million choices was turned into objects before the request limit (4.5 GB)
    (tmp_path / "task.jsonl").write_text('{"context": [1], "label": 0, "choices": [' + "[1]," * 10 ** 6 + "[2]]}\n")
    with pytest.raises(TaskError, match="task.jsonl:1: more than 4,096 lists"):
        evaluate_file(model, tmp_path / "task.jsonl")
    (tmp_path / "task.jsonl").write_text('{"context": [' + "1," * (5 << 20) + '1], "continuation": [2]}\n')
    with pytest.raises(TaskError, match="task.jsonl:1: the line is longer than"):
        evaluate_file(model, tmp_path / "task.jsonl")
