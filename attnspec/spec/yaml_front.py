"""YAML front-end: safe, bounded loading with source positions, in YAML 1.2's core schema.

PyYAML composes the document into nodes (no object is ever constructed from a tag: the loader
below has no constructors at all); this module converts the nodes to plain data by hand,
recording the mark of every key and value, rejecting duplicate keys, and bounding what a hostile
document can make it do:

* nesting is limited while composing (PyYAML's composer recurses; a 500-deep document would
  otherwise end in RecursionError), and the number of values is limited while converting, so
  an alias bomb (``a: &a [*b, *b, ...]``) is refused after ``MAX_VALUES`` values, in milliseconds;
* plain scalars are resolved by YAML 1.2's core schema, not PyYAML's YAML 1.1 rules, and the
  YAML 1.1 forms that would silently change meaning (``064`` = 52, ``0x40``, ``1:04`` = 64,
  ``6_4``, ``yes``/``on``) are errors that say what to write instead;
* explicit tags (``!!python/object``, ``!!int``) are refused: a spec is plain data.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from attnspec.errors import Problem, SpecError, excerpt_line, shorten
from attnspec.spec import limits
from attnspec.spec.source import Path, Position, SourceMap, format_path

_STR_TAG = "tag:yaml.org,2002:str"
_PLAIN_TAG = "attnspec:plain"  # an untagged plain scalar, resolved by resolve_plain
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MAP_TAG = "tag:yaml.org,2002:map"


class _Loader(Reader, Scanner, Parser, Composer, BaseResolver):
    """Composes nodes only. Untagged plain scalars get ``_PLAIN_TAG`` and are resolved by
    :func:`resolve_plain`; quoted ones and ``!!str`` are strings. The nesting depth is counted as
    nodes are composed."""

    def __init__(self, stream: str):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        BaseResolver.__init__(self)
        self.depth = 0

    def resolve(self, kind: Any, value: str, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return _PLAIN_TAG
        return super().resolve(kind, value, implicit)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > limits.MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _TooDeep(mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _TooDeep(Exception):
    def __init__(self, mark: Any):
        self.mark = mark


# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), plus the YAML 1.1 forms
# that PyYAML would have read differently, each with what to write instead.
_NULL = re.compile(r"~|null|Null|NULL|")
_TRUE = re.compile(r"true|True|TRUE")
_FALSE = re.compile(r"false|False|FALSE")
_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
_RADIX = re.compile(r"[-+]?0([xX][0-9a-fA-F_]+|[oO][0-7_]+|[bB][01_]+)")
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")
_UNDERSCORED = re.compile(r"[-+]?([0-9][0-9_]*)?\.?[0-9_]*([eE][-+]?[0-9]+)?")
_YAML11_BOOL = {word: value for words, value in (("y yes on", True), ("n no off", False))
                for word in words.split()}


def resolve_plain(text: str) -> Any:
    """The value of a plain (unquoted) YAML scalar under the 1.2 core schema.

    Raises ValueError with what to write instead for forms YAML 1.1 reads differently.
    """
    if len(text) > limits.MAX_NUMBER_CHARS and (_INT.fullmatch(text) or _FLOAT.fullmatch(text)):
        raise ValueError(f"a number of {len(text)} characters; numbers are limited to "
                         f"{limits.MAX_NUMBER_CHARS} characters")
    if _NULL.fullmatch(text):
        return None
    if _TRUE.fullmatch(text):
        return True
    if _FALSE.fullmatch(text):
        return False
    if _INT.fullmatch(text):
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits.startswith("0"):
            raise ValueError(f"'{text}' has a leading zero, which YAML 1.1 reads as octal "
                             f"({_octal_or_none(text)}) and YAML 1.2 as {int(text)}; write {int(text)}")
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.fullmatch(text):
        return math.nan
    if _RADIX.fullmatch(text):
        value = int(text.replace("_", ""), 0)
        raise ValueError(f"'{text}' is a hexadecimal, octal or binary integer; specs take decimal numbers: "
                         f"write {value}")
    if _SEXAGESIMAL.fullmatch(text) and any(c.isdigit() for c in text):
        raise ValueError(f"'{text}' is a base-60 number in YAML 1.1 ({_sexagesimal(text)}) and a string in "
                         f"YAML 1.2; write {_sexagesimal(text)}, or quote it if you meant a string")
    if "_" in text and _UNDERSCORED.fullmatch(text) and any(c.isdigit() for c in text):
        plain = text.replace("_", "")
        raise ValueError(f"'{text}' uses '_' as a digit separator, which only YAML 1.1 allows; write {plain}")
    if text.lower() in _YAML11_BOOL and text in (text.lower(), text.capitalize(), text.upper()):
        meant = "true" if _YAML11_BOOL[text.lower()] else "false"
        raise ValueError(f"'{text}' is a boolean in YAML 1.1 but a string in YAML 1.2; write {meant}, "
                         f"or quote it ('{text}') if you meant the string")
    return text


def _octal_or_none(text: str) -> str:
    try:
        return str(int(text.lstrip("+-"), 8) * (-1 if text.startswith("-") else 1))
    except ValueError:
        return "invalid octal"


def _sexagesimal(text: str) -> str:
    sign = -1 if text.startswith("-") else 1
    value: float = 0
    for part in text.lstrip("+-").replace("_", "").split(":"):
        value = value * 60 + float(part)
    value *= sign
    return str(int(value)) if float(value).is_integer() else str(value)


def parse_yaml(text: str, source: str = "<string>") -> tuple[dict, SourceMap]:
    """Parse YAML spec ``text`` into a mapping and a :class:`SourceMap`.

    Raises :class:`SpecError` with line and column on syntax errors, duplicate keys, non-string
    keys, YAML 1.1 scalars, tags, documents nested or expanding past the limits, and non-mapping
    documents.
    """
    data, smap = parse_yaml_value(text, source)
    if data is None:
        raise SpecError(Problem("the spec is empty; it must be a mapping with at least `name`, "
                                "`input`, `d_model`, `max_len` and `layers`", source=source, line=1, column=1))
    if not isinstance(data, dict):
        raise SpecError(Problem("the spec must be a mapping of keys to values, "
                                f"not a {type(data).__name__}", source=source, line=1, column=1))
    return data, smap


def parse_yaml_value(text: str, source: str = "<string>") -> tuple[Any, SourceMap]:
    """Parse one YAML document of any shape (a spec, or a ``--set`` value) into data and positions."""
    if len(text) > limits.MAX_SPEC_BYTES:
        raise SpecError(Problem(f"{len(text):,} characters; specs are limited to {limits.MAX_SPEC_BYTES:,}",
                                source=source))
    try:
        loader = _Loader(text)  # the reader checks for control characters here already
    except yaml.reader.ReaderError as err:
        raise SpecError(_reader_problem(err, text, source)) from None
    try:
        try:
            node = loader.get_single_node()
        except _TooDeep as err:
            raise SpecError(Problem(f"nested more than {limits.MAX_DEPTH} levels deep (attnspec's limit)",
                                    source=source, line=err.mark.line + 1, column=err.mark.column + 1)) from None
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            problem = (err.problem or err.context or "invalid YAML").strip()
            if err.context and err.problem:
                problem = f"{err.context.strip()}: {problem}"
            raise SpecError(Problem(f"YAML syntax error: {problem}", source=source,
                                    line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None,
                                    excerpt=_excerpt(text, mark))) from None
        except yaml.reader.ReaderError as err:
            raise SpecError(_reader_problem(err, text, source)) from None
        except yaml.YAMLError as err:
            raise SpecError(Problem(f"YAML error: {shorten(str(err), 200)}", source=source)) from None
        smap = SourceMap(root=Position(source, 1, 1))
        if node is None:
            return None, smap
        return _Converter(source, text, smap).convert(node, (), 1), smap
    finally:
        loader.dispose()


def _excerpt(text: str, mark: Any) -> str | None:
    lines = text.splitlines()
    if mark is None or not 0 <= mark.line < len(lines):
        return None
    return excerpt_line(lines[mark.line], mark.column + 1)


def _reader_problem(err: yaml.reader.ReaderError, text: str, source: str) -> Problem:
    before = text[: err.position]
    line = before.count("\n") + 1
    column = err.position - (before.rfind("\n") + 1) + 1
    return Problem(f"YAML error: character {err.character!r} is not allowed in YAML text", source=source,
                   line=line, column=column)


class _Converter:
    """Nodes -> plain data with positions; counts values so aliases cannot expand without bound."""

    def __init__(self, source: str, text: str, smap: SourceMap):
        self.source, self.text, self.smap = source, text, smap
        self.values = 0

    def _problem(self, message: str, mark: Any, path: Path = (), excerpt: bool = True) -> SpecError:
        return SpecError(Problem(message, path=format_path(path), source=self.source, line=mark.line + 1,
                                 column=mark.column + 1, excerpt=_excerpt(self.text, mark) if excerpt else None))

    def convert(self, node: yaml.Node, path: Path, depth: int) -> Any:
        self.values += 1
        if self.values > limits.MAX_VALUES:
            raise self._problem(f"the document expands to more than {limits.MAX_VALUES:,} values (attnspec's "
                                "limit; YAML aliases repeating large anchors?)", node.start_mark, path, False)
        if depth > limits.MAX_DEPTH:  # only a recursive alias (&a [*a]) gets here: composing checked the rest
            raise self._problem(f"nested more than {limits.MAX_DEPTH} levels deep (a recursive alias?)",
                                node.start_mark, (), False)
        self.smap.values[path] = _position(self.source, node.start_mark)
        if isinstance(node, yaml.MappingNode):
            self._check_tag(node, _MAP_TAG, path=path)
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            self._check_tag(node, _SEQ_TAG, path=path)
            return [self.convert(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: Path, depth: int) -> dict:
        out: dict[str, Any] = {}
        first_seen: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self._problem("keys must be plain strings", key_node.start_mark, path)
            key = self._scalar(key_node, path)
            if key == "<<" and key_node.tag == _PLAIN_TAG:
                raise self._problem("YAML merge keys (`<<`) are not part of YAML 1.2; use `extends:` to build on "
                                    "another spec", key_node.start_mark, path)
            if not isinstance(key, str):
                raise self._problem(f"keys must be strings, got {type(key).__name__} {shorten(key)}",
                                    key_node.start_mark, path)
            if key in first_seen:
                first = first_seen[key]
                raise self._problem(f"duplicate key {shorten(key, 40)} (first defined at line {first.line + 1}); "
                                    "remove one of them", key_node.start_mark, path + (key,))
            first_seen[key] = key_node.start_mark
            self.smap.keys[path + (key,)] = _position(self.source, key_node.start_mark)
            out[key] = self.convert(value_node, path + (key,), depth + 1)
        return out

    def _check_tag(self, node: yaml.Node, *allowed: str, path: Path) -> None:
        if node.tag not in allowed:
            raise self._problem(f"YAML tags such as {shorten(node.tag, 40)} are not allowed in specs: a spec is "
                                "plain data; remove the tag", node.start_mark, path)

    def _scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        self._check_tag(node, _PLAIN_TAG, _STR_TAG, path=path)
        if node.tag == _STR_TAG:  # quoted, block or `!!str`
            return node.value
        try:
            return resolve_plain(node.value)
        except ValueError as err:
            raise self._problem(str(err), node.start_mark, path) from None


def _position(source: str, mark: Any) -> Position:
    return Position(source, mark.line + 1, mark.column + 1)


__all__ = ["parse_yaml", "parse_yaml_value", "resolve_plain"]
