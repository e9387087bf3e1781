"""The component registry: IR ``kind`` -> ``nn.Module`` class, one table per slot.

A new feature map, transition or sparse support is added in one place: its IR node in
``attnspec/spec/ir.py`` and a class registered here with ``@register("feature_map", "kind")``.
"""

from __future__ import annotations

from typing import Any, Callable

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
    try:
        cls = REGISTRY[slot][node.kind]
    except KeyError:  # the IR and the registry disagree: a bug, not a user error
        raise NotImplementedError(f"no {slot} implementation registered for kind '{node.kind}'") from None
    return cls(node, **context)
