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


def kv_sources(spec: Any) -> list[int | None]:
    """For each block in execution order, the index of the block whose attention's keys and values it reads
    (its mixer's ``kv_from``: the latest earlier block that ``lends_kv`` under that name), or None (none read, or
    no earlier block lends the name: a spec the rules refuse)."""
    latest: dict[str, int] = {}
    sources: list[int | None] = []
    for index, (_, block) in enumerate(iter_blocks(spec, expand=True)):
        borrowed = getattr(block.mixer, "kv_from", None)
        sources.append(None if borrowed is None else latest.get(borrowed))
        lent = getattr(block.mixer, "lends_kv", None)
        if lent is not None:
            latest[lent] = index
    return sources


def block_labels(spec: Any) -> list[str]:
    """Each block's label in execution order, ``blocks[i] (written path)``, the written path marking
    the copy of every ``repeat`` group around it (``layers[0]#1.layers[2]``: the third block of the
    second copy of ``layers[0]``), so that it names what ``--set blocks[i]`` changes."""
    labels: list[str] = []

    def walk(items: list, prefix: tuple[Any, ...], copies: dict[int, int]) -> None:
        for i, item in enumerate(items):
            if hasattr(item, "repeat") and hasattr(item, "layers"):
                for index in range(item.repeat):  # a group of one copy is no choice: not marked
                    marked = {**copies, len(prefix) + 1: index} if item.repeat > 1 else copies
                    walk(item.layers, prefix + (i, "layers"), marked)
            else:
                labels.append(f"blocks[{len(labels)}] ({block_label(prefix + (i,), copies)})")

    walk(spec.layers, ("layers",), {})
    return labels


def block_label(path: tuple[Any, ...], copies: dict[int, int]) -> str:
    """``path`` as text, each group item at depth d followed by ``#c`` where ``copies[d + 1] = c`` (the copy
    of a ``repeat`` group the path goes through): ``layers[0]#1.layers[2]``."""
    text = ""
    for depth, part in enumerate(path):
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if depth else part)
        if isinstance(part, int) and depth + 1 in copies:
            text += f"#{copies[depth + 1]}"
    return text



def first_copies(spec: Any) -> list[bool]:
    """For each block in execution order, whether it lies in the first copy of every ``repeat`` group
    around it: the blocks that :func:`one_copy_each` keeps, in the same order."""
    flags: list[bool] = []

    def walk(items: list, first: bool) -> None:
        for item in items:
            if hasattr(item, "repeat") and hasattr(item, "layers"):
                for index in range(item.repeat):
                    walk(item.layers, first and index == 0)
            else:
                flags.append(first)

    walk(spec.layers, True)
    return flags


def one_copy_each(data: dict) -> dict:
    """Spec data with every ``repeat`` group at one copy: each distinct block once, in order (what a
    check of the blocks' code needs of a deep model; :func:`first_copies` says which blocks remain)."""

    def shallow(value: Any) -> Any:
        if isinstance(value, dict):
            copy = {key: shallow(item) for key, item in value.items()}
            if "repeat" in copy and "layers" in copy:
                copy["repeat"] = 1
            return copy
        if isinstance(value, list):
            return [shallow(item) for item in value]
        return value

    return {**data, "layers": shallow(data["layers"])}
