"""Distillation (the train config's ``distill``): a teacher model's logits, and optionally its blocks' outputs,
as training targets beside the task's.

Per micro-batch, summed over the answer positions (the loop divides by their global count, as it does
the cross-entropy alone):

    (1 - α) CE(student, targets) + α T² KL(softmax(teacher / T) ‖ softmax(student / T))
    + β Σ_blocks mean((h_student - h_teacher)²) × answers

with α = ``weight``, T = ``temperature``, β = ``hidden`` (Hinton et al. 2015; per-layer output matching
as in LoLCATs' attention transfer, here on whole blocks). The teacher runs without gradients in eval
mode. The objective is one pure function of the two models (the block outputs are returned by the
models' forward, not read by hooks), so a compiled run compiles it whole, teacher included.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.errors import AttnSpecError, Problem, SpecError
from attnspec.spec.walk import iter_blocks
from attnspec.training.tasks import IGNORE


def load_teacher(distill, spec, seq_len: int, device: torch.device) -> nn.Module:
    """The teacher of ``distill`` on ``device``, frozen, checked to fit the student ``spec`` and the task's length
    (:func:`teacher_model`).

    Raises:
        SpecError: located at ``distill.teacher`` (or ``distill.hidden``): not a model directory, another
            vocabulary or head, too short a ``max_len``, or blocks that cannot be matched one to one.
    """
    def refuse(message: str, field: str = "teacher") -> SpecError:
        return SpecError(Problem(message, path=f"distill.{field}", source="training configuration"))

    teacher = teacher_model(distill.teacher, spec, seq_len, device, refuse)
    blocks = sum(1 for _ in iter_blocks(spec, expand=True))
    if distill.hidden and (len(teacher.blocks) != blocks or teacher.spec.d_model != spec.d_model):
        raise refuse(f"matching block outputs needs the same blocks and width: the teacher has {len(teacher.blocks)} "
                     f"blocks of {teacher.spec.d_model}, the student {blocks} of {spec.d_model}; set `hidden: 0`",
                     "hidden")
    return teacher


def teacher_model(source: str, spec, seq_len: int, device: torch.device, refuse) -> nn.Module:
    """A teacher's model on ``device``, frozen and in eval mode: a build or run directory's (an imported
    transformers model is a build: ``import-hf``'s), checked to read the student ``spec``'s tokens through an lm
    head at the task's ``seq_len``; ``refuse(message)`` makes the error."""
    from attnspec.training.rundir import load_trained

    path = Path(source)
    if (path / "config.json").is_file() and not (path / "manifest.json").is_file() \
            and not (path / "run.json").is_file():  # (training reads no transformers code: import-hf does)
        raise refuse(f"{source} is a transformers checkpoint: import it first (`attnspec import-hf {source} -o "
                     "BUILD`) and name the build")
    try:
        teacher = load_trained(path)
    except AttnSpecError as error:
        raise refuse(f"{source} is not a build or run directory to learn from: {error}") from None
    theirs = teacher.spec
    if theirs.input.kind != "tokens" or theirs.head.kind != "lm" or \
            theirs.input.vocab_size != getattr(spec.input, "vocab_size", None):
        raise refuse(f"the teacher must read the student's tokens (vocab_size {getattr(spec.input, 'vocab_size', '?')})"
                     f" through an lm head; {source} has {theirs.input.kind} input of "
                     f"{getattr(theirs.input, 'vocab_size', '?')} and a {theirs.head.kind} head")
    if theirs.max_len < seq_len:
        raise refuse(f"the teacher takes at most {theirs.max_len} positions; the task's sequences have {seq_len}")
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    return teacher.to(device).eval()


def distill_loss(model: nn.Module, teacher: nn.Module, inputs: Tensor, targets: Tensor,
                 distill, documents=None) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed objective of one micro-batch: inputs and targets (B, L) -> (a scalar, the summed
    cross-entropy, KL and block-matching terms ``ce``, ``kl``, ``hidden`` as detached scalars);
    ``documents``: the packed documents of ``inputs``, which student and teacher both honour."""
    packed = {} if documents is None else {"documents": documents}
    if distill.hidden:
        logits, student_outputs = model(inputs, hidden_states=True, **packed)
        with torch.no_grad():
            teacher_logits, teacher_outputs = teacher(inputs, hidden_states=True, **packed)
    else:
        logits = model(inputs, **packed)
        with torch.no_grad():
            teacher_logits = teacher(inputs, **packed)
    # the answer positions by a 0/1 weight, not by indexing: no shape depends on the data, so it compiles
    answer = (targets != IGNORE).float()
    student, wanted = logits.float(), teacher_logits.float()
    ce = F.cross_entropy(student.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    T = distill.temperature
    kl_each = F.kl_div(F.log_softmax(student / T, -1), F.log_softmax(wanted / T, -1), log_target=True,
                       reduction="none").sum(-1)
    kl = (kl_each * answer).sum() * T * T
    total = (1 - distill.weight) * ce + distill.weight * kl
    terms = {"ce": ce, "kl": kl}
    if distill.hidden:
        matched = sum(F.mse_loss(s.float(), t.float()) for s, t in zip(student_outputs, teacher_outputs))
        terms["hidden"] = matched * answer.sum()
        total = total + distill.hidden * terms["hidden"]
    return total, {name: term.detach() for name, term in terms.items()}


