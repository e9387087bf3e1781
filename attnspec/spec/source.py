"""Source positions of spec values, so every error can say file:line:column.

A front-end (YAML or grammar) turns text into plain data plus a :class:`SourceMap`
from paths such as ``("layers", 0, "mixer", "feature_map")`` to the position of
that key and of its value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

Path = tuple[Any, ...]


@dataclass(frozen=True)
class Position:
    """A place in a source: ``line`` and ``column`` are 1-based (None for command-line overrides)."""

    source: str
    line: int | None = None
    column: int | None = None


@dataclass
class SourceMap:
    """Positions of keys and values by path. Lookups fall back to the nearest enclosing path."""

    values: dict[Path, Position] = field(default_factory=dict)
    keys: dict[Path, Position] = field(default_factory=dict)
    root: Position | None = None

    def value_at(self, path: Path) -> Position | None:
        """Position of the value at ``path``, or of the closest enclosing value."""
        return self._nearest(self.values, path)

    def key_at(self, path: Path) -> Position | None:
        """Position of the key naming ``path`` (falls back to the enclosing value)."""
        if path in self.keys:
            return self.keys[path]
        return self._nearest(self.values, path[:-1]) if path else self.root

    def _nearest(self, table: dict[Path, Position], path: Path) -> Position | None:
        for end in range(len(path), -1, -1):
            if path[:end] in table:
                return table[path[:end]]
        return self.root

    def merged_with(self, child: "SourceMap") -> "SourceMap":
        """This map overlaid with ``child`` (the child wins where both know a path)."""
        return SourceMap({**self.values, **child.values}, {**self.keys, **child.keys}, child.root or self.root)

    def subtree(self, prefix: Path) -> "SourceMap":
        """The entries under ``prefix``, re-rooted at ``()`` (the positions of one value's parts)."""
        cut = len(prefix)
        return SourceMap({p[cut:]: pos for p, pos in self.values.items() if p[:cut] == prefix},
                         {p[cut:]: pos for p, pos in self.keys.items() if p[:cut] == prefix}, self.root)

    def replace_subtree(self, prefix: Path, other: "SourceMap") -> None:
        """Forget what is known under ``prefix`` and take ``other``'s entries, re-rooted there."""
        for table, incoming in ((self.values, other.values), (self.keys, other.keys)):
            for path in [p for p in table if p[: len(prefix)] == prefix and len(p) > len(prefix)]:
                del table[path]
            for path, pos in incoming.items():
                table[prefix + path] = pos


def format_path(path: Iterable[Any]) -> str:
    """``("layers", 0, "mixer")`` -> ``"layers[0].mixer"``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
