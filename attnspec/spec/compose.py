"""Composing specs: ``extends:`` inheritance, a spec's ``set:`` patches and ``--set path=value``.

These are how designs are ablated: a variant ``extends`` a base spec and changes a few keys
(``set: {"blocks[*].mixer.feature_map": relu}`` reaches inside lists), or the base is built with
``--set blocks[*].mixer.feature_map=relu``; an ablation sweep's variants are the same overrides.
All of them work on plain data (before validation), so the result is validated like any
hand-written spec and errors point at the file or the override that caused them. One path
language serves all three: ``a.b[0].c``, ``[*]`` for every item of a list, ``blocks[*]`` for every
written block inside ``repeat`` groups at any depth.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path as FsPath
from typing import Any, Callable

from attnspec.errors import Problem, SpecError, shorten
from attnspec.spec import components, limits
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
        return apply_patches(data, smap), smap
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
    child = {k: v for k, v in data.items() if k not in ("extends", "set")}
    merged, merged_map = deep_merge(base_data, child), base_map.merged_with(smap)
    if "set" in data:  # the child's own patches, after the merge
        merged = apply_patches({**merged, "set": data["set"]}, merged_map)
    return merged, merged_map


EVERY = "*"
"""The ``[*]`` of a path: every item of a list."""
BLOCKS = "blocks"
"""A path's first name ``blocks[*]`` / ``blocks[N]`` / ``blocks[START:STOP:STEP]``: every block, inside
``repeat`` groups at any depth, or the N-th of the model's blocks in execution order (the ``blocks[N]`` of
``explain``, the build summary and the model's weights): one copy of a ``repeat`` group, which is then
unrolled there; or the blocks of a Python slice of them (``blocks[3::4]``: one in four, from the fourth),
each as ``blocks[N]``."""

_PATH_TOKEN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\*|\d*:\d*(?::\d+)?)\]|(\.)")


def parse_dotted_path(text: str) -> Path:
    """``"layers[*].mixer.heads"`` -> ``("layers", EVERY, "mixer", "heads")``; ValueError if malformed."""
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
            if ":" in index:  # a slice: blocks only
                bounds = [int(bound) if bound else None for bound in index.split(":")]
                if bounds[2:] == [0]:
                    raise ValueError("a slice's step must be at least 1")
                parts.append(slice(*bounds))
            else:
                parts.append(EVERY if index == "*" else int(index))
            expect_name = False
        else:
            if not expect_name:
                raise ValueError(f"missing '.' before {name!r}")
            parts.append(name)
            expect_name = False
        pos = match.end()
    if not parts or expect_name:
        raise ValueError("empty or incomplete path")
    if parts[0] == BLOCKS and (len(parts) < 2 or isinstance(parts[1], str) and parts[1] != EVERY):
        raise ValueError("`blocks` takes [*], an index or a slice, e.g. `blocks[*].mixer.heads`, `blocks[3::4]`")
    if any(isinstance(part, slice) for part in parts[2 if parts[0] == BLOCKS else 0:]):
        raise ValueError("a slice `[a:b:c]` picks blocks (`blocks[3::4]`); elsewhere write [*] or an index")
    return tuple(parts)


def format_pattern(path: Path) -> str:
    """The text of a parsed path, wildcards included."""
    def text(part) -> str:
        if isinstance(part, slice):
            step = "" if part.step is None else f":{part.step}"
            return f"[{'' if part.start is None else part.start}:{'' if part.stop is None else part.stop}{step}]"
        return f"[{part}]"

    return "".join(text(part) if isinstance(part, (int, slice)) or part == EVERY else f".{part}" if i else str(part)
                   for i, part in enumerate(path))


def written_blocks(data: Any) -> list[Path]:
    """Paths of every written block of spec data (not expanded), groups entered at any depth."""
    found: list[Path] = []

    def walk(items: Any, prefix: Path) -> None:
        if not isinstance(items, list):
            return
        for i, item in enumerate(items):
            if isinstance(item, dict) and "repeat" in item and "layers" in item:
                walk(item["layers"], prefix + (i, "layers"))
            else:
                found.append(prefix + (i,))

    walk(data.get("layers") if isinstance(data, dict) else None, ("layers",))
    return found


Copy = tuple[Path, int]
"""A ``repeat`` group's path and one of its copies (0-based)."""


def expanded_blocks(data: Any, stop: int = limits.MAX_BLOCKS) -> list[tuple[Path, tuple[Copy, ...]]]:
    """The blocks of spec data in execution order (``blocks[i]``), at most ``stop`` of them: each
    block's written path and, per ``repeat`` group around it (outermost first), which copy it is in.
    A ``repeat`` that is not a count in 1..MAX_REPEAT counts once, and the walk gives up after
    ``16 * MAX_BLOCKS`` steps (unvalidated data: nested groups of empty groups copy nothing 256^depth
    times); validation reports either."""
    found: list[tuple[Path, tuple[Copy, ...]]] = []
    steps = [0]

    def walk(items: Any, prefix: Path, copies: tuple[Copy, ...]) -> None:
        steps[0] += 1
        if not isinstance(items, list):
            return
        for i, item in enumerate(items):
            steps[0] += 1
            if len(found) >= stop or steps[0] > 16 * limits.MAX_BLOCKS:
                return
            if isinstance(item, dict) and "repeat" in item and "layers" in item:
                for copy_index in range(_copies(item)):
                    if len(found) >= stop or steps[0] > 16 * limits.MAX_BLOCKS:
                        return
                    walk(item["layers"], prefix + (i, "layers"), copies + ((prefix + (i,), copy_index),))
            else:
                found.append((prefix + (i,), copies))

    walk(data.get("layers") if isinstance(data, dict) else None, ("layers",), ())
    return found


def _copies(group: dict) -> int:
    """A group's ``repeat`` where it is a count in 1..MAX_REPEAT, else 1 (validation reports it)."""
    repeat = group["repeat"]
    valid = isinstance(repeat, int) and not isinstance(repeat, bool) and 1 <= repeat <= limits.MAX_REPEAT
    return repeat if valid else 1


def unshared(data: Any, depth: int = 0) -> Any:
    """A deep copy of spec data in which no two places share an object: a spec from Python may list one
    layer dict twice (``[block] * 2``), and an override of one place must not change the other
    (``copy.deepcopy`` keeps such sharing). Deeper than the spec's nesting limit is left to validation,
    copied as it is (a structure that holds itself)."""
    if depth > limits.MAX_DEPTH:
        return copy.deepcopy(data)
    if isinstance(data, dict):
        return {key: unshared(value, depth + 1) for key, value in data.items()}
    if isinstance(data, list):
        return [unshared(value, depth + 1) for value in data]
    return copy.deepcopy(data)


def unroll_copy(data: dict, smap: SourceMap, copies: tuple[Copy, ...], path: Path) -> tuple[dict, Path]:
    """``data`` (a copy) with the copy of each ``repeat`` group that ``path`` lies in written out on its
    own, between the copies before it and those after (each a group of the same layers), so that one
    block of one copy can be changed; and the block's new path. ``smap`` follows the moves."""
    data = unshared(data)
    for depth in range(len(copies)):
        group, index = copies[depth]  # its path after the moves of the groups around it
        parent, position = group[:-1], group[-1]
        siblings = _get(data, parent)
        node = siblings[position]
        after = node["repeat"] - index - 1
        pieces = ([{**node, "repeat": index}] if index else []) + [{**copy.deepcopy(node), "repeat": 1}] + \
                 ([{**copy.deepcopy(node), "repeat": after}] if after else [])
        siblings[position:position + 1] = pieces
        own = position + (1 if index else 0)
        _shift_positions(smap, parent, position, len(pieces))
        # the groups further in, and the block, now lie under the written-out copy
        moved = lambda old: parent + (own,) + old[len(group):]  # noqa: E731
        copies = copies[:depth + 1] + tuple((moved(g), i) for g, i in copies[depth + 1:])
        path = moved(path)
    return data, path


def _shift_positions(smap: SourceMap, parent: Path, position: int, count: int) -> None:
    """Source positions after item ``position`` of the list at ``parent`` became ``count`` items (each
    a copy of it): later items move up by ``count - 1``; each new item has the old one's positions."""
    cut = len(parent)
    for table in (smap.values, smap.keys):
        moved = {}
        for path, pos in table.items():
            if path[:cut] != parent or len(path) == cut or not isinstance(path[cut], int) or path[cut] < position:
                moved[path] = pos
            elif path[cut] == position:
                for k in range(count):
                    moved[parent + (position + k,) + path[cut + 1:]] = pos
            else:
                moved[parent + (path[cut] + count - 1,) + path[cut + 1:]] = pos
        table.clear()
        table.update(moved)


def expand_pattern(data: Any, pattern: Path) -> list[Path]:
    """The concrete paths a pattern names in ``data``: ``[*]`` is every item of the list found there
    (none if there is no list), ``blocks[*]`` every written block. May be empty. (``blocks[N]`` is
    resolved by :func:`set_path`, which may unroll a ``repeat`` group for it.)"""
    if pattern[0] == BLOCKS:
        paths, rest = (written_blocks(data) if pattern[1] == EVERY else []), pattern[2:]
    else:
        paths, rest = [()], pattern
    for part in rest:
        if part != EVERY:
            paths = [path + (part,) for path in paths]
            continue
        widened = []
        for path in paths:
            node = _get(data, path)
            if isinstance(node, list):
                widened.extend(path + (i,) for i in range(len(node)))
        paths = widened
    return paths


def _get(data: Any, path: Path) -> Any:
    node = data
    for part in path:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
    return node


def apply_override(data: dict, smap: SourceMap, assignment: str, flag: str = "--set") -> dict:
    """Apply one ``dotted.path=value`` override (value parsed as a YAML scalar, list or mapping).

    See :func:`set_path` for what a path may name and how a value lands.
    """
    shown = assignment if len(assignment) <= 80 else assignment[:77] + "..."
    where = Position(f"{flag} {shown}")
    if "=" not in assignment:
        raise SpecError(Problem("an override must look like `path.to.key=value`, e.g. "
                                "`layers[0].mixer.feature_map=relu`", source=where.source))
    raw_path, raw_value = assignment.split("=", 1)
    value = parse_yaml_value(raw_value, where.source)[0] if raw_value.strip() else ""
    value_map = SourceMap()
    _mark_all(value, (), value_map, where)
    return set_path(data, smap, raw_path.strip(), value, where, value_map)


def set_path(data: dict, smap: SourceMap, pattern_text: str, value: Any, where: Position,
             value_map: SourceMap) -> dict:
    """``data`` (a copy) with ``value`` written at every path ``pattern_text`` names.

    - ``layers[0].mixer.heads``: one path; intermediate mappings are created as needed, and a
      component written in the string shorthand (``feature_map: relu``) is expanded so its fields
      can be set.
    - ``layers[*].mixer.heads``: every item of the list; ``blocks[*].mixer.heads``: every written
      block, inside ``repeat`` groups at any depth (``blocks[2]``: the third). A pattern that
      matches nothing is an error.
    - A mapping value replaces the whole node (``layers[*].mixer={kind: softmax, heads: 4}`` leaves
      nothing of the old mixer); setting a component's ``kind`` to another kind keeps only the
      fields the new kind has (``mixer.kind=softmax`` keeps ``heads``, drops ``feature_map``).

    ``where`` locates errors; ``value_map`` holds the positions of the value's parts (re-rooted at
    every path written). Unknown keys are left for validation, which reports them with a suggestion.
    """
    try:
        pattern = parse_dotted_path(pattern_text)
    except ValueError as err:
        raise SpecError(Problem(f"malformed path '{shorten(pattern_text)}': {err}", source=where.source,
                                line=where.line, column=where.column)) from None
    if pattern[0] == BLOCKS and isinstance(pattern[1], slice):  # each block of the slice as blocks[N]
        chosen = range(*pattern[1].indices(len(expanded_blocks(data))))
        if not chosen:
            count = len(expanded_blocks(data))
            raise SpecError(Problem(f"this slice picks no block; the spec has {count} block(s), blocks[0] to "
                                    f"blocks[{count - 1}]", path=format_pattern(pattern), source=where.source,
                                    line=where.line, column=where.column))
        for index in chosen:
            rest = format_pattern(pattern[2:]) if len(pattern) > 2 else ""
            data = set_path(data, smap, f"blocks[{index}]" + ("." + rest if rest else ""), value, where, value_map)
        return data
    if pattern[0] == BLOCKS and pattern[1] != EVERY:
        data, pattern = _one_block(data, smap, pattern)
    paths = expand_pattern(data, pattern)
    if not paths:
        hint = ""
        if pattern[0] == BLOCKS:
            count = len(expanded_blocks(data))
            hint = f"; the spec has {count} block(s), blocks[0] to blocks[{count - 1}]" if count else \
                "; the spec has no blocks"
        elif pattern[0] == "layers" and EVERY in pattern:
            hint = "; blocks inside `repeat` groups are reached with `blocks[*]`"
        raise SpecError(Problem(f"this path matches nothing in the spec{hint}",
                                path=format_pattern(pattern), source=where.source, line=where.line,
                                column=where.column))
    for path in paths:
        _refuse_block_key_on_group(data, path, where)
    data = unshared(data)
    for path in paths:
        _assign(data, smap, path, copy.deepcopy(value), where)
        smap.replace_subtree(path, value_map)
        smap.values[path] = value_map.values.get((), where)
        smap.keys[path] = where
    return data


def _one_block(data: dict, smap: SourceMap, pattern: Path) -> tuple[dict, Path]:
    """``blocks[N].rest`` as the written path of the model's N-th block (after unrolling the ``repeat``
    copies it lies in, when there are several), or the pattern unchanged when there is no N-th block."""
    blocks = expanded_blocks(data, stop=pattern[1] + 1)
    if len(blocks) <= pattern[1]:
        return data, pattern
    path, copies = blocks[pattern[1]]
    copies = tuple((group, index) for group, index in copies if _copies(_get(data, group)) > 1)
    if copies:
        data, path = unroll_copy(data, smap, copies, path)
    return data, path + pattern[2:]


def _refuse_block_key_on_group(data: dict, path: Path, where: Position) -> None:
    """A block's key (``mixer``, ``mlp``, ...) written on a ``repeat`` group: say how to reach its blocks."""
    node: Any = data
    for depth, part in enumerate(path):
        if isinstance(node, dict) and "repeat" in node and "layers" in node and part not in ("repeat", "layers"):
            raise SpecError(Problem(f"'{format_path(path[:depth])}' is a `repeat` group, which has no '{part}'; "
                                    "write `blocks[*]` to reach every block inside groups",
                                    path=format_path(path), source=where.source, line=where.line,
                                    column=where.column))
        node = _get(node, (part,))


def _assign(data: dict, smap: SourceMap, path: Path, value: Any, where: Position) -> None:
    """Write ``value`` at the concrete ``path`` of ``data`` (in place)."""
    def fail(message: str) -> SpecError:
        return SpecError(Problem(message, path=format_path(path), source=where.source, line=where.line,
                                 column=where.column))

    node: Any = data
    for depth, part in enumerate(path[:-1]):
        if isinstance(part, int):
            if not isinstance(node, list):
                raise fail(f"'{format_path(path[:depth])}' is not a list, so it has no index [{part}]")
            if part >= len(node):
                raise fail(f"index [{part}] is out of range: '{format_path(path[:depth])}' has {len(node)} item(s)")
            child = node[part]
        else:
            if not isinstance(node, dict):
                raise fail(f"'{format_path(path[:depth])}' is not a mapping, so it has no key '{part}'")
            child = node.get(part)
            if child is None:  # created here: errors about it belong to this override
                child = {}
                smap.values[path[: depth + 1]] = smap.keys[path[: depth + 1]] = where
        if isinstance(child, str) and not isinstance(path[depth + 1], int):
            child = {"kind": child}  # expand the `feature_map: relu` shorthand
        node[part] = child
        smap.values.setdefault(path[: depth + 1], where)
        node = child
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise fail(f"index [{last}] does not exist in '{format_path(path[:-1])}'")
    elif not isinstance(node, dict):
        raise fail(f"'{format_path(path[:-1])}' is not a mapping")
    elif last == "kind" and len(path) > 1 and isinstance(path[-2], str):
        _keep_fields_of_kind(node, components._FIELDS, path[-2], value)
    elif last == "kind" and len(path) > 2 and isinstance(path[-2], int) and isinstance(path[-3], str):
        _keep_fields_of_kind(node, components._LIST_FIELDS, path[-3], value)  # a parallel mixer's branches[i]
    node[last] = value


def _keep_fields_of_kind(node: dict, fields: list, key: str, new_kind: Any) -> None:
    """Changing the ``kind`` of the component under ``key`` (a slot field, or an item of a list of a slot's
    components, as ``fields`` records them): drop the fields the new kind lacks."""
    slots = {slot for _, name, slot in fields if name == key}
    if len(slots) != 1 or not isinstance(new_kind, str):
        return
    slot = slots.pop()
    old_kind = node.get("kind", components.DEFAULT_KINDS.get(slot))
    cls = components.SLOTS.get(slot, {}).get(new_kind)
    if cls is None or old_kind == new_kind:
        return  # an unknown kind is reported by validation, with suggestions
    accepted = {alias for name, info in cls.model_fields.items() for alias in (name, info.alias) if alias}
    for field_name in [name for name in node if name not in accepted]:
        del node[field_name]


def apply_patches(data: dict, smap: SourceMap) -> dict:
    """Apply a spec's own ``set:`` mapping (``path: value``, wildcards allowed), in order, and drop it.

    This is how a spec that ``extends`` another changes something inside a list:
    ``set: {"layers[*].mixer.feature_map": relu}``. Errors point at the key in the file.
    """
    if "set" not in data:
        return data
    patches = data["set"]
    data = {key: value for key, value in data.items() if key != "set"}
    if not isinstance(patches, dict):
        raise _problem("`set` must be a mapping of paths to values, e.g. `set: {\"layers[*].mixer.heads\": 8}`",
                       ("set",), smap.value_at(("set",)))
    for key, value in patches.items():
        where = smap.key_at(("set", key)) or Position("set")
        data = set_path(data, smap, str(key), value, where, smap.subtree(("set", key)))
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
