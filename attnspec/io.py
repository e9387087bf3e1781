"""File primitives for the directories attnspec owns: run and runs directories, reports, caches.

attnspec's directories travel between people, so their contents are data a stranger may have
shaped. Every function here holds to three rules (docs/trust.md):

- **never through a link**: a write, append, lock or delete refuses a symlink at the entry and at
  its parent directory (an atomic write renames a fresh file into place; nothing opens a path that
  exists for writing except with ``O_NOFOLLOW``), so a user's file linked into a received
  directory is never overwritten, truncated, appended to or deleted;
- **only our own entries**: :func:`remove_tree` removes a directory only when it holds nothing but
  regular files of the names the caller wrote;
- **bounded reads**: :func:`read_json` reads a regular file of bounded size, refuses NaN and
  infinities, and turns every failure (bad UTF-8, nesting deep enough to exhaust the parser's stack)
  into a :class:`~attnspec.errors.RunError`.

It also holds what several layers read and nothing above them defines: attnspec's version, the
cache directory, and the read side of a run directory (``attnspec build RUN_DIR`` and
``attnspec diagnose RUN_DIR`` read what ``attnspec train`` writes; the writer is
:mod:`attnspec.training.rundir`).

This module is layer 0: it imports nothing of attnspec but its errors, and no torch.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Callable

from attnspec.errors import RunError, shorten

VERSION = "0.1.0"
"""attnspec's version (``attnspec.__version__``), recorded in every manifest, run and cache key."""
MAX_JSON_BYTES = 64 << 20
"""The largest JSON file attnspec reads from a directory it owns (a run's metrics of 10^6 steps fit)."""


def cache_directory() -> Path:
    """attnspec's per-user cache (calibration, compile checks, compiled kernels):
    ``$ATTNSPEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnspec``, else ``~/.cache/attnspec``."""
    root = os.environ.get("ATTNSPEC_CACHE_DIR")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnspec"


def child_environment(**extra: str) -> dict[str, str]:
    """The environment of every Python child process attnspec starts (compile check, sweep workers,
    torchrun ranks, Ray tasks): this one's, with ``PYTHONSAFEPATH=1`` so the child's ``sys.path``
    never holds the working directory (a received folder's ``yaml.py`` must not shadow a library),
    plus ``extra``. It carries the user's plugin consent (``ATTNSPEC_PLUGINS``) and the files this
    process imported for it (``ATTNSPEC_PLUGIN_FILES``), which the child imports and no other."""
    return {**os.environ, "PYTHONSAFEPATH": "1", **extra}


def start_python(module: str, *args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``python -P -m module *args``, the one way attnspec launches a Python child (compile check,
    sweep workers, torchrun): ``-P`` and :func:`child_environment` (plus ``env``) keep the working
    directory off its ``sys.path`` and hand it the user's consent; on Linux the child is killed when
    this process dies, even by SIGKILL, so a killed build or sweep leaves nothing running.
    ``popen``: the rest of ``subprocess.Popen``'s arguments (pipes, files)."""
    def die_with_parent() -> None:  # in the child, before exec
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return subprocess.Popen([sys.executable, "-P", "-m", module, *args], env=child_environment(**(env or {})),
                            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None, **popen)


# ----------------------------------------------------------------------------- checks


def _lstat(path: Path) -> os.stat_result | None:
    """``os.lstat(path)`` (the entry itself, never a link's target); None when it does not exist."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RunError(f"{path}: cannot read ({error.strerror})") from None


def check_directory(path: Path, what: str = "directory") -> None:
    """Refuse ``path`` unless it is a real directory (not a symlink to one)."""
    info = _lstat(path)
    if info is None:
        raise RunError(f"{path}: no such {what}")
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise RunError(f"{path}: is a symbolic link; attnspec never writes through links in its directories. "
                       "Replace it with a real directory")
    if not stat.S_ISDIR(mode):
        raise RunError(f"{path}: exists and is not a directory")


def ensure_directory(path: Path) -> Path:
    """Create the directory ``path`` (and missing parents) or check that it is a real directory."""
    if not path.is_symlink() and not path.exists():
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunError(f"{path}: cannot create ({error.strerror})") from None
    check_directory(path)
    return path


def _check_target(path: Path) -> None:
    """The parent is a real directory; ``path`` is absent or a regular file (never a link)."""
    check_directory(path.parent)
    info = _lstat(path)
    if info is None:
        return
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise RunError(f"{path}: is a symbolic link; attnspec never writes through links in its directories. "
                       "Remove the link (the file it points to is untouched)")
    if not stat.S_ISREG(mode):
        raise RunError(f"{path}: exists and is not a regular file; move it away")


# ----------------------------------------------------------------------------- writes


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a fresh temporary sibling renamed over it: readers see the old or the
    new content, never half, and a link at ``path`` or a linked parent is refused, not followed."""
    payload = data.encode() if isinstance(data, str) else data

    def write(tmp: Path) -> None:  # O_EXCL | O_NOFOLLOW: a file nobody else made, never through a link
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as handle:
            handle.write(payload)

    write_with(path, write)


FINITE_CHUNK = 1 << 20
"""Elements :func:`all_finite` checks at a time."""


def all_finite(tensor) -> bool:
    """Whether a tensor holds no NaN or infinity, checked :data:`FINITE_CHUNK` elements at a time: a whole
    tensor's check allocates a bool per element (28 MB for a 135M model's embedding), which the allocator
    keeps once a model's worth of weights has passed through it."""
    flat = tensor.detach().reshape(-1)
    return all(bool(flat[start:start + FINITE_CHUNK].isfinite().all())
               for start in range(0, flat.numel(), FINITE_CHUNK))


def save_tensors(path: Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    """Write a name -> tensor dict as a safetensors file, laid out as :class:`TensorFileWriter` lays one
    out (every tensor whose size allows it starts on a :data:`TENSOR_ALIGNMENT`-byte boundary), with the
    file mode of every other file attnspec writes (0644 less the umask)."""
    layout = {name: (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")) for name, tensor in tensors.items()}
    with TensorFileWriter(path, layout, metadata) as writer:
        for name, tensor in tensors.items():
            writer.write(name, tensor.detach().cpu())


SAFETENSORS_NAMES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
                     "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
"""torch's dtype names (``str(dtype)`` without ``torch.``) -> safetensors'."""


TENSOR_ALIGNMENT = 64
"""Bytes to which :class:`TensorFileWriter` aligns the data and every tensor it can: a model loaded from a
build maps its weights straight from the file (:func:`map_safetensors`), so a tensor's address modulo 64
is its offset's. A matrix-vector product over bfloat16 weights streaming from memory ran 1.5-5% slower at
16 or 48 bytes off a 64-byte boundary than on one (this project's 2-core AMD EPYC, 2026-11-28, one thread,
260 MB of 576 x 1536 matrices); ``safetensors`` itself aligns to 8."""


class TensorFileWriter:
    """A safetensors file written tensor by tensor: its header (every name, shape and dtype) first, then each
    tensor's bytes at its offset as it comes, so a converted checkpoint is never held whole. As a context
    manager, leaving closes the file and, unless an exception is leaving with it, checks that every declared
    tensor was written (``close()``). The file loads with ``safetensors`` like any other.

    The layout aligns the data's start (the header is padded with spaces, as the format allows) and every
    tensor to :data:`TENSOR_ALIGNMENT` bytes: tensors whose byte size is a multiple of it come first, in
    name order, then the others (a norm's odd-sized weight), in name order; the format allows no gaps.

    Args:
        path: the file to create (in a scratch directory: nothing else is atomic about it).
        layout: name -> (shape, torch dtype name: "bfloat16", "float32", ...).
        metadata: the header's ``__metadata__`` strings.
    """

    def __init__(self, path: Path, layout: dict[str, tuple[tuple[int, ...], str]],
                 metadata: dict[str, str] | None = None):
        import math

        header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
        self.offsets: dict[str, tuple[int, int, tuple[int, ...], str]] = {}
        sizes = {name: math.prod(shape) * _ELEMENT_SIZES[SAFETENSORS_NAMES[dtype]] for name, (shape, dtype) in
                 layout.items()}
        offset = 0
        for name in sorted(layout, key=lambda name: (sizes[name] % TENSOR_ALIGNMENT != 0, name)):
            (shape, dtype), size = layout[name], sizes[name]
            header[name] = {"dtype": SAFETENSORS_NAMES[dtype], "shape": list(shape), "data_offsets": [offset,
                                                                                                     offset + size]}
            self.offsets[name] = (offset, size, tuple(shape), dtype)
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % TENSOR_ALIGNMENT)  # the data starts aligned
        self.start, self.written = 8 + len(raw), set()
        self.handle = open(path, "wb")
        self.handle.write(len(raw).to_bytes(8, "little") + raw)
        self.handle.truncate(self.start + offset)
        self.path = path

    def write(self, name: str, tensor) -> None:
        """Write ``tensor`` (its declared shape and dtype, on the CPU) as ``name``."""
        offset, size, shape, dtype = self.offsets[name]
        if tuple(tensor.shape) != shape or str(tensor.dtype).removeprefix("torch.") != dtype or name in self.written:
            raise RunError(f"internal: {name} is {tensor.dtype} {tuple(tensor.shape)}, declared {dtype} {shape}")
        import torch

        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        self.handle.seek(self.start + offset)
        self.handle.write(memoryview(data))
        self.written.add(name)

    def __enter__(self) -> "TensorFileWriter":
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.handle.close()
        if kind is None:
            self.close()

    def close(self) -> None:
        """Finish the file (0644 less the umask, as :func:`save_tensors`); every tensor must be written."""
        self.handle.close()
        missing = sorted(set(self.offsets) - self.written)
        if missing:
            raise RunError(f"internal: {self.path} lacks {missing[:3]} ({len(missing)} tensors never written)")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.path, 0o644 & ~umask)


def write_with(path: Path, writer) -> None:
    """Atomically write ``path`` by calling ``writer(temporary_path)`` (also for libraries that write a
    file themselves: matplotlib, safetensors), then renaming; the link rules of :func:`write_atomic`."""
    _check_target(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    if tmp.is_symlink() or tmp.exists():
        _unlink_own(tmp)
    try:
        writer(tmp)
        if tmp.is_symlink() or not tmp.is_file():
            raise RunError(f"{path}: the writer did not produce a regular file")
        os.replace(tmp, path)
    except OSError as error:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise RunError(f"{path}: cannot write ({error.strerror})") from None


def open_append(path: Path) -> IO[str]:
    """Open ``path`` for appending text (created if missing); a link or a non-regular file is refused."""
    return os.fdopen(_open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


def open_append_binary(path: Path) -> IO[bytes]:
    """:func:`open_append` for bytes (a worker's log)."""
    return os.fdopen(_open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def open_lock(path: Path) -> IO[bytes]:
    """Open (creating, never truncating) a lock file for ``fcntl.flock``; a link is refused."""
    return os.fdopen(_open_regular(path, os.O_RDWR | os.O_CREAT), "r+b")


def _open_regular(path: Path, flags: int) -> int:
    _check_target(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise RunError(f"{path}: cannot open ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunError(f"{path}: exists and is not a regular file; move it away")
    return fd


# ----------------------------------------------------------------------------- deletes


def _unlink_own(path: Path) -> None:
    """Remove a stale scratch file of ours (a link is removed as a link: its target is untouched)."""
    try:
        if path.is_dir() and not path.is_symlink():
            raise RunError(f"{path}: a directory stands where attnspec writes a scratch file; move it away")
        path.unlink()
    except OSError as error:
        raise RunError(f"{path}: cannot remove ({error.strerror})") from None


def owns_tree(path: Path, names: set[str] | frozenset[str]) -> bool:
    """Whether ``path`` is a real directory holding only regular files named in ``names``."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        return all(entry.name in names and not entry.is_symlink() and entry.is_file() for entry in path.iterdir())
    except OSError:
        return False


def remove_tree(path: Path, names: set[str] | frozenset[str]) -> None:
    """Remove the directory ``path`` if it holds only regular files named in ``names`` (what the caller
    writes there); refuse, touching nothing, if it is a link or holds anything else."""
    if not owns_tree(path, names):
        raise RunError(f"{path}: holds files attnspec did not write (or is a link); move it away, attnspec "
                       "removes only its own entries")
    try:
        shutil.rmtree(path)
    except OSError as error:
        raise RunError(f"{path}: cannot remove ({error.strerror})") from None


# ----------------------------------------------------------------------------- reads


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES, *, follow_links: bool = False,
              parse_constant: Callable[[str], Any] = _refuse_constant,
              object_hook: Callable[[dict], Any] | None = None) -> Any:
    """The JSON value in ``path``, read as untrusted data: the one bounded JSON reader of attnspec (run
    and runs directories, caches, manifests, transformers checkpoints). A regular file (a link is
    refused unless ``follow_links``: the Hugging Face cache links snapshot files to blobs) of at most
    ``max_bytes``, UTF-8, nested no deeper than Python's recursion allows, NaN and Infinity refused
    unless ``parse_constant`` reads them; ``object_hook`` as ``json.loads``'s.

    Raises:
        RunError: saying what is wrong (missing, a link, not a file, too large, not UTF-8, not JSON,
            a constant, nested too deep); callers translate it into their own error class.
    """
    info = _regular_file_status(path, follow_links)
    if info.st_size > max_bytes:
        raise RunError(f"{path}: larger than {max_bytes:,} bytes")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise RunError(f"{path}: cannot read ({error.strerror})") from None
    return _json_value(raw, path, "", parse_constant, object_hook)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON table from its (key, value) pairs, refusing a key named twice (a ValueError saying which)."""
    table = dict(pairs)
    if len(table) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {shorten(twice)} appears twice in one table")
    return table


def _regular_file_status(path: Path, follow_links: bool) -> os.stat_result:
    """``path``'s status, refusing a missing file, a link (unless ``follow_links``) and anything not a
    regular file, each as a RunError."""
    info = _lstat(path)
    if info is not None and follow_links and stat.S_ISLNK(info.st_mode):
        try:
            info = os.stat(path)
        except OSError as error:
            raise RunError(f"{path}: a link that cannot be followed ({error.strerror})") from None
    if info is None:
        raise RunError(f"{path}: missing")
    if not stat.S_ISREG(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise RunError(f"{path}: {kind}; attnspec reads only regular files here")
    return info


def _json_value(raw: bytes, path: Path, what: str, parse_constant: Callable[[str], Any] = _refuse_constant,
                object_hook: Callable[[dict], Any] | None = None, pairs_unique: bool = False) -> Any:
    """``raw`` (UTF-8 JSON, ``what`` of ``path``) parsed, or a RunError saying why not. ``pairs_unique``:
    a table naming a key twice is refused (JSON parsers disagree on which one wins)."""
    pairs_hook = _unique_pairs if pairs_unique else None
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=parse_constant, object_hook=object_hook,
                          object_pairs_hook=pairs_hook)
    except RecursionError:
        raise RunError(f"{path}: {what}nested too deeply to be a file attnspec reads") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise RunError(f"{path}: {what}not valid JSON ({shorten(str(error), 120)})") from None


MAX_SAFETENSORS_HEADER = 100 << 20
"""The JSON header of a safetensors file (safetensors' own limit)."""
SAFETENSORS_DTYPES = frozenset({"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32",
                                "F64", "F8_E4M3", "F8_E5M2"})


def read_safetensors_header(path: Path, *, follow_links: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """The tensors a safetensors file declares, as name -> (shape, dtype name), read from its header
    alone (nothing is allocated for the data): the 8-byte header length, then the header through
    :func:`read_json`'s rules, every entry checked to lie within the file. ``__metadata__`` is skipped.

    Raises:
        RunError: the file is missing, a link (unless ``follow_links``), or its header is not a valid
            safetensors header for its size.
    """
    _, entries = _safetensors_layout(path, follow_links)
    return {name: (shape, dtype) for name, (shape, dtype, _) in entries.items()}


_ELEMENT_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "F16": 2,
                  "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def map_safetensors(path: Path) -> dict:
    """Every tensor of a safetensors file (links followed) as a view of one private memory map of it:
    nothing is copied or read until used, and a model that takes these tensors holds its weights once
    (the file's pages, shared with the page cache) rather than beside the mapped copy that safetensors'
    own readers leave resident. The map is copy-on-write: writing a tensor (training) copies that page
    and never changes the file. Each entry's byte size must be its shape's.

    Raises:
        RunError: as :func:`read_safetensors_header`, or an entry whose bytes do not hold its shape.
    """
    import math
    import mmap

    import torch

    dtypes = _torch_dtypes()
    start, entries = _safetensors_layout(path, follow_links=True)
    mapped = None
    tensors = {}
    for name, (shape, dtype, (begin, end)) in entries.items():
        count = math.prod(shape)
        _check_entry_size(path, name, shape, dtype, begin, end)
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtypes[dtype])
            continue
        if mapped is None:
            try:
                with open(path, "rb") as handle:
                    mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as error:
                raise RunError(f"{path}: cannot read ({error})") from None
        tensors[name] = torch.frombuffer(mapped, dtype=dtypes[dtype], count=count, offset=start + begin).view(shape)
    return tensors


def safetensors_layout(path: Path) -> tuple[int, dict]:
    """(where the data starts, name -> (shape, dtype name, (begin, end) within the data)) of a safetensors
    file, links followed, checked as :func:`read_safetensors_header` says (for
    :func:`read_safetensors_tensor`, which then reads no header again)."""
    return _safetensors_layout(path, follow_links=True)


def read_safetensors_tensor(path: Path, name: str, layout: tuple[int, dict] | None = None):
    """One tensor of a safetensors file (links followed; ``layout``: its :func:`safetensors_layout`), read
    into memory of its own with plain reads: no memory map stays resident, so converting a checkpoint
    tensor by tensor holds one tensor at a time.

    Raises:
        RunError: as :func:`map_safetensors`, or the file has no tensor ``name``.
    """
    import torch

    start, entries = layout or _safetensors_layout(path, follow_links=True)
    if name not in entries:
        raise RunError(f"{path}: has no tensor {shorten(name)}")
    shape, dtype, (begin, end) = entries[name]
    _check_entry_size(path, name, shape, dtype, begin, end)
    data = bytearray(end - begin)
    try:
        with open(path, "rb") as handle:
            handle.seek(start + begin)
            if handle.readinto(data) != len(data):
                raise RunError(f"{path}: ends inside tensor {shorten(name)}")
    except OSError as error:
        raise RunError(f"{path}: cannot read ({error.strerror})") from None
    if not data:
        return torch.empty(shape, dtype=_torch_dtypes()[dtype])
    return torch.frombuffer(data, dtype=_torch_dtypes()[dtype]).view(shape)


def _torch_dtypes() -> dict:
    import torch

    return {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
            "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64, "F16": torch.float16,
            "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
            "F8_E5M2": torch.float8_e5m2}


def _check_entry_size(path: Path, name: str, shape: tuple, dtype: str, begin: int, end: int) -> None:
    import math

    count = math.prod(shape)
    if end - begin != count * _ELEMENT_SIZES[dtype]:
        raise RunError(f"{path}: its safetensors header entry {shorten(name)} holds {end - begin:,} bytes, "
                       f"not the {count:,} {dtype} values of its shape")


def _safetensors_layout(path: Path, follow_links: bool) -> tuple[int, dict]:
    """(where the data starts, name -> (shape, dtype name, (begin, end) within the data)) of a safetensors
    file, checked as :func:`read_safetensors_header` says."""
    start, tensors, _ = _safetensors_header(path, follow_links)
    return start, tensors


def safetensors_metadata(path: Path) -> dict:
    """The ``__metadata__`` table of a safetensors file's header (links followed; {} without one), the
    header checked as :func:`read_safetensors_header` says."""
    return _safetensors_header(path, follow_links=True)[2]


def _safetensors_header(path: Path, follow_links: bool) -> tuple[int, dict, dict]:
    """:func:`_safetensors_layout`'s two values and the header's ``__metadata__`` (a table, or {}).

    The ``safetensors`` library judges the file (:func:`_judged_by_safetensors`: header length and
    start, unique names, dtype/shape/byte-size agreement, data offsets contiguous from 0 and covering
    the data exactly, ``__metadata__`` strings); attnspec keeps its own limits before it (a regular
    file, a header of at most :data:`MAX_SAFETENSORS_HEADER` bytes inside the file) and reads the header
    once more itself, only for the byte offsets ``safetensors`` does not expose (the copy-on-write
    memory map of :func:`map_safetensors` reads through them), checked to agree with the library's
    view (the same names) and to the same rules again, so a disagreement between the two parsers is
    an error and never a shifted tensor.
    """
    info = _regular_file_status(path, follow_links)
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 2 <= length <= min(MAX_SAFETENSORS_HEADER, info.st_size - 8):
                raise RunError(f"{path}: not a safetensors file (its header length is {length:,} bytes)")
            raw = handle.read(length)
    except OSError as error:
        raise RunError(f"{path}: cannot read ({error.strerror})") from None
    names = _judged_by_safetensors(path)
    header = _json_value(raw, path, "its safetensors header is ", pairs_unique=True)
    if not isinstance(header, dict):
        raise RunError(f"{path}: its safetensors header is not a table of tensors")
    data_bytes = info.st_size - 8 - length
    tensors = {}
    metadata = header.get("__metadata__")
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if isinstance(dtype, str) and dtype not in SAFETENSORS_DTYPES:
            raise RunError(f"{path}: its tensor {shorten(name)} is of dtype {shorten(dtype)}, which attnspec does not "
                           f"read (it reads {', '.join(sorted(SAFETENSORS_DTYPES))})")
        ok = isinstance(entry, dict) and dtype in SAFETENSORS_DTYPES
        shape, offsets = (entry.get("shape"), entry.get("data_offsets")) if ok else (None, None)
        ok = ok and isinstance(shape, list) and len(shape) <= 16 and all(type(n) is int and n >= 0 for n in shape)
        ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets) \
            and 0 <= offsets[0] <= offsets[1] <= data_bytes
        if not ok:
            raise RunError(f"{path}: its safetensors header entry {shorten(name)} is not a tensor within the file")
        tensors[name] = (tuple(shape), entry["dtype"], tuple(offsets))
    end = 0
    for name, (_, _, (begin, finish)) in sorted(tensors.items(), key=lambda item: item[1][2]):
        if begin != end:
            raise RunError(f"{path}: its safetensors header places {shorten(name)} at byte {begin:,} of the data, "
                           f"where byte {end:,} is next (tensors must follow one another without gaps or overlaps)")
        end = finish
    if end != data_bytes or set(tensors) != names:
        raise RunError(f"{path}: its safetensors header does not describe its data exactly ({data_bytes:,} bytes "
                       f"of data, {end:,} described)")
    return 8 + length, tensors, metadata if isinstance(metadata, dict) else {}


def _judged_by_safetensors(path: Path) -> set[str]:
    """The tensor names of ``path`` as the ``safetensors`` library reads them, after it has validated
    the file (:func:`safetensors.safe_open` parses and checks the header, mapping nothing into memory
    that stays); its refusal becomes a RunError quoting it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as opened:
            return set(opened.keys())
    except (SafetensorError, OSError, ValueError) as error:
        said = str(error).replace("Error while deserializing header: ", "")
        raise RunError(f"{path}: not a valid safetensors file (the safetensors library: {said[:160]})") \
            from None


def json_lines(text: str) -> list[dict]:
    """The JSON objects of a ``.jsonl`` text, one per line; a line that is not one (cut short by a
    kill, tampered, nested too deep) is skipped."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


# ----------------------------------------------------------------------------- caches

CACHE_FORMAT = 1
MAX_CACHE_BYTES = 16 << 20


def read_cache_file(path: Path, section: str, limit: int = MAX_CACHE_BYTES) -> dict:
    """The ``section`` table of one of attnspec's JSON cache files (format 1); empty when the file is
    missing, over ``limit`` bytes, damaged or of another format (a cache is rewritten, never trusted)."""
    if not path.exists():
        return {}
    try:
        data = read_json(path, limit)
    except RunError:
        return {}
    table = data.get(section) if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None
    return table if isinstance(table, dict) else {}


def write_cache_file(path: Path, section: str, table: dict) -> None:
    """Replace a JSON cache file atomically (a scratch file beside it, then one rename). A cache that
    cannot be written (a read-only or odd cache directory, a directory or link in the file's place)
    is skipped with a warning: it only saves time, and the work it records was done."""
    import warnings

    try:
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"format": CACHE_FORMAT, section: table}, indent=1))
    except (RunError, OSError) as error:
        reason = str(error) if isinstance(error, RunError) else f"{path.parent}: {error.strerror}"
        warnings.warn(f"attnspec: the cache file {path} was not written ({reason}); set ATTNSPEC_CACHE_DIR to a "
                      "writable directory to keep measurements between runs", RuntimeWarning, stacklevel=2)


# ----------------------------------------------------------------------------- run directories (read side)

RUN_FORMAT = 1
RUN_FILE = "run.json"
CHECKPOINT_POINTER = "checkpoint.json"
CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "state.json")
ADAPTERS_FILE = "adapters.safetensors"
"""A low-rank adapted run's checkpoints also hold its adapted maps' own weights and their adapters (beside the
merged model, which ``model.safetensors`` holds)."""
MAX_SHARDS = 1 << 16
"""Processes whose shards one checkpoint may hold (torch.distributed.checkpoint's files are numbered in 5 digits)."""


def shard_file(rank: int) -> str:
    """The file process ``rank`` (from 0) writes in a sharded checkpoint: torch.distributed.checkpoint's
    ``HuggingFaceStorageWriter`` name for it (weights and AdamW moments, ``model.`` and ``optimizer.``)."""
    return f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"


def shard_count(where: Path, state: object) -> int | None:
    """The processes whose shards the checkpoint folder ``where`` holds (its state.json's ``shards``), or
    None for a whole checkpoint. Raises RunError for a count no run writes."""
    shards = state.get("shards") if isinstance(state, dict) else None
    if shards is not None and not (type(shards) is int and 0 < shards <= MAX_SHARDS):
        raise RunError(f"{where}/state.json: its shard count is not a number of processes (1 to {MAX_SHARDS:,})")
    return shards


class _CheckpointNames:
    """The entries a checkpoint folder may hold: the whole checkpoint's files, state.json, and shard files."""

    def __contains__(self, name: object) -> bool:
        if name in CHECKPOINT_FILES or name == ADAPTERS_FILE:
            return True
        number = name[len("shard-"):len("shard-") + 5] if isinstance(name, str) else ""
        return number.isdigit() and 1 <= int(number) <= MAX_SHARDS and name == shard_file(int(number) - 1)


CHECKPOINT_NAMES = _CheckpointNames()
STATUSES = ("running", "stopped", "done", "diverged", "interrupted")
MAX_STEP = 1 << 40
"""Far above any step count a configuration allows; a larger recorded step is tampering."""


def is_step(value: object) -> bool:
    """Whether ``value`` is a step a run could have reached (an int, not a bool, in [0, MAX_STEP])."""
    return type(value) is int and 0 <= value <= MAX_STEP


def read_run(directory: Path) -> dict:
    """The run.json of an existing run directory (to resume, export or diagnose it), checked as far
    as its shape: format, a spec and a configuration as mappings, a known status, a step in range."""
    if not directory.is_dir():
        raise RunError(f"{directory}: no such run directory")
    run = read_json(directory / RUN_FILE)
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT or not isinstance(run.get("spec"), dict) \
            or not isinstance(run.get("config"), dict):
        raise RunError(f"{directory}/{RUN_FILE}: not a run file of format {RUN_FORMAT} written by attnspec")
    if run.get("status") not in STATUSES or not is_step(run.get("step")):
        raise RunError(f"{directory}/{RUN_FILE}: its status or step is not one attnspec writes (status one of "
                       f"{', '.join(STATUSES)}, step a whole number from 0 to {MAX_STEP:,})")
    return run


def latest_checkpoint(directory: Path, max_step: int = MAX_STEP) -> tuple[int, Path, dict]:
    """The latest checkpoint of a run directory: ``(step, its folder, its state.json)``; the folder is a
    real one holding only the checkpoint's files, and its step agrees with ``checkpoint.json``, the
    folder's name and ``max_step`` (the run's configured steps)."""
    pointer = read_json(directory / CHECKPOINT_POINTER)
    name = pointer.get("directory") if isinstance(pointer, dict) else None
    if not isinstance(name, str) or not name.startswith("checkpoints/step-") or "/" in name[len("checkpoints/"):]:
        raise RunError(f"{directory}/{CHECKPOINT_POINTER}: does not name a checkpoint directory")
    check_directory(directory / "checkpoints")
    where = directory / name
    if not owns_tree(where, CHECKPOINT_NAMES):
        raise RunError(f"{where}: not a checkpoint directory attnspec wrote (a link, or other files in it)")
    state = read_json(where / "state.json") if (where / "state.json").is_file() else None
    shards = shard_count(where, state)
    for file in CHECKPOINT_FILES if shards is None else ["state.json", *map(shard_file, range(shards))]:
        if not (where / file).is_file():
            raise RunError(f"{where}: missing {file}; the checkpoint is incomplete")
    step = state.get("step") if isinstance(state, dict) else None
    if not is_step(step) or step > max_step or step != pointer.get("step") or name != f"checkpoints/step-{step:09d}":
        raise RunError(f"{where}/state.json: its step is not the checkpoint's (a whole number from 0 to the run's "
                       f"{max_step:,} steps, the same in {CHECKPOINT_POINTER} and in the directory name)")
    return step, where, state


MAX_TENSOR_ROWS = 1 << 40
"""Far above any tensor's first dimension; a larger recorded offset is tampering."""


def sharded_layout(where: Path, shards: int) -> dict[str, tuple[tuple[int, ...], str, list[tuple[Path, int, int]]]]:
    """What the sharded checkpoint folder ``where`` (written by ``shards`` processes) holds, read from its
    files' headers alone: full name (``model.{parameter}``, ``optimizer.{parameter}.{moment}``) ->
    (the whole tensor's shape, dtype name, its pieces as (file, first row, rows)).

    Each process's :func:`shard_file` holds the rows of every tensor that process held (FSDP shards the
    first dimension), placed by torch.distributed.checkpoint's ``saved_offsets`` in the file's
    metadata. The pieces of each tensor must tile it: the same trailing shape and dtype, first-dimension
    ranges that meet end to end from 0, at most :data:`MAX_TENSOR_ROWS` rows; a tensor of no dimension
    is one piece.

    Raises:
        RunError: a file is not a valid safetensors file (:func:`read_safetensors_header`), a piece has
            no first-dimension placement, or the pieces do not make whole tensors.
    """
    pieces: dict[str, list] = {}
    for rank in range(shards):
        path = where / shard_file(rank)
        _, entries, metadata = _safetensors_header(path, follow_links=False)
        offsets = _json_value(str(metadata.get("DCP_SHARDING_INFO", "{}")).encode(), path,
                              "its sharding metadata is ")
        for name, (shape, dtype, _) in entries.items():
            entry = offsets.get(name) if isinstance(offsets, dict) else None
            offset = entry.get("saved_offsets") if isinstance(entry, dict) else None
            if not (isinstance(offset, list) and len(offset) == len(shape) and all(type(n) is int for n in offset)
                    and all(n == 0 for n in offset[1:]) and (not offset or 0 <= offset[0] <= MAX_TENSOR_ROWS)):
                raise RunError(f"{path}: tensor {shorten(name)} has no placement a first-dimension shard has")
            pieces.setdefault(name, []).append((offset[0] if offset else 0, shape, dtype, path))
    layout = {}
    for name, parts in pieces.items():
        parts.sort(key=lambda item: item[0])
        _, first_shape, first_dtype, _ = parts[0]
        end = 0
        for row, shape, dtype, path in parts:
            if row != end or shape[1:] != first_shape[1:] or dtype != first_dtype or (not shape and len(parts) > 1):
                raise RunError(f"{path}: the pieces of {shorten(name)} do not tile it (a piece at row {row:,} "
                               f"where row {end:,} was next, or of another shape or dtype); the checkpoint is "
                               "damaged")
            end += shape[0] if shape else 1
        if end > MAX_TENSOR_ROWS:
            raise RunError(f"{parts[-1][3]}: the pieces of {shorten(name)} make {end:,} rows, more than any tensor "
                           "has; the checkpoint is damaged")
        whole = (end, *first_shape[1:]) if first_shape else ()
        layout[name] = (whole, first_dtype, [(path, row, shape[0] if shape else 1)
                                             for row, shape, _, path in parts])
    return layout


def checkpoint_tensors(where: Path, part: str) -> dict:
    """The whole tensors of one part of a checkpoint (``part``: ``"model"``, the weights, or
    ``"optimizer"``, AdamW's state by ``{parameter}.{moment}``), by name: a whole checkpoint's file
    mapped (:func:`map_safetensors`), or a sharded one's pieces (:func:`sharded_layout`) put together.

    Raises:
        RunError: a file is not a valid safetensors file, or the pieces do not make whole tensors.
    """
    import torch

    shards = shard_count(where, read_json(where / "state.json"))
    if shards is None:
        return map_safetensors(where / f"{part}.safetensors")
    layout = {name: entry for name, entry in sharded_layout(where, shards).items() if name.startswith(f"{part}.")}
    mapped = {path: map_safetensors(path) for _, _, parts in layout.values() for path, _, _ in parts}
    whole = {}
    for name, (_, _, parts) in layout.items():
        tensors = [mapped[path][name] for path, _, _ in parts]
        whole[name[len(part) + 1:]] = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
    return whole


__all__ = ["cache_directory", "child_environment", "start_python", "check_directory", "ensure_directory",
           "write_atomic", "write_with", "save_tensors", "open_append", "open_append_binary", "open_lock", "owns_tree",
           "remove_tree", "read_json", "read_safetensors_header", "json_lines", "MAX_JSON_BYTES", "VERSION",
           "RUN_FILE", "CHECKPOINT_POINTER", "CHECKPOINT_FILES", "read_run", "latest_checkpoint", "is_step",
           "shard_file", "shard_count", "sharded_layout", "checkpoint_tensors", "safetensors_metadata",
           "read_cache_file", "write_cache_file"]
