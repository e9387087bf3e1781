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
tokens (the context is cut from the left, as lm-eval does). Nothing is downloaded; the file is the
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
    requests, label, line). Raises TaskError naming the line of the first malformed request."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such file; give a JSON-lines task file")
    if path.stat().st_size > MAX_TASK_BYTES:
        raise TaskError(f"{path}: larger than {MAX_TASK_BYTES:,} bytes")
    requests: list[Request] = []
    questions: list[tuple[list[int], int, int]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(f"{path}: cannot be read as UTF-8 text ({shorten(str(error), 120)})") from None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        where = f"{path}:{number}"
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
        if len(requests) > MAX_REQUESTS:
            raise TaskError(f"{path}: more than {MAX_REQUESTS:,} requests")
    if not requests:
        raise TaskError(f"{path}: holds no request")
    return requests, questions


def _nonempty(value, vocab: int, where: str, name: str) -> list[int]:
    tokens = _tokens(value, vocab, where, name)
    if not tokens:
        raise TaskError(f"{where}: `{name}` is empty")
    return tokens


@torch.no_grad()
def score(model, request: Request) -> tuple[float, bool, bool]:
    """(log-likelihood of the continuation, whether greedy decoding gives it, whether it was cut to
    max_len) for one request on ``model`` (a token LM)."""
    sequence = request.context + request.continuation
    limit = model.spec.max_len + 1  # inputs are all tokens but the last
    truncated = len(sequence) > limit
    sequence = sequence[-limit:]
    n = min(len(request.continuation), len(sequence) - 1)
    tokens = torch.tensor([sequence], dtype=torch.long, device=model.embed.weight.device)
    logits = model(tokens[:, :-1])[0, -n:].double()
    targets = tokens[0, -n:]
    loglikelihood = float(F.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).sum())
    return loglikelihood, bool((logits.argmax(-1) == targets).all()), truncated


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
    result = EvalResult(requests=len(requests), truncated=sum(s[2] for s in scores))
    in_questions = {i for choices, _, _ in questions for i in choices}
    single = [i for i in range(len(requests)) if i not in in_questions]
    if single:
        total = sum(scores[i][0] for i in single)
        tokens = sum(len(requests[i].continuation) for i in single)
        result.mean_loglikelihood = total / len(single)
        result.perplexity = math.exp(-total / tokens)
        result.greedy_accuracy = sum(scores[i][1] for i in single) / len(single)
    if questions:
        right = right_norm = 0
        for choices, label, _ in questions:
            values = [scores[i][0] for i in choices]
            per_token = [scores[i][0] / len(requests[i].continuation) for i in choices]
            right += max(range(len(values)), key=values.__getitem__) == label
            right_norm += max(range(len(per_token)), key=per_token.__getitem__) == label
        result.questions = len(questions)
        result.accuracy, result.accuracy_norm = right / len(questions), right_norm / len(questions)
        result.chance = sum(1 / len(choices) for choices, _, _ in questions) / len(questions)
    return result
