"""Walking a spec's layers, by structure only (no pydantic, no torch): importable from everywhere."""

from __future__ import annotations

from typing import Any


def iter_blocks(spec: Any, expand: bool = False) -> list[tuple[tuple[Any, ...], Any]]:
    """The spec's blocks in order, each with its path such as ``("layers", 0, "layers", 1)``.

    With ``expand=False`` every written block appears once (for validation messages); with
    ``expand=True`` each ``repeat`` group is expanded, giving the model's blocks in execution order.
    A group is any layer with ``repeat`` and ``layers`` (the IR's ``Group``).
    """
    found: list[tuple[tuple[Any, ...], Any]] = []

    def walk(items: list, prefix: tuple[Any, ...]) -> None:
        for i, item in enumerate(items):
            if hasattr(item, "repeat") and hasattr(item, "layers"):
                for _ in range(item.repeat if expand else 1):
                    walk(item.layers, prefix + (i, "layers"))
            else:
                found.append((prefix + (i,), item))

    walk(spec.layers, ("layers",))
    return found
