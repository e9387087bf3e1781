"""Writing an IR back out, as YAML or as the compact grammar.

``spec_to_data(spec, minimal=True)`` drops every value equal to its default and
collapses kind-only components to their string shorthand, so converted specs stay
short. YAML -> IR -> grammar -> IR is the identity on the IR (a test checks it for
every spec in ``specs/``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from attnspec.spec.ir import Spec

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schema" / "attnspec.schema.json"
"""The committed JSON Schema of specs, where attnspec runs from a checkout (``attnspec schema -o FILE`` writes
it anywhere)."""
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEYWORDS = {"true", "false", "null", "layers", "block", "repeat"}
_FREE_TEXT = {"name", "description", "extends"}


def spec_to_data(spec: Spec, minimal: bool = True) -> dict:
    """The spec as plain data; ``minimal`` drops defaults and uses the string shorthand."""
    data = spec.model_dump(mode="json", exclude_defaults=minimal)
    return _tidy(data, minimal)


def _tidy(value: Any, minimal: bool) -> Any:
    if isinstance(value, dict):
        ordered = {"kind": value["kind"]} if "kind" in value else {}
        ordered.update({k: _tidy(v, minimal) for k, v in value.items() if k != "kind"})
        if minimal and list(ordered) == ["kind"] and isinstance(ordered["kind"], str):
            return ordered["kind"]
        return ordered
    if isinstance(value, list):
        return [_tidy(v, minimal) for v in value]
    return value


def schema_modeline(folder: Path | str) -> list[str]:
    """The YAML language server's modeline for a spec written in ``folder``: the checkout's schema by its path
    relative to ``folder``, as the shipped specs name it; none where attnspec is installed without one."""
    if not SCHEMA_FILE.is_file():
        return []
    return [f"# yaml-language-server: $schema={Path(os.path.relpath(SCHEMA_FILE, Path(folder).resolve())).as_posix()}"]


def to_yaml(spec: Spec, minimal: bool = True, header: str | None = None, folder: Path | str | None = None) -> str:
    """YAML text of ``spec``, with an optional comment header; written into ``folder``, it starts with
    :func:`schema_modeline` (editors then complete and check it)."""
    lines = [] if folder is None else schema_modeline(folder)
    if header:
        lines += [f"# {line}".rstrip() for line in header.splitlines()]
    body = yaml.safe_dump(spec_to_data(spec, minimal), sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(lines) + "\n" + body


def to_attn(spec: Spec, minimal: bool = True) -> str:
    """Compact-grammar text of ``spec``."""
    data = spec_to_data(spec, minimal)
    out = []
    for key, value in data.items():
        if key != "layers":
            out.append(f"{key} = {_value(value, key)}")
    out.append("layers {")
    out.extend(_layers(data["layers"], 1))
    out.append("}")
    return "\n".join(out) + "\n"


def _layers(items: list, depth: int) -> list[str]:
    pad = "  " * depth
    lines = []
    for item in items:
        if "repeat" in item:
            lines.append(f"{pad}repeat {item['repeat']} {{")
            lines.extend(_layers(item["layers"], depth + 1))
            lines.append(f"{pad}}}")
        else:
            lines.append(f"{pad}block {{")
            for key, value in item.items():
                lines.append(f"{pad}  {key} = {_value(value, key)}")
            lines.append(f"{pad}}}")
    return lines


def _value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _BARE.match(value) and value not in _KEYWORDS and key not in _FREE_TEXT:
            return value
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v, key) for v in value) + "]"
    if isinstance(value, dict) and "kind" in value:
        args = []
        parts = [k for k in ("lowrank", "sparse") if k in value and value["kind"] == "scatterbrain"]
        if parts:
            args.append(" + ".join(f"{k}({_value(value[k], k)})" for k in parts))
        args += [f"{k}={_value(v, k)}" for k, v in value.items() if k != "kind" and k not in parts]
        return f"{value['kind']}({', '.join(args)})"
    assert isinstance(value, dict)
    inner = " ".join(f"{k} = {_value(v, k)}" for k, v in value.items())
    return "{ " + inner + " }" if inner else "{ }"
