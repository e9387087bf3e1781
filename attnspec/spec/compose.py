"""Composing specs: ``extends:`` inheritance and ``--set dotted.path=value`` overrides.

These are how designs are ablated: a variant ``extends`` a base spec and changes a
few keys, or the base is built with ``--set layers[0].mixer.feature_map=relu``.
Both work on plain data (before validation), so the result is validated like any
hand-written spec and errors point at the file or the override that caused them.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path as FsPath
from typing import Any, Callable

from attnspec.errors import Problem, SpecError, shorten
from attnspec.spec import limits
from attnspec.spec.source import Path, Position, SourceMap, format_path
from attnspec.spec.yaml_front import parse_yaml_value

def deep_merge(base: Any, child: Any) -> Any:
    """Merge ``child`` over ``base``: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(child, dict):
        out = dict(base)
        for key, value in child.items():
            out[key] = deep_merge(base[key], value) if key in base else value
        return out
    return child


def resolve_extends(data: dict, smap: SourceMap, file: FsPath | None, read: Callable[[FsPath], tuple[Any, SourceMap]],
                    chain: tuple[FsPath, ...] = (), root: FsPath | None = None) -> tuple[dict, SourceMap]:
    """Apply ``extends: other.yaml`` (relative to ``file``), recursively, detecting cycles.

    ``read`` loads another spec file into ``(data, source_map)``. Every file extended, at any depth,
    must lie inside ``root``: the directory of the first spec (or the working directory for spec
    text), so a spec received from someone else cannot read files elsewhere. Problems found in an
    extended file are reported with its name, line and column but without its text.
    """
    if "extends" not in data:
        return data, smap
    target = data["extends"]
    where = smap.value_at(("extends",))
    if not isinstance(target, str) or not target:
        raise _problem("`extends` must be a relative file path such as `base.yaml`", ("extends",), where)
    base_dir = file.parent if file is not None else FsPath.cwd()
    root = (root or base_dir).resolve()
    if FsPath(target).is_absolute():
        raise _problem(f"`extends` takes a path relative to this spec, not an absolute path "
                       f"({shorten(target)}); put the base spec beside this one", ("extends",), where)
    try:
        base_file = (base_dir / target).resolve()
        exists = base_file.is_file()
    except (OSError, ValueError) as err:  # a name too long, a NUL byte, a symlink loop
        raise _problem(f"cannot extend {shorten(target)}: {getattr(err, 'strerror', None) or err}", ("extends",),
                       where) from None
    if not base_file.is_relative_to(root):
        raise _problem(f"`extends: {shorten(target)}` leads outside {root}, the directory of the spec being "
                       "loaded; a spec may only extend files in its own directory tree", ("extends",), where)
    here = file.resolve() if file is not None else None
    cycle = chain + ((here,) if here else ())
    if base_file in cycle:
        names = " -> ".join(p.name for p in cycle + (base_file,))
        raise _problem(f"`extends` cycle: {names}; remove one of the `extends` keys", ("extends",), where)
    if len(cycle) >= limits.MAX_DEPTH:
        raise _problem(f"more than {limits.MAX_DEPTH} specs extend one another", ("extends",), where)
    if not exists:
        raise _problem(f"cannot extend {shorten(target)}: no such file (looked for {shorten(str(base_file), 120)})",
                       ("extends",), where)
    try:
        base_data, base_map = read(base_file)
        base_data, base_map = resolve_extends(base_data, base_map, base_file, read, cycle, root)
    except SpecError as error:  # located in the other file, without echoing its text
        raise SpecError([replace(problem, excerpt=None) for problem in error.problems]) from None
    child = {k: v for k, v in data.items() if k != "extends"}
    return deep_merge(base_data, child), base_map.merged_with(smap)


_PATH_TOKEN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|(\.)")


def parse_dotted_path(text: str) -> Path:
    """``"layers[0].mixer.heads"`` -> ``("layers", 0, "mixer", "heads")``; raises ValueError if malformed."""
    parts: list[Any] = []
    pos = 0
    expect_name = True
    while pos < len(text):
        match = _PATH_TOKEN.match(text, pos)
        if not match:
            raise ValueError(f"unexpected character {text[pos]!r} at position {pos + 1}")
        name, index, dot = match.groups()
        if dot:
            if expect_name:
                raise ValueError("empty path component")
            expect_name = True
        elif index is not None:
            if not parts:
                raise ValueError("a path must start with a key name")
            parts.append(int(index))
            expect_name = False
        else:
            if not expect_name:
                raise ValueError(f"missing '.' before {name!r}")
            parts.append(name)
            expect_name = False
        pos = match.end()
    if not parts or expect_name:
        raise ValueError("empty or incomplete path")
    return tuple(parts)


def apply_override(data: dict, smap: SourceMap, assignment: str, flag: str = "--set") -> dict:
    """Apply one ``dotted.path=value`` override (value parsed as a YAML scalar, list or mapping).

    Intermediate mappings are created as needed; a component written in the string
    shorthand (``feature_map: relu``) is expanded so its fields can be set. Unknown keys
    are left for validation, which reports them with a suggestion.
    """
    shown = assignment if len(assignment) <= 80 else assignment[:77] + "..."
    where = Position(f"{flag} {shown}")
    if "=" not in assignment:
        raise SpecError(Problem("an override must look like `path.to.key=value`, e.g. "
                                "`layers[0].mixer.feature_map=relu`", source=where.source))
    raw_path, raw_value = assignment.split("=", 1)
    try:
        path = parse_dotted_path(raw_path.strip())
    except ValueError as err:
        raise SpecError(Problem(f"malformed path '{raw_path.strip()}': {err}", source=where.source)) from None
    value = parse_yaml_value(raw_value, where.source)[0] if raw_value.strip() else ""
    data = copy.deepcopy(data)
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        here = path[: depth + 1]
        if isinstance(part, int):
            if not isinstance(node, list):
                raise SpecError(Problem(f"'{format_path(path[:depth])}' is not a list, so it has no index [{part}]",
                                        path=format_path(path), source=where.source))
            if part >= len(node):
                raise SpecError(Problem(f"index [{part}] is out of range: '{format_path(path[:depth])}' has "
                                        f"{len(node)} item(s)", path=format_path(path), source=where.source))
            child = node[part]
        else:
            if not isinstance(node, dict):
                raise SpecError(Problem(f"'{format_path(path[:depth])}' is not a mapping, so it has no key "
                                        f"'{part}'", path=format_path(path), source=where.source))
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
        if isinstance(child, str) and not isinstance(path[depth + 1], int):
            child = {"kind": child}  # expand the `feature_map: relu` shorthand
        node[part] = child
        smap.values.setdefault(here, where)
        node = child
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise SpecError(Problem(f"index [{last}] does not exist in '{format_path(path[:-1])}'",
                                    path=format_path(path), source=where.source))
    elif not isinstance(node, dict):
        raise SpecError(Problem(f"'{format_path(path[:-1])}' is not a mapping", path=format_path(path),
                                source=where.source))
    node[last] = value
    sub = SourceMap()
    _mark_all(value, (), sub, where)
    smap.replace_subtree(path, sub)
    smap.values[path] = where
    smap.keys[path] = where
    return data


def _mark_all(value: Any, path: Path, smap: SourceMap, where: Position) -> None:
    smap.values[path] = where
    smap.keys[path] = where
    if isinstance(value, dict):
        for key, item in value.items():
            _mark_all(item, path + (key,), smap, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _mark_all(item, path + (i,), smap, where)


def _problem(message: str, path: Path, where: Position | None) -> SpecError:
    return SpecError(Problem(message, path=format_path(path), source=where.source if where else None,
                             line=where.line if where else None, column=where.column if where else None))
