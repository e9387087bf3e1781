"""The compile checks that passed on this machine (``compile-checks.json`` in the attnspec cache), each
signed by this user's key: a build of a structure checked before reuses its check (the manifest says
so). A received, copied or hand-edited file has no valid signature and is ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path

import torch

from attnspec.io import VERSION


CHECKS_FILE = "compile-checks.json"


def check_key(spec_data: dict, modes: list[str], device: str = "cpu", level: str = "inductor") -> str:
    """What a build's compile check depends on: the resolved spec without its name, description and seed
    (which change only words and values: two imports of one architecture from two folders are one
    structure), the plan's modes, the device type (another device compiles other code), the check's
    level (:data:`attnspec.compiler.compile.CHECK_BACKENDS`) and the attnspec and torch versions."""
    data = {key: value for key, value in spec_data.items() if key not in ("name", "description", "seed")}
    versions = [VERSION, torch.__version__]
    where = [] if device == "cpu" else [device]
    how = [] if level == "inductor" else [level]
    text = json.dumps([data, modes, *where, *how, *versions], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# A reused check skips a compile, so the cache entry must prove that this user's attnspec ran it: each
# entry is signed with an HMAC under a key only this user can read (created on first use, mode 0600).
# A received, copied or hand-edited compile-checks.json has no valid signature, and is ignored.
SECRET_FILE = "compile-checks.key"


def passed_before(key: str) -> dict | None:
    """The report of a check that passed for the same structure (:func:`check_key`) on this machine, if
    the cache holds one signed by this user's key with a well-formed report; else None (check again)."""
    entry = _read_checks().get(key)
    secret = _secret(create=False)
    if not isinstance(entry, dict) or secret is None:
        return None
    report, proof = entry.get("report"), entry.get("proof")
    if not (_valid_report(report) and isinstance(proof, str)
            and hmac.compare_digest(proof, _sign(secret, key, report))):
        return None
    return report


def remember_pass(key: str, report: dict) -> None:
    """Record a passed check, signed, in the cache (merged with what other processes wrote, replaced atomically)."""
    from attnspec.io import write_cache_file

    secret = _secret(create=True)
    if secret is None or not _valid_report(report):
        return
    checks = _read_checks()
    checks[key] = {"report": report, "proof": _sign(secret, key, report)}
    write_cache_file(_checks_path(), "checks", checks)


def _valid_report(report: object) -> bool:
    """A report as :func:`check_compiled` returns it, small enough for the manifest."""
    if not isinstance(report, dict) or set(report) != REPORT_KEYS:
        return False
    lengths, graphs = report["lengths"], report["graphs"]
    return (isinstance(lengths, list) and 0 < len(lengths) <= 16
            and all(type(n) is int and 0 < n <= 1 << 20 for n in lengths)
            and all(type(report[k]) in (int, float) and 0 <= report[k] < 1e6 for k in ("max_abs_diff", "max_rel_diff"))
            and type(graphs) is int and 0 <= graphs <= 1 << 16 and type(report["dynamic"]) is bool
            and report["backend"] in ("inductor", "aot_eager"))


REPORT_KEYS = {"lengths", "max_abs_diff", "max_rel_diff", "graphs", "dynamic", "backend"}
"""What :func:`attnspec.compiler.compile.check_compiled` reports (a half-precision model's absolute difference
is in the output's units, which may well exceed 1: the check judges it against the output's largest value)."""


def _sign(secret: bytes, key: str, report: dict) -> str:
    return hmac.new(secret, json.dumps([key, report], sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _secret(create: bool) -> bytes | None:
    """This user's signing key for compile checks (32 random bytes, a regular file of this user's that
    nobody else can read), created if ``create``; None when there is none or it is not trustworthy."""
    from attnspec.io import cache_directory

    path = cache_directory() / SECRET_FILE
    if create and not path.exists() and not path.is_symlink():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(32))
        except OSError:
            return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        secret = handle.read(64)
    return secret if len(secret) == 32 else None


def _checks_path() -> Path:
    from attnspec.io import cache_directory

    return cache_directory() / CHECKS_FILE


def _read_checks() -> dict[str, dict]:
    from attnspec.io import read_cache_file

    return {k: v for k, v in read_cache_file(_checks_path(), "checks").items() if isinstance(v, dict)}


__all__ = ["CHECKS_FILE", "SECRET_FILE", "check_key", "passed_before", "remember_pass"]
