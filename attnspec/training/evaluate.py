"""``attnspec eval``: log-likelihood and accuracy of a trained model on a local task file, and perplexity
over a text file.

The two request types of lm-evaluation-harness, on a JSON-lines file (one request per line; the common
zero-shot formats, HellaSwag, PIQA, ARC and LAMBADA, are read as these by :mod:`.eval_formats`):

* ``{"context": C, "continuation": X}``: the log-likelihood of X after C, and whether greedy
  decoding would produce X (lm-eval's ``loglikelihood``); reported as the mean log-likelihood,
  the perplexity over all continuation tokens, and the share of exact greedy matches;
* ``{"context": C, "choices": [X0, X1, ...], "label": i}``: multiple choice, right when the
  label's choice has the highest log-likelihood (``accuracy``) or the highest per token
  (``accuracy_norm``); chance is the mean of 1 / choices.

C and X are lists of token ids, or text: tokenised with the model's tokenizer where it has one
(:mod:`attnspec.tokenizer`), exactly as lm-eval's ``HFLM`` tokenises for a causal model: with the special
tokens the tokenizer's own template adds (Gemma's BOS), unless the text already begins with the prefix
token; context and continuation split as lm-eval splits them (the context's trailing spaces moved to the
continuation, the pair encoded whole); an empty text context is the prefix token alone (BOS where the
tokenizer has one, else EOS: lm-eval's ``prefix_token_id``). Without a tokenizer text is read as UTF-8
bytes (the ``bytes`` task's tokens; the model's vocabulary must hold 256). A request longer than ``max_len`` keeps its last ``max_len``
tokens (the context is cut from the left, as lm-eval does; a continuation longer than that loses its
first tokens, which are counted and left out of every per-token figure). Requests are scored in batches,
right-padded, the padding a document of its own (:mod:`attnspec.ops.documents`), so a request scores as
it would alone. Nothing is downloaded; the file is the user's and is only read.

:func:`evaluate_text` scores a whole text file (perplexity over a sliding window, bits per byte, word
perplexity), as lm-eval's ``loglikelihood_rolling`` does for WikiText: the same tokens (the template's
special tokens, the prefix token first), the same windows.

The logits are taken :data:`SCORE_POSITIONS` positions at a time from the head's input, so a window of
8,192 tokens never holds its (8,192, vocabulary) logits at once (1.6 GB at 49,152 ids in float32), and
log-softmaxed in float32 as lm-eval does (:data:`LOGPROB_ERROR` per token from float64's), summed in
float64.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.errors import AttnSpecError, check_whole, shorten
from attnspec.io import _refuse_constant  # NaN and Infinity are no JSON numbers
from attnspec.ops.documents import from_starts
from attnspec.spec import limits
from attnspec.training.config import MAX_BATCH
from attnspec.training.eval_formats import FORMATS, as_request
from attnspec.training.tasks.base import TaskError

MAX_TEXT_BYTES = 1 << 30
"""A text file :func:`evaluate_text` reads."""

MAX_TASK_BYTES = 256 << 20
MAX_REQUESTS = 1_000_000
MAX_LINE_BYTES = 8 << 20
"""One request's line (a context of a million token ids fits)."""
MAX_CHOICES = 4096
"""Choices of one multiple-choice question."""
SCORE_POSITIONS = 512
"""Positions whose logits are computed (and log-softmaxed, in float32; a float64 model's in float64) at once."""
LOGPROB_ERROR = 2e-6
"""What a token's float32 log-probability may differ from float64's of the same logits: the log-sum-exp
of a vocabulary's logits in float32 rounds to within a few units of 2^-24 of its magnitude (a few tens at
most: 2^-24 * 32 = 1.9e-6). Sums are taken in float64, so a text's log-likelihood is within
LOGPROB_ERROR per token of the float64 computation."""
WINDOW_TOKENS = 8192
"""A batch of a text's windows holds at most this many tokens (a longer window goes alone): one forward's
activations stay those of one long window whatever ``batch_size`` asks."""


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


def lm_eval_encoding(tokenizer):
    """``text -> ids`` as lm-eval's ``HFLM.tok_encode`` for a causal model: the special tokens the tokenizer's
    template adds, unless the text begins with the prefix token (:attr:`~attnspec.tokenizer.Tokenizer.prefix`);
    None without a tokenizer."""
    if tokenizer is None:
        return None
    return lambda text: tokenizer.encode(text, special=not text.startswith(tokenizer.prefix))


def _tokens(value, vocab: int, where: str, name: str, encode=None) -> list[int]:
    if isinstance(value, str) and encode is not None:
        return _checked(encode(value), vocab, where, name)
    if isinstance(value, str):
        if vocab < 256:
            raise TaskError(f"{where}: `{name}` is text, read as UTF-8 bytes, but the model's vocabulary has {vocab} "
                            "tokens (bytes need 256); give token ids")
        return list(value.encode("utf-8"))
    if not isinstance(value, list) or not all(type(t) is int and 0 <= t < vocab for t in value):
        raise TaskError(f"{where}: `{name}` must be text or a list of token ids in [0, {vocab}), got "
                        f"{shorten(value)}")
    return value


def _checked(ids: list[int], vocab: int, where: str, name: str) -> list[int]:
    if any(t >= vocab for t in ids):
        raise TaskError(f"{where}: the tokenizer gives `{name}` id {max(ids)}, not below the model's vocabulary of "
                        f"{vocab}; is it the model's tokenizer?")
    return ids


def _pair(context, continuation, vocab: int, where: str, name: str, tokenizer) -> tuple[list[int], list[int]]:
    """A context and continuation's ids: text pairs through the tokenizer as lm-eval splits them (the
    context's trailing spaces join the continuation; the pair is encoded whole and the continuation is
    what follows as many ids as the context alone has; an empty context is the prefix token, the
    continuation then encoded without special tokens), anything else each on its own."""
    encode = lm_eval_encoding(tokenizer)
    if encode is not None and context == "" and isinstance(continuation, str):
        return [tokenizer.prefix_id], _nonempty(continuation, vocab, where, name, tokenizer.encode)
    if encode is None or not (isinstance(context, str) and isinstance(continuation, str)):
        return (_tokens(context, vocab, where, "context", encode),
                _nonempty(continuation, vocab, where, name, encode))
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, head = encode(context + continuation), encode(context)
    tail = whole[len(head):]
    if not tail:
        raise TaskError(f"{where}: `{name}` is empty")
    if not head:
        raise TaskError(f"{where}: `context` gives no token; a continuation is scored after at least one")
    return _checked(head, vocab, where, "context"), _checked(tail, vocab, where, name)


def read_task_file(path: Path | str, vocab: int, tokenizer=None, task_format: str = "requests"
                   ) -> tuple[list[Request], list[tuple[list[int], int, int]]]:
    """The requests of a task file, and the multiple-choice questions as (indices of their choices'
    requests, label, line). Raises TaskError naming the line of the first malformed request.

    ``tokenizer``: the model's (:class:`attnspec.tokenizer.Tokenizer`, text encoded as lm-eval encodes it),
    or None to read text as UTF-8 bytes; ``task_format``: one of :data:`~attnspec.training.eval_formats.FORMATS`.

    The file is streamed line by line (lines end at ``\\n`` only: U+2028 and its kin are valid inside
    JSON strings), each line bounded before it is parsed (:data:`MAX_LINE_BYTES`, and at most
    :data:`MAX_CHOICES` lists, counted from its brackets), and requests are counted as they are read,
    so no file makes this allocate more than its limits allow."""
    path = Path(path)
    if task_format not in FORMATS:
        raise TaskError(f"unknown task format {task_format!r}; one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise TaskError(f"{path}: no such file; give a JSON-lines task file")
    if path.stat().st_size > MAX_TASK_BYTES:
        raise TaskError(f"{path}: larger than {MAX_TASK_BYTES:,} bytes")
    requests: list[Request] = []
    questions: list[tuple[list[int], int, int]] = []
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
                _read_request(raw, f"{path}:{number}", number, vocab, requests, questions, tokenizer, task_format)
                if len(requests) > MAX_REQUESTS:
                    raise TaskError(f"{path}: more than {MAX_REQUESTS:,} requests")
    except OSError as error:
        raise TaskError(f"{path}: cannot be read ({shorten(str(error), 120)})") from None
    if not requests:
        raise TaskError(f"{path}: holds no request")
    return requests, questions


def _read_request(raw: bytes, where: str, number: int, vocab: int, requests: list[Request],
                  questions: list[tuple[list[int], int, int]], tokenizer=None, task_format: str = "requests") -> None:
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
    item = as_request(item, task_format, where)
    if not isinstance(item, dict) or "context" not in item:
        raise TaskError(f"{where}: a request is an object with `context` and `continuation` or `choices`")
    if item["context"] == [] or item["context"] == "" and tokenizer is None:
        raise TaskError(f"{where}: `context` is empty; a continuation is scored after at least one token"
                        + ("" if item["context"] == [] else " (with a tokenizer, an empty text is its prefix token)"))
    if "choices" in item:
        choices, label = item["choices"], item.get("label")
        if not isinstance(choices, list) or len(choices) < 2:
            raise TaskError(f"{where}: `choices` must list at least two continuations")
        if type(label) is not int or not 0 <= label < len(choices):
            raise TaskError(f"{where}: `label` must be the index of the right choice, 0 to {len(choices) - 1}")
        first = len(requests)
        for index, choice in enumerate(choices):
            requests.append(Request(*_pair(item["context"], choice, vocab, where, f"choices[{index}]", tokenizer),
                                    number))
        questions.append((list(range(first, len(requests))), label, number))
    elif "continuation" in item:
        requests.append(Request(*_pair(item["context"], item["continuation"], vocab, where, "continuation",
                                       tokenizer), number))
    else:
        raise TaskError(f"{where}: a request needs `continuation` or `choices`")


def _nonempty(value, vocab: int, where: str, name: str, encode=None) -> list[int]:
    tokens = _tokens(value, vocab, where, name, encode)
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


def _check_model(model) -> None:
    spec = model.spec
    if spec.input.kind != "tokens" or spec.head.kind != "lm":
        raise TaskError("attnspec eval scores continuations: the model needs token input and an lm head")
    if any(not block.mixer.causal for block in model.blocks):
        raise TaskError("attnspec eval scores continuations left to right: every mixer must be causal")


@torch.no_grad()
def _scored_rows(model, rows: list[list[int]], targets: list[list[int]]) -> list[tuple[Tensor, Tensor]]:
    """For each token row run alone, the log-probability (float32; a float64 model's float64) of each of
    ``targets[i]``, the tokens that follow its last ``len(targets[i])`` positions, and whether each is the
    argmax there. The rows run as one right-padded batch whose padding is a document of its own (so each
    row's logits are those it would have alone); the logits are taken :data:`SCORE_POSITIONS` positions at
    a time."""
    device = model.embed.weight.device
    width = max(len(row) for row in rows)
    inputs = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    starts = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        inputs[i, :len(row)] = torch.tensor(row, dtype=torch.long, device=device)
        if len(row) < width:
            starts[i, len(row)] = True
    hidden = model.head_input(inputs, from_starts(starts) if bool(starts.any()) else None)
    found = []
    for i, (row, wanted) in enumerate(zip(rows, targets)):
        first = len(row) - len(wanted)
        logprobs, greedy = [], []
        for begin in range(first, len(row), SCORE_POSITIONS):
            end = min(begin + SCORE_POSITIONS, len(row))
            logits = model.head_logits(hidden[i, begin:end])
            logits = logits if logits.dtype == torch.float64 else logits.float()  # a float64 model stays exact
            chosen = torch.tensor(wanted[begin - first:end - first], dtype=torch.long, device=device)
            # the log-softmax in the logits' precision, float32 as lm-eval takes it (fused; LOGPROB_ERROR)
            logprobs.append(-F.cross_entropy(logits, chosen, reduction="none").double())
            greedy.append(logits.argmax(-1) == chosen)
        found.append((torch.cat(logprobs), torch.cat(greedy)))
    return found


def score_batch(model, requests: list[Request]) -> list[Score]:
    """Score requests on ``model`` (a token LM) in one padded batch: each sequence keeps its last
    ``max_len + 1`` tokens (the context is cut from the left first, as lm-eval does)."""
    limit = model.spec.max_len + 1  # inputs are all tokens but the last
    sequences = [(r.context + r.continuation)[-limit:] for r in requests]
    scored = [min(len(r.continuation), len(seq) - 1) for r, seq in zip(requests, sequences)]
    results = _scored_rows(model, [seq[:-1] for seq in sequences], [seq[-n:] for seq, n in zip(sequences, scored)])
    return [Score(float(logprobs.sum()), bool(greedy.all()), len(request.context) + len(request.continuation) > limit,
                  n, len(request.continuation) - n)
            for request, n, (logprobs, greedy) in zip(requests, scored, results)]


def score(model, request: Request) -> Score:
    """Score one request on ``model`` (:func:`score_batch` of one)."""
    return score_batch(model, [request])[0]


def _in_batches(model, requests: list[Request], batch_size: int, on_request=None) -> list[Score]:
    """Every request's score, longest first in batches of ``batch_size`` (one where padding cannot be a
    document), in the requests' order."""
    size = batch_size if model.takes_documents else 1  # padding is a document
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i].context) + len(requests[i].continuation)))
    scores: list[Score | None] = [None] * len(requests)
    if on_request is not None:
        on_request(0, len(order))
    for start in range(0, len(order), size):
        chosen = order[start:start + size]
        for i, result in zip(chosen, score_batch(model, [requests[i] for i in chosen])):
            scores[i] = result
        if on_request is not None:
            on_request(min(start + size, len(order)), len(order))
    return scores


def check_options(batch_size: object, stride: object = None, max_len: int | None = None) -> None:
    """The evaluation's numeric options, before any work: ``batch_size`` 1 to :data:`MAX_BATCH`,
    ``stride`` (where given) 1 to the model's ``max_len`` (before the model is loaded: to attnspec's
    longest sequence). Raises TaskError naming the option."""
    try:
        check_whole("--batch-size", batch_size, 1, MAX_BATCH)
        if stride is not None:
            check_whole("--stride", stride, 1, limits.MAX_LEN if max_len is None else max_len,
                        "" if max_len is None else " (the model's max_len: a window's tokens)")
    except AttnSpecError as error:
        raise TaskError(str(error)) from None


def evaluate_file(model, path: Path | str, on_request=None, *, tokenizer=None, task_format: str = "requests",
                  batch_size: int = 16) -> EvalResult:
    """Score every request of the task file ``path`` with ``model`` (a causal token LM, eval mode).

    ``tokenizer``: the model's (:class:`attnspec.tokenizer.Tokenizer`) for text, or None (text as UTF-8
    bytes); ``task_format``: the file's format (:data:`~attnspec.training.eval_formats.FORMATS`);
    ``batch_size``: requests scored together (padded; each scores as it would alone).
    ``on_request(done, total)`` is called after each batch (the CLI's progress bar)."""
    _check_model(model)
    check_options(batch_size)
    requests, questions = read_task_file(path, model.spec.input.vocab_size, tokenizer, task_format)
    scores = _in_batches(model, requests, batch_size, on_request)
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


@dataclass
class TextResult:
    """What :func:`evaluate_text` reports: the log-likelihood of every token of a text, per token
    (``perplexity``), per byte (``bits_per_byte``) and per whitespace-separated word (``word_perplexity``,
    lm-eval's WikiText measure), over ``windows`` windows of at most ``max_len`` tokens with ``stride``."""

    tokens: int
    bytes: int
    words: int
    windows: int
    stride: int
    loglikelihood: float
    perplexity: float
    bits_per_byte: float
    word_perplexity: float


def evaluate_text(model, path: Path | str, *, tokenizer=None, stride: int | None = None, batch_size: int = 16,
                  on_window=None) -> TextResult:
    """The log-likelihood of the whole text file ``path`` (UTF-8) under ``model``.

    The text is tokenised (``tokenizer``; None: UTF-8 bytes) as lm-eval's ``loglikelihood_rolling`` tokenises
    it (with the special tokens the tokenizer's template adds, :func:`lm_eval_encoding`) and, with a
    tokenizer, preceded by its prefix token (BOS where it has one, else EOS: lm-eval's
    ``prefix_token_id``) so its first token is scored too. Windows of ``max_len`` tokens start every
    ``stride`` tokens (default ``max_len``: disjoint windows, lm-eval's way); each token is scored once,
    in the first window that predicts it, so a smaller stride gives every token after the first window at
    least ``max_len - stride`` tokens of context; the last window reaches back a whole ``max_len`` (as
    lm-eval's does). Windows are scored ``batch_size`` at a time, at most :data:`WINDOW_TOKENS` tokens
    together; ``on_window(done, total)`` is called before the first and after each batch.
    """
    _check_model(model)
    width = model.spec.max_len
    check_options(batch_size, stride, width)
    stride = width if stride is None else stride
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such file; give a UTF-8 text file")
    if path.stat().st_size > MAX_TEXT_BYTES:
        raise TaskError(f"{path}: larger than {MAX_TEXT_BYTES:,} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise TaskError(f"{path}: not UTF-8 text ({shorten(str(error), 100)})") from None
    except OSError as error:
        raise TaskError(f"{path}: cannot be read ({error.strerror})") from None
    vocab = model.spec.input.vocab_size
    if tokenizer is None:
        ids = _tokens(text, vocab, str(path), "text")
    else:
        ids = [tokenizer.prefix_id] + _checked(lm_eval_encoding(tokenizer)(text), vocab, str(path), "text")
    if len(ids) < 2:
        raise TaskError(f"{path}: needs at least two tokens to score one")
    targets = len(ids) - 1
    windows = []  # (first input, end of inputs, first new target)
    done, begin = 0, 0
    while done < targets:
        end = min(begin + width, targets)
        windows.append((max(0, end - width), end, done))
        done, begin = end, begin + stride
    # every window but a text shorter than one is max_len long: a batch needs no padding
    size = max(1, min(batch_size, WINDOW_TOKENS // width)) if model.takes_documents else 1
    loglikelihood = 0.0
    if on_window is not None:
        on_window(0, len(windows))
    for first in range(0, len(windows), size):
        chosen = windows[first:first + size]
        scored = _scored_rows(model, [ids[b:e] for b, e, _ in chosen], [ids[new + 1:e + 1] for _, e, new in chosen])
        loglikelihood += sum(float(logprobs.sum()) for logprobs, _ in scored)
        if on_window is not None:
            on_window(min(first + size, len(windows)), len(windows))
    # lm-eval's counts: bytes of UTF-8, words as re.split(r"\s+") finds them
    size_bytes, words = len(text.encode("utf-8")), len(re.split(r"\s+", text))
    return TextResult(targets, size_bytes, words, len(windows), stride, loglikelihood,
                      math.exp(-loglikelihood / targets), -loglikelihood / (size_bytes * math.log(2)),
                      math.exp(-loglikelihood / words))
