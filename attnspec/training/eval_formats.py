"""The common zero-shot task formats as ``attnspec eval`` requests, from local JSON-lines files.

Each function takes one line's object (the fields the task's released data files use, as the Hugging
Face datasets hold them) and returns a request in :mod:`attnspec.training.evaluate`'s form: a
multiple-choice question ``{"context", "choices", "label"}`` or a continuation ``{"context",
"continuation"}``, as text. The prompts are lm-evaluation-harness's (its task YAMLs), so the numbers are
comparable with its numbers for the same model:

* ``hellaswag``: ``{"activity_label", "ctx_a", "ctx_b", "endings", "label"}``; the context
  ``"{activity_label}: {ctx_a} {Ctx_b}"``, each ending a choice, both cleaned of WikiHow's
  ``[title]``/``[header]`` marks as lm-eval does;
* ``piqa``: ``{"goal", "sol1", "sol2", "label"}``; ``"Question: {goal}\\nAnswer:"``;
* ``arc``: ``{"question", "choices": {"text", "label"}, "answerKey"}`` (ARC-Easy and ARC-Challenge);
  ``"Question: {question}\\nAnswer:"``; the answer key is a choice's label (``A``..``E`` or ``1``..``5``);
* ``lambada``: ``{"text"}``; the context is the text up to its last word, the continuation
  ``" {last word}"`` (accuracy: greedy decoding gives exactly it).

Choices and continuations are joined to their context by a space (lm-eval's target delimiter).
"""

from __future__ import annotations

import re

from attnspec.errors import shorten
from attnspec.training.tasks.base import TaskError

FORMATS = ("requests", "hellaswag", "piqa", "arc", "lambada")
"""``requests``: attnspec's own lines (see :mod:`attnspec.training.evaluate`); the rest as above."""


def _field(item: dict, name: str, kind: type, where: str):
    value = item.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise TaskError(f"{where}: needs `{name}` ({kind.__name__}), got {shorten(value)}")
    return value


def _texts(value, name: str, where: str) -> list[str]:
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{where}: `{name}` must list at least two strings, got {shorten(value)}")
    return value


def _label(value, count: int, where: str) -> int:
    """A label as an int or a string of one (hellaswag's files hold "2"): ASCII digits, a few of them
    (``"²"`` is a digit to ``str.isdigit`` but not to ``int``; 5,000 digits are past ``int``'s limit)."""
    digits = value.strip() if isinstance(value, str) else ""
    if digits.isascii() and digits.isdigit() and len(digits) <= 9:
        value = int(digits)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise TaskError(f"{where}: `label` must be the index of the right choice, 0 to {count - 1}, got {shorten(value)}")
    return value


def _wikihow(text: str) -> str:
    """lm-eval's HellaSwag cleaning: ``[title]`` ends a sentence, other bracketed marks go, double spaces close."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(item: dict, where: str) -> dict:
    endings = _texts(item.get("endings"), "endings", where)
    ctx = _field(item, "ctx_a", str, where) + " " + _field(item, "ctx_b", str, where).capitalize()
    context = _wikihow(_field(item, "activity_label", str, where) + ": " + ctx)
    return {"context": context, "choices": [" " + _wikihow(e) for e in endings],
            "label": _label(item.get("label"), len(endings), where)}


def piqa(item: dict, where: str) -> dict:
    choices = [_field(item, "sol1", str, where), _field(item, "sol2", str, where)]
    return {"context": f"Question: {_field(item, 'goal', str, where)}\nAnswer:", "choices": [" " + c for c in choices],
            "label": _label(item.get("label"), 2, where)}


def arc(item: dict, where: str) -> dict:
    question = item.get("question")
    if isinstance(question, dict):  # the original release: {"stem", "choices": [{"text", "label"}]}
        choices = question.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise TaskError(f"{where}: `question.choices` must list {{text, label}} objects")
        texts, labels = [c.get("text") for c in choices], [c.get("label") for c in choices]
        question = question.get("stem")
    else:
        choices = _field(item, "choices", dict, where)
        texts, labels = choices.get("text"), choices.get("label")
    if not isinstance(question, str):
        raise TaskError(f"{where}: needs the question's text")
    texts = _texts(texts, "choices.text", where)
    if not isinstance(labels, list) or len(labels) != len(texts):
        raise TaskError(f"{where}: `choices.label` must name each choice")
    key = item.get("answerKey")
    if key not in labels:
        raise TaskError(f"{where}: `answerKey` {shorten(key)} is not one of the choices' labels {labels}")
    return {"context": f"Question: {question}\nAnswer:", "choices": [" " + t for t in texts], "label": labels.index(key)}


def lambada(item: dict, where: str) -> dict:
    text = _field(item, "text", str, where).rstrip()
    context, _, word = text.rpartition(" ")
    if not context or not word:
        raise TaskError(f"{where}: `text` needs a context and a last word")
    return {"context": context, "continuation": " " + word}


CONVERTERS = {"hellaswag": hellaswag, "piqa": piqa, "arc": arc, "lambada": lambada}


def as_request(item, task_format: str, where: str):
    """One line's object as a request of ``task_format`` (:data:`FORMATS`); ``requests`` lines pass as they are."""
    if task_format == "requests":
        return item
    if not isinstance(item, dict):
        raise TaskError(f"{where}: a {task_format} line is a JSON object")
    return CONVERTERS[task_format](item, where)


__all__ = ["CONVERTERS", "FORMATS", "as_request"]
