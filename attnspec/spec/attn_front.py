"""Grammar front-end: the compact ``.attn`` syntax -> the same plain data as YAML.

The grammar (``grammars/attnspec.lark``) is parsed with lark's LALR parser; the tree
is then converted by hand so every value keeps its line and column. Semantic checks
are not done here: the data goes through the same validation as YAML, so both
front-ends give the same messages.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from attnspec.errors import Problem, SpecError, excerpt_line
from attnspec.spec import limits
from attnspec.spec.source import Path, Position, SourceMap, format_path

_READABLE = {
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'",
    "EQUAL": "'='", "COMMA": "','", "PLUS": "'+'", "NAME": "a name", "STRING": "a string",
    "SIGNED_NUMBER": "a number", "INT": "an integer", "$END": "the end of the file",
}


@lru_cache(maxsize=1)
def grammar() -> Lark:
    """The compiled LALR parser of the compact grammar (cached)."""
    text = resources.files("attnspec.grammars").joinpath("attnspec.lark").read_text()
    return Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _readable(terminal: str) -> str:
    if terminal in _READABLE:
        return _READABLE[terminal]
    return f"'{terminal.lower()}'"


def parse_attn(text: str, source: str = "<string>") -> tuple[dict, SourceMap]:
    """Parse compact-grammar ``text`` into plain data and a :class:`SourceMap`.

    Raises :class:`SpecError` with line, column, the source line and a caret.
    """
    if len(text) > limits.MAX_SPEC_BYTES:
        raise SpecError(Problem(f"{len(text):,} characters; specs are limited to {limits.MAX_SPEC_BYTES:,}",
                                source=source))
    _check_nesting(text, source)
    try:
        tree = grammar().parse(text)
    except UnexpectedInput as err:
        raise SpecError(_syntax_problem(err, text, source)) from None
    smap = SourceMap(root=Position(source, 1, 1))
    return _Converter(source, smap).start(tree), smap


def _check_nesting(text: str, source: str) -> None:
    """Refuse brackets nested deeper than the limit before parsing (the tree is converted recursively).

    Brackets inside strings and comments are skipped; unbalanced ones are left to the parser.
    """
    depth, line, column, i = 0, 1, 0, 0
    while i < len(text):
        char = text[i]
        column += 1
        if char == "\n":
            line, column = line + 1, 0
        elif char == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif char == '"':
            i += 1
            while i < len(text) and text[i] not in '"\n':
                i += 2 if text[i] == "\\" else 1
                column += 1
        elif char in "([{":
            depth += 1
            if depth > limits.MAX_DEPTH:
                raise SpecError(Problem(f"nested more than {limits.MAX_DEPTH} levels deep (attnspec's limit)",
                                        source=source, line=line, column=column))
        elif char in ")]}":
            depth = max(0, depth - 1)
        i += 1


def _syntax_problem(err: UnexpectedInput, text: str, source: str) -> Problem:
    if isinstance(err, UnexpectedToken):
        expected = sorted({_readable(t) for t in err.expected})
        got = "the end of the file" if err.token.type == "$END" else f"'{err.token}'"
        message = f"syntax error: unexpected {got}; expected {', '.join(expected)}"
    elif isinstance(err, UnexpectedCharacters):
        message = f"syntax error: unexpected character {text[err.pos_in_stream]!r}"
    elif isinstance(err, UnexpectedEOF):
        message = "syntax error: unexpected end of file (an unclosed '(', '[' or '{'?)"
    else:  # pragma: no cover - lark's other UnexpectedInput subclasses
        message = f"syntax error: {err}"
    line = getattr(err, "line", None)
    column = getattr(err, "column", None)
    at_end = isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END")
    if at_end or line is None or line < 1:  # point just after the last character of the text
        lines = text.rstrip().splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    lines = text.splitlines()
    excerpt = excerpt_line(lines[line - 1], column) if 1 <= line <= len(lines) else None
    return Problem(message, source=source, line=line, column=column, excerpt=excerpt)


class _Converter:
    def __init__(self, source: str, smap: SourceMap):
        self.source = source
        self.smap = smap

    def _pos(self, node: Tree | Token) -> Position:
        if isinstance(node, Token):
            return Position(self.source, node.line, node.column)
        return Position(self.source, node.meta.line, node.meta.column)

    def _error(self, message: str, node: Tree | Token, path: Path) -> SpecError:
        pos = self._pos(node)
        return SpecError(Problem(message, path=format_path(path), source=pos.source, line=pos.line, column=pos.column))

    def start(self, tree: Tree) -> dict:
        out: dict[str, Any] = {}
        for item in tree.children:
            if item.data == "assign":
                self._assign(item, out, ())
            else:  # layers_section
                if "layers" in out:
                    raise self._error("a second `layers { ... }` section; merge them into one", item, ("layers",))
                self.smap.keys[("layers",)] = self._pos(item)
                self.smap.values[("layers",)] = self._pos(item)
                out["layers"] = self._layers(item.children, ("layers",))
        return out

    def _assign(self, node: Tree, out: dict, path: Path,
                duplicate: str = "duplicate key '{}'; remove one of them") -> None:
        """``key = value`` (or a call's ``key=value``) into ``out``; ``duplicate`` is the message for a repeated key."""
        key_token, value = node.children
        key = str(key_token)
        if key in out:
            raise self._error(duplicate.format(key), key_token, path + (key,))
        self.smap.keys[path + (key,)] = self._pos(key_token)
        out[key] = self._value(value, path + (key,))

    def _layers(self, items: list, path: Path) -> list:
        result = []
        for i, item in enumerate(items):
            here = path + (i,)
            self.smap.values[here] = self._pos(item)
            if item.data == "block":
                block: dict[str, Any] = {}
                for assign in item.children:
                    self._assign(assign, block, here)
                result.append(block)
            else:  # repeat INT { layer* }
                count, *body = item.children
                self.smap.values[here + ("repeat",)] = self._pos(count)
                self.smap.values[here + ("layers",)] = self._pos(item)
                result.append({"repeat": self._number(count, here + ("repeat",)),
                               "layers": self._layers(body, here + ("layers",))})
        return result

    def _value(self, node: Tree | Token, path: Path) -> Any:
        self.smap.values[path] = self._pos(node)
        kind = node.data
        if kind == "name":
            return str(node.children[0])
        if kind == "string":
            try:
                return json.loads(str(node.children[0]))
            except json.JSONDecodeError as err:
                raise self._error(f"invalid string: {err.msg.removesuffix(' at')} (character {err.pos} of the "
                                  "string); strings use JSON escapes "
                                  "(\\n, \\t, \\\", \\\\, \\uXXXX) and may not contain raw tabs or newlines",
                                  node, path) from None
        if kind == "number":
            return self._number(node, path)
        if kind in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[kind]
        if kind == "list":
            items = [c for c in node.children if c is not None]
            return [self._value(item, path + (i,)) for i, item in enumerate(items)]
        if kind == "mapping":
            out: dict[str, Any] = {}
            for assign in node.children:
                self._assign(assign, out, path)
            return out
        if kind == "call":
            return self._call(node, path)
        if kind == "sum":
            raise self._error("a sum such as `lowrank(...) + sparse(...)` is only allowed as an argument, e.g. "
                              "`mixer = scatterbrain(lowrank(performer()) + sparse(lsh()))`", node, path)
        raise self._error(f"unexpected {kind}", node, path)  # pragma: no cover

    def _number(self, node: Tree | Token, path: Path) -> int | float:
        text = str(node if isinstance(node, Token) else node.children[0])
        if len(text) > limits.MAX_NUMBER_CHARS:
            raise self._error(f"a number of {len(text)} characters; numbers are limited to "
                              f"{limits.MAX_NUMBER_CHARS} characters", node, path)
        return float(text) if any(c in text for c in ".eE") else int(text)

    def _call(self, node: Tree, path: Path) -> dict:
        name, *args = node.children
        out: dict[str, Any] = {"kind": str(name)}
        self.smap.keys[path + ("kind",)] = self._pos(name)
        self.smap.values[path + ("kind",)] = self._pos(name)
        for arg in args:
            if arg is None:
                continue
            if arg.data == "keyword":
                self._assign(arg, out, path, duplicate="argument '{}' given twice")
                continue
            value = arg.children[0]
            terms = value.children if value.data == "sum" else [value]
            for term in terms:
                parts = term.children[1:] if term.data == "call" else []
                if term.data != "call" or len(parts) != 1 or parts[0] is None or parts[0].data != "positional":
                    raise self._error("a positional argument must be `part(value)` terms such as "
                                      "`lowrank(performer(num_features=32)) + sparse(lsh(buckets=8))`; "
                                      "write other arguments as `key=value`", term, path)
                key = str(term.children[0])
                if key in out:
                    raise self._error(f"argument '{key}' given twice", term, path + (key,))
                self.smap.keys[path + (key,)] = self._pos(term)
                out[key] = self._value(parts[0].children[0], path + (key,))
        return out
