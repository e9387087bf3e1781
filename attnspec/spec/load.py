"""Loading a spec from a file or text: front-end -> extends -> overrides -> validation.

This is the one entry point the CLI and the compiler use.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path as FsPath
from typing import Any, Iterable

from attnspec.errors import Problem, SpecError
from attnspec.spec import limits
from attnspec.spec.attn_front import parse_attn
from attnspec.spec.compose import apply_override, resolve_extends
from attnspec.spec.ir import Spec
from attnspec.spec.source import SourceMap
from attnspec.spec.validate import validate_data
from attnspec.spec.yaml_front import parse_yaml

YAML_SUFFIXES = (".yaml", ".yml")
ATTN_SUFFIXES = (".attn",)


def parse_text(text: str, fmt: str, source: str = "<string>") -> tuple[dict, SourceMap]:
    """Parse spec ``text`` written in ``fmt`` (``"yaml"`` or ``"attn"``) into data and positions."""
    if fmt == "yaml":
        return parse_yaml(text, source)
    if fmt == "attn":
        return parse_attn(text, source)
    raise SpecError(Problem(f"unknown spec format '{fmt}'; use 'yaml' or 'attn'"))


def format_of(path: FsPath) -> str:
    """``"yaml"`` or ``"attn"`` from a file name; raises SpecError for other suffixes."""
    suffix = path.suffix.lower()
    if suffix in YAML_SUFFIXES:
        return "yaml"
    if suffix in ATTN_SUFFIXES:
        return "attn"
    raise SpecError(Problem(f"cannot tell the spec format from the suffix '{suffix or '(none)'}'; name the file "
                            "*.yaml, *.yml or *.attn", source=str(path)))


def read_text_file(path: FsPath) -> str:
    """The UTF-8 text of the regular spec file ``path``, at most ``MAX_SPEC_BYTES`` bytes.

    FIFOs, devices and directories are refused before anything is read (reading a FIFO blocks,
    ``/dev/zero`` never ends). Raises :class:`SpecError` naming the file.
    """
    source = str(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError(Problem("is a directory, not a spec file", source=source))
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(Problem("is not a regular file (a FIFO, socket or device); give a spec file",
                                    source=source))
        if info.st_size > limits.MAX_SPEC_BYTES:
            raise SpecError(Problem(f"is {info.st_size:,} bytes; spec files are limited to "
                                    f"{limits.MAX_SPEC_BYTES:,}", source=source))
        with open(path, "rb") as handle:
            raw = handle.read(limits.MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(Problem("no such file", source=source)) from None
    except OSError as err:
        raise SpecError(Problem(f"cannot read: {err.strerror}", source=source)) from None
    if len(raw) > limits.MAX_SPEC_BYTES:  # it grew after the stat
        raise SpecError(Problem(f"is over {limits.MAX_SPEC_BYTES:,} bytes, the limit for spec files", source=source))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(Problem(f"not UTF-8 text ({err.reason} at byte {err.start})", source=source)) from None


def read_file(path: FsPath) -> tuple[dict, SourceMap]:
    """Read and parse one spec file (no ``extends`` applied)."""
    fmt = format_of(path)
    return parse_text(read_text_file(path), fmt, str(path))


def load_data(source: str | FsPath | dict, overrides: Iterable[str] = ()) -> tuple[dict, SourceMap]:
    """Spec data with ``extends`` and ``overrides`` (``"path=value"`` strings) applied, before validation."""
    if isinstance(source, dict):
        data, smap, file = source, SourceMap(), None
    else:
        file = FsPath(source)
        data, smap = read_file(file)
    data, smap = resolve_extends(data, smap, file, read_file)
    for assignment in overrides:
        data = apply_override(data, smap, assignment)
    return data, smap


def load_spec(source: str | FsPath | dict, overrides: Iterable[str] = (), resolved: bool = True) -> Spec:
    """Load, compose and validate a spec.

    Args:
        source: a ``.yaml``/``.yml``/``.attn`` file path, or spec data as a dict.
        overrides: ``"dotted.path=value"`` strings applied in order (like ``--set``).
        resolved: fill derived defaults (d_qk, d_v, scale, sizes); False keeps what was written.

    Returns:
        The validated :class:`~attnspec.spec.ir.Spec`.

    Raises:
        SpecError: with file:line:column and a suggested fix for every problem.
    """
    data, smap = load_data(source, overrides)
    return validate_data(data, smap, resolved=resolved)


def loads_spec(text: str, fmt: str = "yaml", overrides: Iterable[str] = (), source: str = "<string>",
               resolved: bool = True) -> Spec:
    """Like :func:`load_spec` for spec text (``extends`` is resolved relative to the working directory)."""
    data, smap = parse_text(text, fmt, source)
    data, smap = resolve_extends(data, smap, None, read_file)
    for assignment in overrides:
        data = apply_override(data, smap, assignment)
    return validate_data(data, smap, resolved=resolved)


__all__: list[Any] = ["load_spec", "loads_spec", "load_data", "parse_text", "read_file", "format_of"]
