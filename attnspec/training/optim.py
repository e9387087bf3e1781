"""The optimiser: AdamW over parameter groups read from the components' facts, and the schedule.

Each parameter belongs to the innermost built component that holds it (``module.component_facts``,
set by :func:`attnspec.nn.registry.build` from the IR class). Its group is decided by:

* no weight decay: the component's ``no_weight_decay`` fact (norms, positions, transitions), any
  parameter with fewer than two dimensions (biases, gains), and the token embedding;
* learning-rate multiplier: the component's ``lr_multiplier`` fact (GateLoop's transition
  projections train at 0.8x, its paper's 1e-4 vs 1.25e-4).

The training configuration overrides both per slot (``transition``) or per slot and kind
(``transition.data``), the more specific key winning, and leaves out the parameters it freezes (``freeze``).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from attnspec.errors import Problem, SpecError


@dataclass
class Group:
    """One optimiser group: its parameters (by name) and their weight decay and lr multiplier."""

    name: str
    weight_decay: bool
    lr_multiplier: float
    names: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "weight_decay": self.weight_decay, "lr_multiplier": self.lr_multiplier,
                "parameters": self.names}


def frozen_parameters(model: nn.Module, patterns: list[str], fixed: set[str] = frozenset(),
                      where: str = "freeze", added: list[str] = ()) -> set[str]:
    """The names of ``model``'s parameters that the globs ``patterns`` match (``freeze``: not trained), with
    ``fixed``, those frozen whatever the patterns say (the maps low-rank adapters adapt).

    Raises:
        SpecError: located at ``freeze[i]`` (``where``: a stage's own field), for a pattern that names no
            parameter, or at ``freeze`` when the patterns leave nothing to train.
    """
    names = [name for name, _ in model.named_parameters()] + list(added)  # (parameters yet to be added: adapters)
    frozen: set[str] = set(fixed)
    for index, pattern in enumerate(patterns):
        matched = {name for name in names if fnmatch.fnmatchcase(name, pattern)}
        if not matched:
            near = ", ".join(names[:4]) + (f" ... ({len(names)} in all)" if len(names) > 4 else "")
            raise SpecError(Problem(f"{pattern!r} names no parameter of this model (its names: {near}); a pattern is "
                                    "a glob over them, `*` any characters", path=f"{where}[{index}]",
                                    source="training configuration"))
        frozen |= matched
    if names and len(frozen) == len(names):
        raise SpecError(Problem("these patterns freeze every parameter: nothing would be trained; leave some out"
                                + (" (the low-rank adapters' maps are frozen already)" if fixed else ""),
                                path=where, source="training configuration"))
    return frozen


def parameter_groups(model: nn.Module, overrides: dict | None = None, frozen: set[str] = frozenset()) -> list[Group]:
    """Group the model's trained parameters (all but ``frozen``) by (weight decay, lr multiplier), in a stable
    order.

    ``overrides``: ``{"transition": {"weight_decay": bool, "lr_multiplier": float}, "transition.data": ...}``
    (each value may give either field). Returns the groups, each trained parameter in exactly one.
    """
    overrides = overrides or {}
    owner: dict[str, tuple] = {}
    for prefix, module in model.named_modules():
        facts = getattr(module, "component_facts", None)
        if facts is not None:
            owner[prefix] = facts
    groups: dict[tuple[bool, float], Group] = {}
    for name, parameter in model.named_parameters():
        if name in frozen:
            continue
        facts = _owner_of(name, owner)
        decay, multiplier, label = True, 1.0, "default"
        if facts is not None:
            decay, multiplier = not facts.no_weight_decay, facts.lr_multiplier
            label = facts.slot
            for key in (facts.slot, f"{facts.slot}.{facts.kind}"):
                if key in overrides:
                    decay = overrides[key].get("weight_decay", decay)
                    multiplier = overrides[key].get("lr_multiplier", multiplier)
        if parameter.dim() < 2 or (name == "embed.weight" and getattr(model, "token_input", False)):
            decay = False  # biases, gains and the token table (an embedding) never decay
        group = groups.setdefault((decay, multiplier), Group(label if multiplier != 1 else
                                                             ("decay" if decay else "no_decay"), decay, multiplier))
        group.names.append(name)
    return list(groups.values())


def _owner_of(name: str, owner: dict[str, tuple]):
    """The facts of the innermost component whose module path prefixes the parameter ``name``."""
    parts = name.split(".")[:-1]
    for end in range(len(parts), -1, -1):
        facts = owner.get(".".join(parts[:end]))
        if facts is not None:
            return facts
    return None


def make_optimizer(model: nn.Module, groups: list[Group], *, lr: float, weight_decay: float,
                   betas: tuple[float, float], eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW with one torch param group per :class:`Group` (``lr_multiplier`` kept on the group)."""
    parameters = dict(model.named_parameters())
    torch_groups = [{"params": [parameters[name] for name in group.names], "lr": lr * group.lr_multiplier,
                     "weight_decay": weight_decay if group.weight_decay else 0.0,
                     "lr_multiplier": group.lr_multiplier} for group in groups]
    return torch.optim.AdamW(torch_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def learning_rate(step: int, *, lr: float, warmup: int, steps: int, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio * lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_multiplier"]
