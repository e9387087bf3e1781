"""Loading exported programs (``model.pt2``, ``step.pt2``) without ever unpickling.

``torch.export.load`` runs code of the archive's choosing in two ways. It unpickles in four places:
weights and constants marked ``use_pickle`` in the archive's configs (``torch.load`` with
``weights_only`` off), custom and opaque objects among the constants, the sample inputs when
``weights_only=True`` fails on them, and the whole legacy (pre-2.7) format. And it *parses strings*
of the serialized graph (``models/*.json``): every symbolic size ``expr_str`` goes through
``sympy.sympify``, which evaluates Python; ``guards_code`` is Python source that torch compiles into
a guard function; and a node's ``target`` names any attribute under ``torch``, ``operator`` or
``math``, which the program then calls (``torch.serialization.load`` would unpickle a file).

:func:`check_archive` therefore checks an archive against what ``torch.export.save`` writes for an
attnspec model before torch sees it: a whitelist of entry names, configs with no pickled payload,
sample inputs that load with ``weights_only=True``, bounded sizes, and in the graph: every
``expr_str`` in a strict grammar of sympy's printed integer expressions (symbols, integers, the
arithmetic and the shape functions torch writes, nothing else), no ``guards_code``, and node targets
only among operator overloads (``torch.ops.aten``/``prims``/``attnspec``) and a few symbolic
arithmetic functions. Only an archive that passes is handed to ``torch.export.load``.
AOTInductor packages are native code by design and are never loaded here.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import zipfile
from pathlib import Path

from attnspec.errors import BuildError, shorten

MAX_ENTRIES = 100_000
MAX_JSON_BYTES = 256 << 20  # the serialized graph of a 256-block model is far below this

_ROOT = r"[A-Za-z0-9_]+"
_ALLOWED = re.compile(
    rf"{_ROOT}/(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/[A-Za-z0-9_]+\.json"
    r"|data/weights/weight_[0-9]+|data/weights/[A-Za-z0-9_]+_weights_config\.json"
    r"|data/constants/tensor_[0-9]+|data/constants/[A-Za-z0-9_]+_constants_config\.json"
    r"|data/sample_inputs/[A-Za-z0-9_]+\.pt)"
)
_PAYLOAD = re.compile(r"(weight|tensor)_[0-9]+")

# The strings torch evaluates or calls, and what attnspec's exports put in them.
MAX_EXPRESSION = 20_000
"""Characters of one symbolic expression (the longest in the shipped specs' programs is about 600)."""
MAX_EXPRESSION_DEPTH = 64
"""Parentheses nesting of one expression (sympy's printer nests one level per operation)."""
_EXPRESSION_TOKEN = re.compile(r"\s*(?:(?P<number>[0-9]{1,40})|(?P<word>[A-Za-z_][A-Za-z0-9_]*)"
                               r"|(?P<quoted>'[a-z][0-9]{1,12}')|(?P<op>//|\*\*|[()+\-*,=/]))")
_SYMBOL = re.compile(r"[a-z][0-9]{1,12}")
"""A shape symbol as torch names them: s0, s71, u3."""
_EXPRESSION_WORDS = frozenset({
    # sympy's printed forms of integer arithmetic and torch.utils._sympy.functions' shape helpers
    "Symbol", "Integer", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Rational",
    "FloorDiv", "CeilDiv", "CleanDiv", "IntTrueDiv", "Mod", "PythonMod", "ModularIndexing",
    "FloorToInt", "CeilToInt", "TruncToInt", "Identity",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "true", "false", "True", "False",
    # sympy's relational classes by their printed names (an unbacked size's range: u0 < 32)
    "Equality", "Unequality", "LessThan", "StrictLessThan", "GreaterThan", "StrictGreaterThan",
    # Symbol(...)'s assumptions
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite",
})
MAX_GUARDS = 4096
_GUARD_TOKEN = re.compile(
    r"\s*(?:(?P<source>L(?:\[(?:[0-9]{1,6}|'[A-Za-z_][A-Za-z0-9_]{0,100}')\])+"
    r"(?:\.(?:size|stride)\(\)\[[0-9]{1,3}\]|\.storage_offset\(\)|\.dim\(\))?)"
    r"|(?P<number>[0-9]{1,40})(?![A-Za-z_])|(?P<word>and|or|not|True|False)(?![A-Za-z0-9_])"
    r"|(?P<op>==|!=|<=|>=|//|[<>()+\-*%]))")
"""One token of a guard: an input's size, stride, offset or rank; an integer; a comparison or arithmetic."""
_TARGET = re.compile(r"torch\.ops\.(aten|prims|attnspec)\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?"
                     r"|torch\.ops\.higher_order\.(wrap_with_set_grad_enabled|wrap_with_autocast|cond|while_loop"
                     r"|map_impl|scan|associative_scan|invoke_subgraph|auto_functionalized|auto_functionalized_v2)"
                     r"|_operator\.(add|sub|mul|floordiv|truediv|mod|neg|pos|pow|getitem|eq|ne|lt|le|gt|ge|and_|or_"
                     r"|not_)"
                     r"|torch\.(sym_float|sym_int|sym_max|sym_min|sym_not|sym_ite|sym_sum|_sym_sqrt)"
                     r"|math\.(ceil|floor|trunc|sqrt)")
"""Node targets: operator overloads (data in, tensors out), and the symbolic-size arithmetic export emits."""


def check_archive(path: Path) -> None:
    """Refuse a ``.pt2`` archive that torch would unpickle anything from, or that is not one at all."""
    import torch

    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise BuildError(f"{path} is not an exported program (not a zip archive: {error}); rebuild the directory")
    with archive:
        entries = archive.infolist()
        if len(entries) > MAX_ENTRIES:
            raise BuildError(f"{path} has {len(entries):,} entries, more than an exported program has")
        for entry in entries:
            if not _ALLOWED.fullmatch(entry.filename):
                raise BuildError(f"{path} holds {shorten(entry.filename)}, which `torch.export.save` does not write "
                                 "for an attnspec model (a pickle, native code or an older format); refusing to "
                                 "load it. Rebuild the directory")
        for entry in entries:
            name = entry.filename
            if "/models/" in name:
                _check_graph(path, name, _read(archive, entry, path))
            elif name.endswith("_config.json"):
                _check_payload_config(path, name, _read(archive, entry, path))
            elif "/data/sample_inputs/" in name:
                try:  # torch would retry with weights_only=False if this failed: it must not fail
                    torch.load(io.BytesIO(_read(archive, entry, path)), weights_only=True)
                except Exception as error:  # noqa: BLE001 - any failure means torch would unpickle freely
                    raise BuildError(f"{path}: the sample inputs are not plain tensors ({type(error).__name__}); "
                                     "refusing to unpickle them. Rebuild the directory") from None


def _read(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, path: Path) -> bytes:
    if entry.file_size > MAX_JSON_BYTES:
        raise BuildError(f"{path}: {shorten(entry.filename)} is {entry.file_size:,} bytes, too large")
    try:
        return archive.read(entry)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as error:  # CRC errors, truncation
        raise BuildError(f"{path} is damaged ({shorten(str(error), 120)}); rebuild the directory") from None


def _check_payload_config(path: Path, name: str, raw: bytes) -> None:
    try:
        config = json.loads(raw)["config"]
        items = config.items()
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise BuildError(f"{path}: {shorten(name)} is not a valid payload table; rebuild the directory") from None
    for fqn, meta in items:
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False \
                or not _PAYLOAD.fullmatch(str(meta.get("path_name"))):
            raise BuildError(f"{path}: {shorten(fqn)} is stored as a pickle or an object, not as a plain tensor; "
                             "refusing to load it. Rebuild the directory")


def _check_graph(path: Path, name: str, raw: bytes) -> None:
    """Refuse a serialized graph with a string torch would evaluate, compile or call beyond what
    attnspec's exports write (see the module doc)."""
    try:
        graph = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise BuildError(f"{path}: {shorten(name)} is not a valid serialized graph; rebuild the directory") from None
    stack = [graph]
    while stack:  # iterative: any nesting is safe to walk
        value = stack.pop()
        if isinstance(value, dict):
            guards = value.get("guards_code")
            if guards is not None and not (isinstance(guards, list) and len(guards) <= MAX_GUARDS
                                           and all(is_safe_guard(guard) for guard in guards)):
                raise BuildError(f"{path}: {shorten(name)} carries guard code (Python source torch compiles) that is "
                                 "not a comparison of input sizes, as torch writes them. Refusing to load it. Rebuild "
                                 "the directory")
            expression = value.get("expr_str")
            if expression is not None and not is_safe_expression(expression):
                raise BuildError(f"{path}: {shorten(name)} holds the symbolic size {shorten(expression)}, which is "
                                 "not an integer expression torch writes (sympy would evaluate it as Python). "
                                 "Refusing to load it. Rebuild the directory")
            target = value.get("target")
            if "target" in value and "inputs" in value and not (isinstance(target, str) and _TARGET.fullmatch(target)):
                raise BuildError(f"{path}: {shorten(name)} calls {shorten(target)}, which is not an operator an "
                                 "attnspec model uses. Refusing to load it. Rebuild the directory")
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def is_safe_guard(text: object) -> bool:
    """Whether ``text`` is a guard as torch writes them for attnspec's programs: comparisons and
    integer arithmetic of input sizes (``L['token'].size()[0] == L['state'][0].size()[0]``), nothing
    that could call or name anything else."""
    return _tokens_all(text, _GUARD_TOKEN, lambda match: True)


def is_safe_expression(text: object) -> bool:
    """Whether ``text`` is a symbolic integer expression as torch prints them (``Mul(Integer(64),
    Symbol('s71', positive=True, integer=True))``, ``s0 + 128``): symbols, integers, + - * // **,
    the shape functions torch defines and Symbol's assumptions, nothing else, within the size limits;
    and every power an unnested base to a small literal exponent (``Pow(Symbol('s71', ...), Integer(2))``,
    ``s0**2``), so that sympy never computes a huge number (``Pow(Integer(10), Integer(10**10))``
    passed the token grammar and spun in ``sympify``)."""
    def allowed(match: re.Match) -> bool:
        word = match.group("word")
        return word is None or word in _EXPRESSION_WORDS or bool(_SYMBOL.fullmatch(word))

    tokens = _tokens(text, _EXPRESSION_TOKEN, allowed)
    return tokens is not None and _powers_bounded(tokens)


MAX_EXPONENT = 16
"""The largest exponent of a power in a program's symbolic sizes (torch writes squares)."""


def _powers_bounded(tokens: list[str]) -> bool:
    """Whether every ``Pow(base, exponent)`` and ``base**exponent`` in ``tokens`` has an integer literal
    exponent of at most :data:`MAX_EXPONENT` and a base without a power of its own: any such number
    stays within (the largest literal, 40 digits, times the expression's length) x 16 digits, which
    sympy computes at once, where nested or large powers (10**(10**10)) never finish."""
    def literal(start: int, end: int) -> bool:  # `2`, `Integer(2)`, `(2)`: tokens[start:end]
        inner = [t for t in tokens[start:end] if t not in ("Integer", "(", ")")]
        return len(inner) == 1 and inner[0].isdigit() and int(inner[0]) <= MAX_EXPONENT

    def argument_end(start: int) -> int:  # the index of the `,` or `)` closing the argument at `start`
        depth = 0
        for index in range(start, len(tokens)):
            if tokens[index] == "(":
                depth += 1
            elif tokens[index] in (")", ",") and depth == 0:
                return index
            elif tokens[index] == ")":
                depth -= 1
        return len(tokens)

    def group_start(end: int) -> int:  # the index of the `(` opening the group that closes at tokens[end]
        depth = 0
        for index in range(end, -1, -1):
            depth += {")": 1, "(": -1}.get(tokens[index], 0)
            if depth == 0:
                return index
        return 0

    def flat(start: int, end: int) -> bool:  # no power inside tokens[start:end]
        return start < end and not {"Pow", "**"} & set(tokens[start:end])

    for index, token in enumerate(tokens):
        if token == "Pow":
            comma = argument_end(index + 2)
            close = argument_end(comma + 1)
            if tokens[index + 1: index + 2] != ["("] or tokens[comma: comma + 1] != [","] or \
                    not flat(index + 2, comma) or not literal(comma + 1, close):
                return False
        elif token == "**":
            exponent_end = index + 2 if tokens[index + 1: index + 2] != ["("] else argument_end(index + 2) + 1
            base_start = group_start(index - 1) if index and tokens[index - 1] == ")" else index - 1
            if index == 0 or not flat(base_start, index) or not literal(index + 1, exponent_end):
                return False
    return True


def _tokens_all(text: object, token: re.Pattern, allowed) -> bool:
    return _tokens(text, token, allowed) is not None


def _tokens(text: object, token: re.Pattern, allowed) -> list[str] | None:
    """The tokens of ``text`` (a string within MAX_EXPRESSION) if it is a sequence of ``token``
    matches that ``allowed`` accepts, with balanced parentheses nested at most MAX_EXPRESSION_DEPTH
    deep; else None."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION:
        return None
    position, depth, tokens = 0, 0, []
    while position < len(text):
        match = token.match(text, position)
        if match is None or match.end() == position:
            return tokens if text[position:].strip() == "" and depth == 0 else None
        position = match.end()
        if not allowed(match):
            return None
        tokens.append(match.group().strip())
        if match.group("op") == "(":
            depth += 1
            if depth > MAX_EXPRESSION_DEPTH:
                return None
        elif match.group("op") == ")":
            depth -= 1
            if depth < 0:
                return None
    return tokens if depth == 0 else None


@contextlib.contextmanager
def _memoized_deserialization():
    """``torch.export.load`` with two of its repeated computations memoized, the program unchanged.

    torch's deserializer parses every symbolic size string of every node with ``sympy.sympify`` (a
    toy hybrid's three programs hold 9,000, nearly all repeats) and asks ``typing`` for a schema
    class's type hints once per serialized object (15,000 times for its prefill.pt2); memoized, that
    program loads in 2.1 s rather than 4.8 s. Within one load, a string parsed again with the same hint registers nothing new in the shape environment (its symbols are cached
    by name, their hints and ranges set once), and a dataclass's hints never change, so both are
    kept for the duration of the load. Where torch's internals are not as expected (another
    version), the load runs as torch wrote it. tests/compiler/test_trust.py holds the result equal
    to the plain load's."""
    with _PATCHING:  # one load at a time patches torch, so a thread never takes another's patch for torch's
        try:
            from torch._export.serde import serialize
            deserializer = serialize.GraphModuleDeserializer
            parse = deserializer._parse_sym_expr
            typing_module = serialize.typing
        except (ImportError, AttributeError):
            yield
            return

        def memoized_parse(self, expr_str, hint=None):
            if not isinstance(expr_str, str):
                return parse(self, expr_str, hint)
            memo = self.__dict__.setdefault("_attnspec_parsed", {})
            key = (expr_str, type(hint), hint)
            if key not in memo:
                memo[key] = parse(self, expr_str, hint)
            return memo[key]

        hints: dict = {}

        class _Typing:  # the typing module, its get_type_hints memoized per (class, namespace)
            def __getattr__(self, name):
                return getattr(typing_module, name)

            @staticmethod
            def get_type_hints(cls, globalns=None, *args, **kwargs):
                key = (cls, id(globalns), args, tuple(sorted(kwargs.items())))
                if key not in hints:
                    hints[key] = typing_module.get_type_hints(cls, globalns, *args, **kwargs)
                return hints[key]

        deserializer._parse_sym_expr, serialize.typing = memoized_parse, _Typing()
        try:
            yield
        finally:
            deserializer._parse_sym_expr, serialize.typing = parse, typing_module


_PATCHING = threading.RLock()


def load_program(path: Path | str):
    """``torch.export.load(path)`` for an archive that passes :func:`check_archive`; any failure is a BuildError.

    Returns:
        The ``torch.export.ExportedProgram``.
    """
    import torch

    path = Path(path)
    check_archive(path)
    try:
        with _memoized_deserialization():
            return torch.export.load(str(path))
    except Exception as error:  # noqa: BLE001 - a damaged program must not crash the caller
        raise BuildError(f"{path} could not be loaded ({type(error).__name__}: {shorten(str(error), 160)}); "
                         "rebuild the directory") from None


__all__ = ["check_archive", "load_program", "is_safe_expression", "is_safe_guard"]
