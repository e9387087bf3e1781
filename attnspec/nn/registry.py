"""The nn half of the component registry: IR ``kind`` -> ``nn.Module`` class, one table per slot.

A component's IR class (:mod:`attnspec.spec.components`) states its facts; its implementation is
the class registered here for the same kind with ``@register("feature_map", "kind")``, or, for a
plugin, the class its IR class names as ``implementation = "module:Class"``, imported on first use
(so a plugin module can declare its IR half without importing torch). Nothing here imports the
spec layer.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

REGISTRY: dict[str, dict[str, type]] = {}


def register(slot: str, *kinds: str) -> Callable[[type], type]:
    """Class decorator: build IR nodes of ``kinds`` in ``slot`` with the decorated class."""

    def decorate(cls: type) -> type:
        for kind in kinds:
            REGISTRY.setdefault(slot, {})[kind] = cls
        return cls

    return decorate


def build(slot: str, node: Any, **context: Any) -> Any:
    """Instantiate the registered class for ``node.kind`` in ``slot`` as ``cls(node, **context)``."""
    cls = REGISTRY.get(slot, {}).get(node.kind) or _named_implementation(node)
    if cls is None:  # the IR and the registry disagree: a bug (or a plugin without an implementation)
        raise NotImplementedError(f"no {slot} implementation registered for kind '{node.kind}'; a plugin component "
                                  "names it with `implementation = \"module:Class\"` on its IR class")
    module = cls(node, **context)
    # What the trainer's optimiser groups read: the component's slot, kind and optimiser facts.
    module.component_facts = ComponentFacts(slot, node.kind, getattr(node, "no_weight_decay", False),
                                            getattr(node, "lr_multiplier", 1.0))
    return module


class ComponentFacts(NamedTuple):
    """The optimiser facts of a built component (from its IR class)."""

    slot: str
    kind: str
    no_weight_decay: bool
    lr_multiplier: float


def _named_implementation(node: Any) -> type | None:
    """The class a plugin's IR class names as ``implementation = "module:Class"``, imported now."""
    target = getattr(type(node), "implementation", None)
    if not target:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
