"""Validation: plain data + source map -> resolved :class:`Spec`, or a located :class:`SpecError`.

Pydantic reports errors by location tuples that include union tags (``("layers", 0,
"block", "mixer", "linear", "feature_map")``). Here they are mapped back onto the
user's data (tags dropped), given a file:line:column from the source map, and
rephrased with suggestions. The cross-field rules run afterwards, through the same
formatting.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from attnspec.errors import Problem, SpecError, did_you_mean, shorten
from attnspec.spec import limits
from attnspec.spec.components import import_plugins, load_entry_points
from attnspec.spec.ir import Spec
from attnspec.spec.resolve import resolve
from attnspec.spec.rules import check_rules
from attnspec.spec.source import Path, SourceMap, format_path

_TYPE_NAMES = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "bool_type": "true or false", "string_type": "a string",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
}


def validate_data(data: Any, smap: SourceMap | None = None, resolved: bool = True) -> Spec:
    """Validate plain spec data and return the resolved IR.

    Args:
        data: the mapping produced by a front-end (or written by hand).
        smap: source positions for error messages; optional.
        resolved: fill derived defaults (see :mod:`attnspec.spec.resolve`).

    Raises:
        SpecError: listing every problem with its location and a suggested fix.
    """
    smap = smap or SourceMap()
    if not isinstance(data, dict):
        raise SpecError(Problem("the spec must be a mapping", source=smap.root.source if smap.root else None))
    _check_size(data, smap)
    load_entry_points()
    import_plugins(data.get("plugins"), smap.value_at)
    spec = validate_model(Spec, data, smap)
    violations = check_rules(spec)
    if violations:
        raise SpecError([_locate(path, message, smap, key=False) for path, message in violations])
    return resolve(spec) if resolved else spec


def validate_model(model: type[BaseModel], data: Any, smap: SourceMap | None = None, what: str = "spec") -> Any:
    """Validate ``data`` against any strict IR-style ``model`` (a spec, a training configuration, a
    sweep) with the spec's located, rephrased errors.

    Raises:
        SpecError: every problem, with file:line:column where ``smap`` knows it.
    """
    smap = smap or SourceMap()
    if not isinstance(data, dict):
        raise SpecError(Problem(f"the {what} must be a mapping", source=smap.root.source if smap.root else None))
    _check_size(data, smap)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SpecError(_problems_from_pydantic(err, data, smap, model)) from None


def _check_size(data: Any, smap: SourceMap) -> None:
    """Refuse data nested deeper than ``MAX_DEPTH`` or holding more than ``MAX_VALUES`` values.

    The front-ends bound what they produce; this bounds data handed to the API directly (and the
    result of ``--set``), before pydantic recurses into it. Iterative, so any depth is safe to walk.
    """
    count = 0
    stack: list[tuple[Any, Path]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        count += 1
        if count > limits.MAX_VALUES:
            raise SpecError(_locate(path, f"the spec holds more than {limits.MAX_VALUES:,} values (attnspec's "
                                          "limit)", smap, key=False))
        if len(path) > limits.MAX_DEPTH:
            raise SpecError(_locate(path[:limits.MAX_DEPTH], f"nested more than {limits.MAX_DEPTH} levels deep "
                                                             "(attnspec's limit)", smap, key=False))
        if isinstance(node, dict):
            stack.extend((value, path + (key,)) for key, value in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((value, path + (i,)) for i, value in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) \
                and abs(node).bit_length() > 4 * limits.MAX_NUMBER_CHARS:
            raise SpecError(_locate(path, f"an integer of {abs(node).bit_length()} bits; numbers are limited to "
                                          f"{limits.MAX_NUMBER_CHARS} digits", smap, key=False))


def _locate(path: Path, message: str, smap: SourceMap, key: bool) -> Problem:
    pos = smap.key_at(path) if key else smap.value_at(path)
    return Problem(message, path=format_path(path), source=pos.source if pos else None,
                   line=pos.line if pos else None, column=pos.column if pos else None)


def _user_path(loc: tuple, data: Any) -> Path:
    """Drop pydantic's union tags from ``loc`` by walking the user's data alongside it."""
    path: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif last or not isinstance(node, (dict, list)):
            if not (isinstance(node, str) and part == "kind"):
                path.append(part)
            node = None
        # otherwise `part` is a union tag: skip it
    return tuple(path)


def _problems_from_pydantic(err: ValidationError, data: Any, smap: SourceMap, root: type = Spec) -> list[Problem]:
    problems = []
    seen = set()
    for error in err.errors(include_url=False):
        loc = tuple(error["loc"])
        path = _user_path(loc, data)
        if error["type"] == "union_tag_invalid" and isinstance(_value_at(data, path), dict):
            path = path + ("kind",)  # point at the offending `kind:` value itself
        message = _message(error, loc, root)
        if (path, message) in seen:
            continue
        seen.add((path, message))
        problems.append(_locate(path, message, smap, key=error["type"] == "extra_forbidden"))
    return problems


def _value_at(data: Any, path: Path) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _message(error: dict, loc: tuple, root: type = Spec) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "extra_forbidden":
        allowed = allowed_keys(loc[:-1], root)
        hint = did_you_mean(loc[-1], allowed)
        listing = f"; allowed keys: {', '.join(allowed)}" if allowed and not hint else ""
        return f"unknown key {shorten(loc[-1])}{hint}{listing}"
    if kind == "missing":
        return f"missing required key '{loc[-1]}'"
    if kind == "union_tag_invalid":
        tags = re.findall(r"'([^']*)'", ctx.get("expected_tags", ""))
        return (f"unknown kind {shorten(ctx.get('tag'))}{did_you_mean(ctx.get('tag'), tags)}; expected one of: "
                f"{', '.join(tags)}")
    if kind == "union_tag_not_found":
        tags = allowed_kinds(loc, root)
        return f"missing 'kind'; expected one of: {', '.join(tags)}" if tags else "missing 'kind'"
    if kind == "literal_error":
        options = re.findall(r"'([^']*)'|(\d+)", ctx.get("expected", ""))
        options = [a or b for a, b in options]
        return (f"unknown value {shorten(value)}{did_you_mean(value, options)}; expected one of: "
                f"{', '.join(options)}")
    if kind in _TYPE_NAMES:
        got = f"{type(value).__name__} {shorten(value)}" if value is not None else "null"
        return f"expected {_TYPE_NAMES[kind]}, got {got}"
    if kind in ("less_than", "less_than_equal"):
        return f"{error['msg'].replace('Input should', 'must')}, got {shorten(value)} (attnspec's limit)"
    if kind in ("greater_than", "greater_than_equal"):
        return f"{error['msg'].replace('Input should', 'must')}, got {shorten(value)}"
    if kind == "finite_number":
        return f"must be a finite number, got {shorten(value)}"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        text = error["msg"].replace("List should", "must").replace("Value should", "must")
        return text.replace("String should", "must") + (" (attnspec's limit)" if "long" in kind else "")
    if kind == "value_error":  # a validator's own sentence (its ValueError), without pydantic's prefix
        return shorten(str(ctx.get("error", error["msg"])), 400).strip("'\"")
    return shorten(error["msg"], 200)


# ---------------------------------------------------------------- walking the IR's types along a loc


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> list[tuple[str, Any]]:
    """Union members with their tags (the ``kind`` literal or a pydantic ``Tag``)."""
    out = []
    for member in typing.get_args(annotation):
        tag = None
        if typing.get_origin(member) is typing.Annotated:
            for meta in typing.get_args(member)[1:]:
                tag = getattr(meta, "tag", tag)
            member = typing.get_args(member)[0]
        member = _unwrap(member)
        if tag is None and isinstance(member, type) and issubclass(member, BaseModel) and "kind" in member.model_fields:
            tag = typing.get_args(member.model_fields["kind"].annotation)[0]
        out.append((tag, member))
    return out


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _type_at(loc: tuple, root: type = Spec) -> Any:
    annotation: Any = root
    for part in loc:
        annotation = _unwrap(annotation)
        if _is_union(annotation):
            members = _members(annotation)
            chosen = [m for tag, m in members if tag == part]
            if chosen:
                annotation = chosen[0]
                continue
            models = [m for _, m in members if isinstance(m, type) and issubclass(m, BaseModel)]
            if len(models) != 1:
                return None
            annotation = models[0]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if part not in annotation.model_fields:
                return None
            annotation = annotation.model_fields[part].annotation
        elif typing.get_origin(annotation) is list and isinstance(part, int):
            annotation = typing.get_args(annotation)[0]
        else:
            return None
    return _unwrap(annotation)


def allowed_keys(loc: tuple, root: type = Spec) -> list[str]:
    """Field names of the model at pydantic location ``loc`` (tags included) below ``root``, or []."""
    annotation = _type_at(loc, root)
    if _is_union(annotation):
        models = [m for _, m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        annotation = models[0] if len(models) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [info.alias or name for name, info in annotation.model_fields.items()]
    return []


def allowed_kinds(loc: tuple, root: type = Spec) -> list[str]:
    """The ``kind`` tags accepted at ``loc`` (a union of components) below ``root``, or []."""
    annotation = _type_at(loc, root)
    return [str(tag) for tag, _ in _members(annotation)] if _is_union(annotation) else []
