"""YAML front-end: safe loading with source positions and duplicate-key detection.

PyYAML's ``safe_load`` silently keeps the last of two equal keys and forgets where
values came from. Here the document is composed into nodes with the SafeLoader and
converted by hand, recording the mark of every key and value and rejecting
duplicate keys.
"""

from __future__ import annotations

from typing import Any

import yaml

from attnspec.errors import Problem, SpecError
from attnspec.spec.source import Path, Position, SourceMap


def _position(source: str, mark: Any) -> Position:
    return Position(source, mark.line + 1, mark.column + 1)


def _excerpt(text: str, mark: Any) -> str | None:
    lines = text.splitlines()
    if mark is None or not 0 <= mark.line < len(lines):
        return None
    return f"    {lines[mark.line]}\n    {' ' * mark.column}^"


def parse_yaml(text: str, source: str = "<string>") -> tuple[Any, SourceMap]:
    """Parse YAML ``text`` into plain data and a :class:`SourceMap`.

    Raises :class:`SpecError` with line and column on syntax errors, duplicate keys,
    non-string keys and non-mapping documents.
    """
    try:
        loader = yaml.SafeLoader(text)  # the reader checks for control characters here already
    except yaml.reader.ReaderError as err:
        raise SpecError(_reader_problem(err, text, source)) from None
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            problem = (err.problem or err.context or "invalid YAML").strip()
            if err.context and err.problem:
                problem = f"{err.context.strip()}: {problem}"
            raise SpecError(
                Problem(
                    f"YAML syntax error: {problem}",
                    source=source,
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                    excerpt=_excerpt(text, mark),
                )
            ) from None
        except yaml.reader.ReaderError as err:
            raise SpecError(_reader_problem(err, text, source)) from None
        except yaml.YAMLError as err:
            raise SpecError(Problem(f"YAML error: {err}", source=source)) from None
        smap = SourceMap(root=Position(source, 1, 1))
        if node is None:
            raise SpecError(Problem("the spec is empty; it must be a mapping with at least `name`, "
                                    "`input`, `d_model`, `max_len` and `layers`", source=source, line=1, column=1))
        data = _convert(loader, node, (), smap, source, text)
        if not isinstance(data, dict):
            raise SpecError(Problem("the spec must be a mapping of keys to values, "
                                    f"not a {type(data).__name__}", source=source, line=1, column=1))
        return data, smap
    finally:
        loader.dispose()


def _reader_problem(err: yaml.reader.ReaderError, text: str, source: str) -> Problem:
    before = text[: err.position]
    line = before.count("\n") + 1
    column = err.position - (before.rfind("\n") + 1) + 1
    return Problem(f"YAML error: character {err.character!r} is not allowed in YAML text", source=source,
                   line=line, column=column)


def _convert(loader: yaml.SafeLoader, node: yaml.Node, path: Path, smap: SourceMap, source: str, text: str) -> Any:
    smap.values[path] = _position(source, node.start_mark)
    if isinstance(node, yaml.MappingNode):
        try:
            loader.flatten_mapping(node)  # resolves `<<` merge keys
        except yaml.MarkedYAMLError as err:
            raise SpecError(Problem(f"YAML error: {err.problem}", source=source,
                                    line=err.problem_mark.line + 1, column=err.problem_mark.column + 1)) from None
        out: dict[str, Any] = {}
        first_seen: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(loader, key_node, source)
            if not isinstance(key, str):
                raise SpecError(Problem(f"keys must be strings, got {type(key).__name__} {key!r}",
                                        source=source, line=key_node.start_mark.line + 1,
                                        column=key_node.start_mark.column + 1,
                                        excerpt=_excerpt(text, key_node.start_mark)))
            if key in first_seen:
                first = first_seen[key]
                raise SpecError(Problem(
                    f"duplicate key '{key}' (first defined at line {first.line + 1}); remove one of them",
                    path=".".join(str(p) for p in path + (key,)) if path else key,
                    source=source, line=key_node.start_mark.line + 1, column=key_node.start_mark.column + 1,
                    excerpt=_excerpt(text, key_node.start_mark)))
            first_seen[key] = key_node.start_mark
            smap.keys[path + (key,)] = _position(source, key_node.start_mark)
            out[key] = _convert(loader, value_node, path + (key,), smap, source, text)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, path + (i,), smap, source, text) for i, item in enumerate(node.value)]
    return _scalar(loader, node, source)


def _scalar(loader: yaml.SafeLoader, node: yaml.Node, source: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise SpecError(Problem("keys must be plain strings", source=source,
                                line=node.start_mark.line + 1, column=node.start_mark.column + 1))
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as err:
        mark = err.problem_mark or node.start_mark
        raise SpecError(Problem(f"YAML error: {err.problem}", source=source,
                                line=mark.line + 1, column=mark.column + 1)) from None
