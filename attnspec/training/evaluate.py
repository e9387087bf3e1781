"""``attnspec eval``: log-likelihood and accuracy of a trained model on a local task file.

The two request types of lm-evaluation-harness, on a JSON-lines file (one request per line):

* ``{"context": C, "continuation": X}``: the log-likelihood of X after C, and whether greedy
  decoding would produce X (lm-eval's ``loglikelihood``); reported as the mean log-likelihood,
  the perplexity over all continuation tokens, and the share of exact greedy matches;
* ``{"context": C, "choices": [X0, X1, ...], "label": i}``: multiple choice, right when the
  label's choice has the highest log-likelihood (``accuracy``) or the highest per token
  (``accuracy_norm``); chance is the mean of 1 / choices.

C and X are lists of token ids, or strings read as UTF-8 bytes (the ``bytes`` task's tokens; the
model's vocabulary must hold 256). A request longer than ``max_len`` keeps its last ``max_len``
tokens (the context is cut from the left, as lm-eval does; a continuation longer than that loses its
first tokens, which are counted and left out of every per-token figure). Nothing is downloaded; the file is the
user's and is only read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnspec.errors import shorten
from attnspec.io import _refuse_constant  # NaN and Infinity are no JSON numbers
from attnspec.training.tasks.base import TaskError

MAX_TASK_BYTES = 256 << 20
MAX_REQUESTS = 1_000_000
MAX_LINE_BYTES = 8 << 20
"""One request's line (a context of a million token ids fits)."""
MAX_CHOICES = 4096
"""Choices of one multiple-choice question."""


@dataclass
class Request:
    """One scored continuation (multiple-choice lines make one per choice)."""

    context: list[int]
    continuation: list[int]
    line: int


@dataclass
class EvalResult:
    """What ``attnspec eval`` reports. Fields are None where the file has no request of that type."""

    requests: int = 0
    mean_loglikelihood: float | None = None
    perplexity: float | None = None
    greedy_accuracy: float | None = None
    questions: int = 0
    accuracy: float | None = None
    accuracy_norm: float | None = None
    chance: float | None = None
    truncated: int = 0
    """Requests cut to ``max_len`` (their context, and where it is not enough their continuation's start)."""
    continuation_tokens_cut: int = 0
    """Continuation tokens left unscored because a continuation alone was longer than ``max_len``;
    the perplexity and per-token scores divide by the tokens scored."""


def _tokens(value, vocab: int, where: str, name: str) -> list[int]:
    if isinstance(value, str):
        if vocab < 256:
            raise TaskError(f"{where}: `{name}` is text, read as UTF-8 bytes, but the model's vocabulary has {vocab} "
                            "tokens (bytes need 256); give token ids")
        return list(value.encode("utf-8"))
    if not isinstance(value, list) or not all(type(t) is int and 0 <= t < vocab for t in value):
        raise TaskError(f"{where}: `{name}` must be text or a list of token ids in [0, {vocab}), got "
                        f"{shorten(value)}")
    return value


def read_task_file(path: Path | str, vocab: int) -> tuple[list[Request], list[tuple[list[int], int, int]]]:
    """The requests of a task file, and the multiple-choice questions as (indices of their choices'
    requests, label, line). Raises TaskError naming the line of the first malformed request.

    The file is streamed line by line (lines end at ``\\n`` only: U+2028 and its kin are valid inside
    JSON strings), each line bounded before it is parsed (:data:`MAX_LINE_BYTES`, and at most
    :data:`MAX_CHOICES` lists, counted from its brackets), and requests are counted as they are read,
    so no file makes this allocate more than its limits allow."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such file; give a JSON-lines task file")
    if path.stat().st_size > MAX_TASK_BYTES:
        raise TaskError(f"{path}: larger than {MAX_TASK_BYTES:,} bytes")
    requests: list[Request] = []
    questions: list[tuple[list[int], int, int]] = []
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
                _read_request(raw, f"{path}:{number}", number, vocab, requests, questions)
                if len(requests) > MAX_REQUESTS:
                    raise TaskError(f"{path}: more than {MAX_REQUESTS:,} requests")
    except OSError as error:
        raise TaskError(f"{path}: cannot be read ({shorten(str(error), 120)})") from None
    if not requests:
        raise TaskError(f"{path}: holds no request")
    return requests, questions


def _read_request(raw: bytes, where: str, number: int, vocab: int, requests: list[Request],
                  questions: list[tuple[list[int], int, int]]) -> None:
    """Append the request(s) of one line ``raw`` (multiple choice: one per choice, and the question)."""
    if len(raw) > MAX_LINE_BYTES:
        raise TaskError(f"{where}: the line is longer than {MAX_LINE_BYTES:,} bytes")
    if raw.count(b"[") > MAX_CHOICES + 2:  # a bound on the lists json.loads would build, before it builds them
        raise TaskError(f"{where}: more than {MAX_CHOICES:,} lists on one line; a question has at most "
                        f"{MAX_CHOICES:,} choices")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TaskError(f"{where}: not UTF-8 text ({shorten(str(error), 120)})") from None
    if not text.strip():
        return
    try:
        item = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise TaskError(f"{where}: not a JSON object ({shorten(str(error), 80)})") from None
    if not isinstance(item, dict) or "context" not in item:
        raise TaskError(f"{where}: a request is an object with `context` and `continuation` or `choices`")
    context = _tokens(item["context"], vocab, where, "context")
    if not context:
        raise TaskError(f"{where}: `context` is empty; a continuation is scored after at least one token")
    if "choices" in item:
        choices, label = item["choices"], item.get("label")
        if not isinstance(choices, list) or len(choices) < 2:
            raise TaskError(f"{where}: `choices` must list at least two continuations")
        if type(label) is not int or not 0 <= label < len(choices):
            raise TaskError(f"{where}: `label` must be the index of the right choice, 0 to {len(choices) - 1}")
        first = len(requests)
        for index, choice in enumerate(choices):
            requests.append(Request(context, _nonempty(choice, vocab, where, f"choices[{index}]"), number))
        questions.append((list(range(first, len(requests))), label, number))
    elif "continuation" in item:
        requests.append(Request(context, _nonempty(item["continuation"], vocab, where, "continuation"), number))
    else:
        raise TaskError(f"{where}: a request needs `continuation` or `choices`")


def _nonempty(value, vocab: int, where: str, name: str) -> list[int]:
    tokens = _tokens(value, vocab, where, name)
    if not tokens:
        raise TaskError(f"{where}: `{name}` is empty")
    return tokens


@dataclass
class Score:
    """One request's result: the log-likelihood of its ``scored`` continuation tokens (all of them,
    unless the continuation alone is longer than ``max_len``: then its first tokens are cut and
    ``cut`` counts them), and whether greedy decoding gives those tokens."""

    loglikelihood: float
    greedy: bool
    truncated: bool
    scored: int
    cut: int


@torch.no_grad()
def score(model, request: Request) -> Score:
    """Score one request on ``model`` (a token LM): the sequence keeps its last ``max_len + 1`` tokens
    (the context is cut from the left first, as lm-eval does)."""
    sequence = request.context + request.continuation
    limit = model.spec.max_len + 1  # inputs are all tokens but the last
    truncated = len(sequence) > limit
    sequence = sequence[-limit:]
    n = min(len(request.continuation), len(sequence) - 1)
    tokens = torch.tensor([sequence], dtype=torch.long, device=model.embed.weight.device)
    logits = model(tokens[:, :-1])[0, -n:].double()
    targets = tokens[0, -n:]
    loglikelihood = float(F.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).sum())
    return Score(loglikelihood, bool((logits.argmax(-1) == targets).all()), truncated, n,
                 len(request.continuation) - n)


def evaluate_file(model, path: Path | str, on_request=None) -> EvalResult:
    """Score every request of the task file ``path`` with ``model`` (a causal token LM, eval mode).

    ``on_request(done, total)`` is called after each request (the CLI's progress bar)."""
    spec = model.spec
    if spec.input.kind != "tokens" or spec.head.kind != "lm":
        raise TaskError("attnspec eval scores continuations: the model needs token input and an lm head")
    if any(not block.mixer.causal for block in model.blocks):
        raise TaskError("attnspec eval scores continuations left to right: every mixer must be causal")
    requests, questions = read_task_file(path, spec.input.vocab_size)
    scores = []
    for index, request in enumerate(requests):
        scores.append(score(model, request))
        if on_request is not None:
            on_request(index + 1, len(requests))
    result = EvalResult(requests=len(requests), truncated=sum(s.truncated for s in scores),
                        continuation_tokens_cut=sum(s.cut for s in scores))
    in_questions = {i for choices, _, _ in questions for i in choices}
    single = [i for i in range(len(requests)) if i not in in_questions]
    if single:
        total = sum(scores[i].loglikelihood for i in single)
        tokens = sum(scores[i].scored for i in single)  # the tokens scored, not those cut
        result.mean_loglikelihood = total / len(single)
        result.perplexity = math.exp(-total / tokens)
        result.greedy_accuracy = sum(scores[i].greedy for i in single) / len(single)
    if questions:
        right = right_norm = 0
        for choices, label, _ in questions:
            values = [scores[i].loglikelihood for i in choices]
            per_token = [scores[i].loglikelihood / scores[i].scored for i in choices]
            right += max(range(len(values)), key=values.__getitem__) == label
            right_norm += max(range(len(per_token)), key=per_token.__getitem__) == label
        result.questions = len(questions)
        result.accuracy, result.accuracy_norm = right / len(questions), right_norm / len(questions)
        result.chance = sum(1 / len(choices) for choices, _, _ in questions) / len(questions)
    return result
