"""``attnspec eval`` on text: the zero-shot formats (HellaSwag, PIQA, ARC, LAMBADA) read as lm-eval prompts
them, requests scored in padded batches exactly as alone, a text file's perplexity over a sliding window
against a direct computation, and a build that carries its tokenizer taking text in ``run`` and ``eval``.

Float64 models; log-likelihoods within 1e-9 (batched and alone differ in summation order only).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

import attnspec
from attnspec.training.eval_formats import as_request
from attnspec.training.evaluate import Request, evaluate_file, evaluate_text, score_batch
from attnspec.training.tasks.base import TaskError
from tests.conftest import ROOT
from tests.test_cli import attnspec as run_cli
from tests.training.test_text_corpus import train_tokenizer, write_corpus


def attnspec_cli(*args: str, expect: int = 0):
    """The CLI in a child process: its exit status checked, never a traceback."""
    result = run_cli(*args)
    assert result.returncode == expect, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return result


def _model(vocab: int = 300, max_len: int = 24):
    torch.manual_seed(0)
    model = attnspec.build(ROOT / "specs" / "hybrid.yaml", "d_model=32", f"max_len={max_len}",
                           f"input.vocab_size={vocab}", "dtype=float64")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def test_released_formats_become_lm_eval_prompts():
    hellaswag = as_request({"activity_label": "Baking", "ctx_a": "She mixes flour.", "ctx_b": "then she",
                            "endings": ["bakes it [title] Done.", "sings"], "label": "0"}, "hellaswag", "x")
    assert hellaswag == {"context": "Baking: She mixes flour. Then she", "choices": [" bakes it. Done.", " sings"],
                         "label": 0}
    piqa = as_request({"goal": "Open a jar", "sol1": "twist", "sol2": "shout", "label": 0}, "piqa", "x")
    assert piqa["context"] == "Question: Open a jar\nAnswer:" and piqa["choices"] == [" twist", " shout"]
    arc = as_request({"question": "Which is hot?", "choices": {"text": ["ice", "fire"], "label": ["A", "B"]},
                      "answerKey": "B"}, "arc", "x")
    assert arc["label"] == 1 and arc["choices"] == [" ice", " fire"]
    lambada = as_request({"text": "the cat sat on the mat"}, "lambada", "x")
    assert lambada == {"context": "the cat sat on the", "continuation": " mat"}
    with pytest.raises(TaskError, match="answerKey"):
        as_request({"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}, "arc",
                   "f:3")
    for label in ("\u00b2", "9" * 5000, "-1", " 1 ", "٣"):  # a superscript two, past int's digits, negative, Arabic 3
        line = {"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["d", "e"], "label": label}
        if label == " 1 ":
            assert as_request(line, "hellaswag", "x")["label"] == 1
            continue
        with pytest.raises(TaskError, match=r"f:3: `label` must be the index of the right choice, 0 to 1"):
            as_request(line, "hellaswag", "f:3")


def test_padded_batches_score_every_request_as_it_would_alone():
    model = _model()
    generator = torch.Generator().manual_seed(1)
    requests = [Request(torch.randint(0, 300, (n,), generator=generator).tolist(),
                        torch.randint(0, 300, (m,), generator=generator).tolist(), 0)
                for n, m in ((3, 2), (11, 5), (1, 1), (20, 4), (7, 9))]  # the longest is cut to max_len + 1
    batched = score_batch(model, requests)
    for request, together in zip(requests, batched):
        alone = score_batch(model, [request])[0]
        assert abs(together.loglikelihood - alone.loglikelihood) < 1e-9
        assert (together.greedy, together.scored, together.truncated) == (alone.greedy, alone.scored, alone.truncated)


@pytest.mark.parametrize("stride", [None, 5])
def test_text_perplexity_equals_a_direct_window_by_window_computation(tmp_path, stride):
    model = _model(vocab=256, max_len=16)
    text = "The quick brown fox jumps over the lazy dog; then it naps. " * 2
    (tmp_path / "text.txt").write_text(text)
    result = evaluate_text(model, tmp_path / "text.txt", stride=stride, batch_size=3)
    ids = list(text.encode())
    width, step = 16, stride or 16
    total, scored, begin = 0.0, 0, 0
    while scored < len(ids) - 1:  # each target once, in the first window that predicts it
        end = min(begin + width, len(ids) - 1)
        first = max(0, end - width)  # the last window reaches back a whole width, as lm-eval's
        with torch.no_grad():
            logits = model(torch.tensor([ids[first:end]]))[0].double()
        for t in range(scored, end):
            total += float(F.log_softmax(logits[t - first], -1)[ids[t + 1]])
        scored, begin = end, begin + step
    assert result.tokens == len(ids) - 1 and abs(result.loglikelihood - total) < 1e-9
    assert math.isclose(result.bits_per_byte, -total / (len(ids) * math.log(2)))
    words = len(re.split(r"\s+", text))  # lm-eval's count (a trailing space makes an empty last word)
    assert math.isclose(result.word_perplexity, math.exp(-total / words))


@pytest.mark.slow
def test_a_build_carries_its_tokenizer_into_run_and_eval(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", corpus, vocab=300)
    build = tmp_path / "build"
    attnspec_cli("build", str(ROOT / "specs" / "softmax-transformer.yaml"), "-o", str(build), "--no-compile",
                 "--no-calibrate", "--set", "d_model=32", "--set", "layers[0].repeat=1", "--set", "max_len=32",
                 "--set", "input.vocab_size=300", "--tokenizer", str(tokenizer))
    assert (build / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    ran = attnspec_cli("run", str(build), "--text", "the cat sat", "--generate", "3")
    assert "text: the cat sat" in ran.stdout
    lines = [{"context": "the cat", "choices": [" sat on a mat", " rivers songs"], "label": 0},
             {"context": "small birds", "continuation": " sang"}]
    (tmp_path / "task.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    scored = json.loads(attnspec_cli("eval", str(build), "--task", str(tmp_path / "task.jsonl"), "--json").stdout)
    assert scored["questions"] == 1 and scored["requests"] == 3
    (tmp_path / "text.txt").write_text("the cat sat on a mat while dogs ran past quiet rivers.")
    text = json.loads(attnspec_cli("eval", str(build), "--text", str(tmp_path / "text.txt"), "--json").stdout)
    assert text["tokens"] >= 5 and text["perplexity"] > 1
    (build / "tokenizer.json").write_text((build / "tokenizer.json").read_text().replace("cat", "cot", 1))
    refused = attnspec_cli("run", str(build), "--text", "the cat", expect=2)
    assert "does not match the sha256" in refused.stderr or "not the tokenizer" in refused.stderr


def test_text_without_a_tokenizer_is_refused_by_name(tmp_path):
    build = tmp_path / "build"
    model = attnspec.build(ROOT / "specs" / "softmax-transformer.yaml", "d_model=32", "layers[0].repeat=1",
                           "max_len=24", "input.vocab_size=300")
    attnspec.save(model, build, compile_check=False)
    refused = attnspec_cli("run", str(build), "--text", "hello", expect=2)
    assert "carries no tokenizer" in refused.stderr
    (tmp_path / "task.jsonl").write_text(json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}) + "\n")
    result = evaluate_file(model.eval(), tmp_path / "task.jsonl", task_format="piqa")  # text as UTF-8 bytes
    assert result.questions == 1 and result.chance == 0.5


@pytest.mark.parametrize("length", [2, 16, 17, 40, 47])
def test_text_windows_are_lm_eval_s_rolling_windows(tmp_path, length):
    """With the default stride, the windows and what each scores are lm-eval's own
    (``get_rolling_token_windows`` + ``make_disjoint_window``, then ``_loglikelihood_tokens``' cut to
    ``max_length + 1``), the first id as its prefix token: one window, an exact fit, one past, and the
    last window reaching back a whole ``max_len``."""
    rolling = pytest.importorskip("lm_eval.utils")
    model = _model(vocab=256, max_len=16)
    text = ("The quick brown fox jumps over the lazy dog; " * 3)[:length]
    (tmp_path / "text.txt").write_text(text)
    ids = list(text.encode())
    total = 0.0
    windows = list(map(rolling.make_disjoint_window, rolling.get_rolling_token_windows(ids[1:], ids[0], 16, 1)))
    for context, continuation in windows:
        inputs = (context + continuation)[-(16 + 1):][:-1]
        with torch.no_grad():
            logits = model(torch.tensor([inputs]))[0].double()[-len(continuation):]
        total += float(F.log_softmax(logits, -1).gather(1, torch.tensor(continuation)[:, None]).sum())
    result = evaluate_text(model, tmp_path / "text.txt", batch_size=2)
    assert result.windows == len(windows) and abs(result.loglikelihood - total) < 1e-9


def test_a_float32_model_s_scores_are_within_the_stated_error_of_float64_of_its_logits(tmp_path):
    """A float32 model's log-probabilities are log-softmaxed in float32 (as lm-eval does): each within
    LOGPROB_ERROR of float64's log-softmax of the same logits, and the greedy matches the same."""
    from attnspec.training.evaluate import LOGPROB_ERROR

    model = _model(vocab=256, max_len=64).float()
    text = "Softmax attention over a vocabulary: every token's logit counts in the normaliser. " * 2
    (tmp_path / "text.txt").write_text(text)
    ids = list(text.encode())
    result = evaluate_text(model, tmp_path / "text.txt")
    total = 0.0
    for begin in range(0, len(ids) - 1, 64):  # disjoint windows, the last reaching back 64
        end = min(begin + 64, len(ids) - 1)
        first = max(0, end - 64)
        with torch.no_grad():
            logits = model(torch.tensor([ids[first:end]]))[0].double()
        total += float(F.log_softmax(logits[begin - first:], -1).gather(
            1, torch.tensor(ids[begin + 1:end + 1])[:, None]).sum())
    assert result.windows == 3 and abs(result.loglikelihood - total) <= LOGPROB_ERROR * result.tokens
    assert result.loglikelihood != total  # float32 indeed: the comparison is not float64 with itself
