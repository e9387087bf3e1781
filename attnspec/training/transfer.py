"""Attention transfer (the train config's ``transfer``; LoLCATs' first stage, Zhang et al. 2024): each new mixer
learns to compute what the teacher's mixer of its block computes, on the teacher's own input to that block.

Per micro-batch, for the chosen blocks i (by default every block whose mixer differs from the teacher's):

    Σ_i mean((student.blocks[i].mixer(h_i) - teacher.blocks[i].mixer(h_i))²) × answers,   h_i = the teacher
    block's mixer input (its norm of the block's input, where the norm comes first)

all blocks at once and independently, from one teacher pass without gradients (the student's blocks never see
their own, drifting, hidden states), so the objective is one pure function of the two models: a compiled run
compiles it whole. The loop divides by the answers, so the logged loss is the summed mean squared error.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.errors import Problem, SpecError


def _refuse(message: str, field: str = "teacher") -> SpecError:
    return SpecError(Problem(message, path=f"transfer.{field}", source="training configuration"))


def transferred_blocks(model: nn.Module, teacher: nn.Module, named: list[int] | None) -> list[int]:
    """The blocks the transfer trains: ``named``, or every block whose mixer is not the teacher's (by spec), each
    one whose mixer runs alone (not reading another block's keys and values, nor calling a shared block).

    Raises:
        SpecError: located at ``transfer.teacher`` for blocks that do not line up, at ``transfer.blocks`` for
            none to transfer, an index out of range or twice, or a block whose mixer cannot run alone.
    """
    from attnspec.spec.walk import iter_blocks

    ours = [node for _, node in iter_blocks(model.spec, expand=True)]
    theirs = [node for _, node in iter_blocks(teacher.spec, expand=True)]
    if len(ours) != len(theirs) or model.spec.d_model != teacher.spec.d_model:
        raise _refuse(f"the teacher's blocks do not line up with the student's: it has {len(theirs)} blocks of width "
                      f"{teacher.spec.d_model}, the student {len(ours)} of {model.spec.d_model}; transfer maps block "
                      "i to block i")
    if named is None:
        chosen = [i for i, (a, b) in enumerate(zip(ours, theirs))
                  if json.dumps(a.mixer.model_dump(mode="json"), sort_keys=True)
                  != json.dumps(b.mixer.model_dump(mode="json"), sort_keys=True)]
        if not chosen:
            raise _refuse("no block to transfer: every mixer of the student is its teacher's; change a mixer, or "
                          "name the blocks to train (`blocks: [3]`)", "blocks")
    else:
        chosen = list(named)
        for index, block in enumerate(chosen):
            if block >= len(ours) or chosen.index(block) != index:
                raise _refuse(f"block {block} {'is named twice' if block < len(ours) else 'is not a block'}: the "
                              f"model has blocks 0 to {len(ours) - 1}", f"blocks[{index}]")
    for block in chosen:
        for who, node, module in (("student", ours[block], model.blocks[block]),
                                  ("teacher", theirs[block], teacher.blocks[block])):
            if node.mixer.is_identity or getattr(node.mixer, "kv_from", None) is not None or \
                    module.shared_use is not None:
                raise _refuse(f"the {who}'s block {block} has no mixer that runs alone (none, one reading another "
                              "block's keys and values, or one beside a shared block's call): leave it out",
                              "blocks")
    return chosen


def transfer_loss(model: nn.Module, teacher: nn.Module, blocks: list[int], inputs: Tensor, targets: Tensor,
                  documents=None) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed objective of one micro-batch: inputs and targets (B, L) -> (a scalar, ``{"transfer_mse": ...}``
    detached), the summed mean squared errors of the ``blocks``' mixers times the answer positions (the loop
    divides by them); ``documents``: the packed documents both models honour."""
    from attnspec.training.tasks import IGNORE

    packed = {} if documents is None else {"documents": documents}
    with torch.no_grad():
        _, outputs = teacher(inputs, hidden_states=True, **packed)
        received = [teacher.embedded(inputs, documents), *outputs[:-1]]  # block i's input
        wanted = {}
        for block in blocks:
            h = teacher.blocks[block].mixer_input(received[block])
            wanted[block] = (h, teacher.blocks[block].mixer(h, **_taking(teacher.blocks[block].mixer, packed)))
    answers = (targets != IGNORE).sum()
    total = sum(F.mse_loss(model.blocks[block].mixer(h, **_taking(model.blocks[block].mixer, packed)).float(), y.float())
                for block, (h, y) in wanted.items()) * answers
    return total, {"transfer_mse": total.detach()}


def _taking(mixer: nn.Module, packed: dict) -> dict:
    """The packed documents, for a mixer that takes them."""
    return packed if mixer.takes_documents else {}


__all__ = ["transfer_loss", "transferred_blocks"]
