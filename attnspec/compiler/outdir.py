"""Writing a build directory without ever losing what was there (DESIGN sec. 5, "Trust").

A build is written into a scratch directory beside the output (``.NAME.tmp-XXXXXXXX``) and
published with one atomic rename:

* without ``--force``, ``renameat2(RENAME_NOREPLACE)``: if anything appeared at the output while the
  build ran (another build, the user), the build fails and that thing is untouched;
* with ``--force``, only an attnspec build directory may be replaced (a valid manifest and no file it
  does not list), and ``renameat2(RENAME_EXCHANGE)`` swaps the new build in, so at every instant
  the output is the complete old build or the complete new one; the old one is then deleted.

Every scratch directory is locked (``flock``) by the build that owns it, for as long as it runs.
A build killed with SIGKILL leaves its scratch behind; the next build to the same output removes
every leftover whose lock it can take (the owner is dead) and that holds only files a build writes.
Parent directories are created only once the spec is valid, and removed again if the build fails.
Where ``renameat2`` is missing (not Linux, or a filesystem without it) a check-then-rename is used,
and an old build moved aside for ``--force`` is restored by the next build if the swap was cut short.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attnspec.compiler.manifest import FILE_NAMES, MANIFEST, parse_manifest
from attnspec.errors import BuildError

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
BUILD_FILES = frozenset(FILE_NAMES + (MANIFEST,))


def _renameat2(source: Path, target: Path, flags: int) -> bool:
    """``renameat2`` with ``flags``; False where the system or filesystem does not support it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), ctypes.c_uint(flags))
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(target))


def replaceable_problem(output: Path) -> str | None:
    """Why ``--force`` may not replace ``output`` (None when it is an attnspec build directory)."""
    if output.is_symlink() or not output.is_dir():
        return "it is not a directory" if not output.is_symlink() else "it is a symbolic link"
    try:
        manifest = parse_manifest(output)
    except BuildError:
        return "it has no valid manifest.json, so attnspec did not write it"
    foreign = sorted(name for name in os.listdir(output) if name != MANIFEST and name not in manifest.files)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        return f"it holds files attnspec did not write ({shown}); move them out first"
    return None


@dataclass(frozen=True)
class OutputKind:
    """What an atomically published directory holds: its ``files`` (the only names a leftover scratch
    directory may hold to be removed) and why ``--force`` may not replace an existing one."""

    what: str
    files: frozenset[str]
    replaceable_problem: Callable[[Path], "str | None"]


BUILD = OutputKind("build directory", BUILD_FILES, replaceable_problem)


def check_output(output: Path, force: bool, kind: OutputKind = BUILD) -> None:
    """Refuse an output that exists (without ``force``) or that is not one attnspec wrote (with it)."""
    if not os.path.lexists(output):
        return
    problem = kind.replaceable_problem(output)
    if not force:  # --force advised only where it would replace the output
        if problem:
            raise BuildError(f"{output} already exists and is not a {kind.what} attnspec wrote ({problem}); "
                             "choose another -o")
        raise BuildError(f"{output} already exists; pass --force to replace this {kind.what}, or choose another -o")
    if problem:
        raise BuildError(f"{output} exists and --force replaces only a {kind.what} attnspec wrote: "
                         f"{problem}. Nothing was changed; choose another -o")


class Scratch:
    """A locked scratch directory beside ``output``, published atomically or removed.

    Use as a context manager: leaving it by an exception removes the scratch directory and any
    parent directory it created; :meth:`publish` moves the finished build into place.
    """

    def __init__(self, output: Path, kind: OutputKind = BUILD):
        self.output, self.kind = output, kind
        self.created_parents: list[Path] = []
        self.path: Path | None = None
        self.lock: int | None = None

    def __enter__(self) -> "Scratch":
        parent = self.output.parent
        missing = []
        for folder in (parent, *parent.parents):
            if os.path.lexists(folder):
                break
            missing.append(folder)
        try:
            for folder in reversed(missing):
                folder.mkdir()
                self.created_parents.append(folder)
            remove_leftovers(self.output, self.kind.files)
            self.path = Path(tempfile.mkdtemp(prefix=f".{self.output.name}.tmp-", dir=parent))
        except OSError as error:
            self._remove_parents()
            raise BuildError(f"cannot write the build beside {self.output}: {error.strerror or error}; choose an -o "
                             "in a writable directory") from None
        self.lock = _lock(self.path)
        return self

    def publish(self, force: bool) -> None:
        """Move the finished scratch directory to the output (see the module docstring)."""
        assert self.path is not None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.path, 0o777 & ~umask)  # mkdtemp made it private; a build directory is ordinary
        try:
            if os.path.lexists(self.output):
                if not force:
                    raise BuildError(f"{self.output} appeared while this build ran (another build?); it was left as "
                                     "it is and this build discarded; pass --force to replace a build directory")
                check_output(self.output, force, self.kind)  # again: it may have changed while the build ran
                self._exchange()
            else:
                self._move_into_place()
        except OSError as error:
            raise BuildError(f"cannot publish the build at {self.output}: {error.strerror or error}") from None

    def _move_into_place(self) -> None:
        assert self.path is not None
        try:
            done = _renameat2(self.path, self.output, _RENAME_NOREPLACE)
        except FileExistsError:
            raise BuildError(f"{self.output} appeared while this build ran (another build?); it was left as it is "
                             "and this build discarded; pass --force to replace it") from None
        if not done:
            if os.path.lexists(self.output):
                raise BuildError(f"{self.output} appeared while this build ran; it was left as it is")
            os.rename(self.path, self.output)
        self.path = None

    def _exchange(self) -> None:
        assert self.path is not None
        if _renameat2(self.path, self.output, _RENAME_EXCHANGE):
            old = self.path  # now holds the previous build
        else:  # no atomic swap here: move the old build aside (restored by the next build if we die now)
            old = self.output.with_name(f".{self.output.name}.old-{os.getpid()}")
            os.rename(self.output, old)
            os.rename(self.path, self.output)
        self.path = None
        shutil.rmtree(old, ignore_errors=True)

    def __exit__(self, kind, error, trace) -> None:
        if self.lock is not None:
            os.close(self.lock)
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
        if kind is not None:
            self._remove_parents()

    def _remove_parents(self) -> None:
        for folder in reversed(self.created_parents):
            try:
                folder.rmdir()  # only if still empty
            except OSError:
                break
        self.created_parents = []


def _lock(path: Path) -> int:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return descriptor


def remove_leftovers(output: Path, files: frozenset[str] = BUILD_FILES) -> list[Path]:
    """Remove scratch and moved-aside directories of dead builds (or exports) of ``output``; returns
    what was removed.

    A leftover is removed only if it matches the names builds use, is a real directory, holds only
    ``files`` (what a build, or an export, writes), and its lock can be taken (no live build owns it).
    A moved-aside old build whose output is missing is put back instead.
    """
    parent = output.parent
    pattern = re.compile(rf"\.{re.escape(output.name)}\.(tmp-[A-Za-z0-9_]{{8}}|old-[0-9]+)")
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not pattern.fullmatch(name):
            continue
        path = parent / name
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode) or not set(os.listdir(path)) <= files:
                continue
            descriptor = _lock(path)
        except OSError:  # locked by a live build, or gone
            continue
        try:
            if ".old-" in name and not os.path.lexists(output):
                os.rename(path, output)
                continue
            shutil.rmtree(path)
            removed.append(path)
        finally:
            os.close(descriptor)
    return removed


__all__ = ["BUILD", "OutputKind", "Scratch", "check_output", "remove_leftovers", "replaceable_problem"]
