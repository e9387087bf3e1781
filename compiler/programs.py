"""Loading exported programs (``model.pt2``, ``step.pt2``) without ever unpickling.

``torch.export.load`` unpickles in four places: weights and constants marked ``use_pickle`` in the
archive's configs (``torch.load`` with ``weights_only`` off), custom and opaque objects among the
constants, the sample inputs when ``weights_only=True`` fails on them, and the whole legacy
(pre-2.7) format. A crafted archive can use any of them to run code. :func:`load_program` first
checks the archive against what ``torch.export.save`` writes for an attnspec model: a whitelist of
entry names, configs with no pickled payload, sample inputs that load with ``weights_only=True``,
and bounded sizes; only an archive that passes is handed to ``torch.export.load``, which then has
no pickle to take. AOTInductor packages are native code by design and are never loaded here.
"""

from __future__ import annotations

import io
import json
import re
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
            if name.endswith("_config.json"):
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


def load_program(path: Path | str):
    """``torch.export.load(path)`` for an archive that passes :func:`check_archive`; any failure is a BuildError.

    Returns:
        The ``torch.export.ExportedProgram``.
    """
    import torch

    path = Path(path)
    check_archive(path)
    try:
        return torch.export.load(str(path))
    except Exception as error:  # noqa: BLE001 - a damaged program must not crash the caller
        raise BuildError(f"{path} could not be loaded ({type(error).__name__}: {shorten(str(error), 160)}); "
                         "rebuild the directory") from None


__all__ = ["check_archive", "load_program"]
