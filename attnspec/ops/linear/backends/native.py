"""The compiled CPU kernel of the chunk mode's forward pass, and the torch op that calls it.

``csrc/chunked_linear_attention.cpp`` computes causal gated linear attention in chunks for
float32 inputs with no decay or one real or complex decay per head: one thread per (batch, head)
walks its chunks in order with the chunk and the state in cache (see the source for why that
beats the graph path's batched matrix products). :func:`attnspec.ops.linear_attention` uses it through
:func:`chunked_linear_attention` when the chunk mode is asked for, the case is covered, no
gradient is needed (the kernel has no backward) and the program is not being exported (exported
programs stay plain ATen, loadable without attnspec); otherwise the graph path runs. Both
compute the same function and are tested against the same float64 reference.

The source is compiled on first use with the system C++ compiler (``$CXX``, else ``c++``, ``g++``
or ``clang++``) for this machine (``-march=native``, or the compiler's default target if that
flag is refused), in about a second, and cached under ``$ATTNSPEC_CACHE_DIR`` (default
``~/.cache/attnspec``), keyed by the source, compiler, flags and this CPU's instruction sets (a
cache shared between machines never hands one a library built for another).
Nothing is downloaded. If no compiler works, a warning says why once and the graph path is used.
``ATTNSPEC_NATIVE=0`` switches the kernel off for a process; :func:`disabled` does so for a block.
"""

from __future__ import annotations

import contextlib
import math
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import Tensor

from attnspec.errors import AttnSpecError, ShapeError
from attnspec.io import cache_directory
from attnspec.spec.family import KernelInputs, Regime

SOURCE = Path(__file__).with_name("csrc") / "chunked_linear_attention.cpp"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread")
# Tried when FLAGS fail (some compilers reject -march=native): the compiler's default target.
PORTABLE_FLAGS = tuple(flag for flag in FLAGS if flag != "-march=native")
COMPILERS = ("c++", "g++", "clang++")
BUILD_TIMEOUT_S = 300


class NativeBuildError(AttnSpecError):
    """The CPU kernel could not be compiled or loaded here (the graph path still works)."""


def cache_dir() -> Path:
    """Where compiled kernels are kept: attnspec's cache directory (:func:`attnspec.io.cache_directory`)."""
    return cache_directory()


def find_compiler() -> str:
    """``$CXX`` if set, else the first of ``c++``, ``g++``, ``clang++`` on PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    for name in COMPILERS:
        if shutil.which(name):
            return name
    raise NativeBuildError("no C++ compiler found (set CXX, or install g++ or clang++)")


def build(compiler: str | None = None, flags: tuple[str, ...] = FLAGS, directory: Path | None = None) -> Path:
    """Compile the kernel into a shared library, unless an identical build is cached; return its path.

    The library appears atomically (written to a temporary name, then renamed), so concurrent
    processes never load a half-written file. Raises :class:`NativeBuildError` with the
    compiler's message if compiling fails.
    """
    compiler = compiler or find_compiler()
    directory = directory or cache_dir()
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), compiler.encode(), " ".join(flags).encode(),
                                     _cpu_identity().encode()])).hexdigest()[:16]
    target = directory / f"chunked_linear_attention-{key}.so"
    if target.exists():
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise NativeBuildError(f"cannot create the kernel cache {directory} ({error}); set ATTNSPEC_CACHE_DIR to a "
                               "writable directory") from None
    partial = target.with_name(f"{target.stem}.{os.getpid()}.partial.so")
    try:
        result = subprocess.run([compiler, *flags, "-o", str(partial), str(SOURCE)], capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        partial.unlink(missing_ok=True)
        raise NativeBuildError(f"could not run the C++ compiler {compiler!r}: {error}") from None
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        message = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise NativeBuildError(f"{compiler} failed to compile {SOURCE.name}:\n" + "\n".join(message))
    os.replace(partial, target)
    return target


def _cpu_identity() -> str:
    """The architecture and, on Linux, the CPU's feature flags: what ``-march=native`` compiles for."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags.strip()}"


def load(path: Path) -> ctypes.CDLL:
    """Open a built library and declare the kernel's C signature."""
    try:
        library = ctypes.CDLL(str(path))
    except OSError as error:
        raise NativeBuildError(f"could not load {path}: {error}") from None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.chunked_linear_attention_forward.restype = ctypes.c_int
    library.chunked_linear_attention_forward.argtypes = [
        pointer, pointer, pointer,  # q, k, v
        pointer, pointer,  # log|a| and phase (or null)
        pointer, pointer,  # initial state, real and imaginary part (or null)
        ctypes.POINTER(ctypes.c_int64),  # 26 element strides
        size, size, size, size, size, size,  # B, H, L, Dk, Dv, chunk size
        ctypes.c_float,  # scale
        ctypes.c_double,  # log_zero
        pointer, pointer, pointer,  # out (B, H, L, Dv), final state real and imaginary part (B, H, Dk, Dv)
        ctypes.c_int,  # threads
    ]
    return library


_library: ctypes.CDLL | None = None
_failure: str | None = None  # why the kernel is unavailable in this process, once known
_disabled = 0


def _build_and_load() -> ctypes.CDLL:
    """Build for this machine; if the compiler refuses that, for its default target (the first error is raised)."""
    try:
        return load(build())
    except NativeBuildError as error:
        try:
            return load(build(flags=PORTABLE_FLAGS))
        except NativeBuildError:
            raise error from None


def _library_or_none() -> ctypes.CDLL | None:
    """The loaded kernel, built on the first call; None (after one warning) if it cannot be built."""
    global _library, _failure
    if _library is None and _failure is None:
        try:
            _library = _build_and_load()
        except NativeBuildError as error:
            _failure = str(error)
            warnings.warn(f"attnspec: the chunk mode's CPU kernel is unavailable, the graph path is used "
                          f"instead (slower in inference): {error}", RuntimeWarning, stacklevel=3)
    return _library


def enabled() -> bool:
    """Not switched off: ``ATTNSPEC_NATIVE`` is not ``0`` and no :func:`disabled` block is active.

    Compiled code is guarded on :func:`disabled` (entering one retraces); the environment
    variable is read when code is traced, so set it before the process starts.
    """
    return _disabled == 0 and os.environ.get("ATTNSPEC_NATIVE", "1") != "0"


def built() -> bool:
    """Whether the kernel builds and loads on this machine; builds it on the first call.

    Fixed for the life of the process, so compiled code evaluates it once, when traced, without a
    guard (and without tracing the build).
    """
    return _library_or_none() is not None


# What ``torch.compiler.assume_constant_result`` does, without its import of torch._dynamo (about
# 1.2 s, most of `attnspec.load`'s start-up); a test checks the marker against torch's decorator.
built._dynamo_marked_constant = True


def available() -> bool:
    """Whether the kernel may be used here and now: :func:`enabled` and :func:`built`."""
    return enabled() and built()


def problem(inputs: KernelInputs, regime: Regime) -> str | None:
    """Why the kernel does not run a call (None: it does): the one predicate the plan and the op ask.

    It computes the causal chunk mode with no decay or one real or complex decay per head, in float32
    on the CPU; it has no backward (training takes the graph path) and is never traced into an
    exported program (so that programs load without attnspec).
    """
    shape = chunk_shape_problem(inputs)
    if shape is not None:
        return shape
    if regime.device != "cpu" or regime.dtype != "float32":
        return f"it runs float32 on the CPU, not {regime.dtype} on {regime.device}"
    if regime.grad:
        return "it has no backward (a gradient is needed)"
    if regime.export:
        return "exported programs take the graph path, so that they load without attnspec"
    if not enabled():
        return "it is switched off (ATTNSPEC_NATIVE=0 or native.disabled())"
    if not built():
        return f"it did not build on this machine: {_failure}"
    return None


def chunk_shape_problem(inputs: KernelInputs) -> str | None:
    """What the chunk kernels (this one and Triton's) take: the causal chunk mode with no decay or one
    per head (a per-channel decay makes the intra-chunk decays a tensor per key channel)."""
    if inputs.mode != "chunk" or not inputs.causal:
        kind = "causal" if inputs.causal else "non-causal"
        return f"it computes the causal chunk mode only, not {kind} {inputs.mode}"
    if inputs.decay not in ("none", "head"):
        return f"it takes no decay or one per head, not one per {inputs.decay}"
    return None


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the block on the graph path only (for comparisons and benchmarks)."""
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


def forward_into(q: Tensor, k: Tensor, v: Tensor, log_mag: Tensor | None, phase: Tensor | None,
                 initial_state: Tensor | None, initial_state_im: Tensor | None, scale: float, chunk_size: int,
                 log_zero: float, out: Tensor, final_state: Tensor, final_state_im: Tensor) -> None:
    """Run the kernel, writing every element of ``out``, ``final_state`` and ``final_state_im``.

    Args:
        q, k: ``(B, H, L, Dk)`` float32 CPU tensors, any strides. v: ``(B, H, L, Dv)``, likewise.
        log_mag: ``(B, H, L)`` float32 log-magnitudes of the decay (``-inf`` resets), or None (no decay).
        phase: ``(B, H, L)`` float32 phases of a complex decay, or None (real decay); needs ``log_mag``.
        initial_state, initial_state_im: ``(B, H, Dk, Dv)`` float32 real and imaginary part of the
            state before position 0, or None (zeros).
        scale: multiplier on q. chunk_size: positions per chunk (any positive integer).
        log_zero: log-magnitudes at or below this are a = 0 (``attnspec.ops.linear.LOG_ZERO``); they
            are clamped to it, so a reset never makes ``inf - inf``.
        out: contiguous ``(B, H, L, Dv)`` float32. final_state, final_state_im: contiguous
            ``(B, H, Dk, Dv)`` float32 (the imaginary part is 0 for real decays).
    """
    _check_arguments(q, k, v, log_mag, phase, initial_state, initial_state_im, out, final_state, final_state_im)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ShapeError(f"chunk_size must be a positive integer, got {chunk_size!r}")  # 0 would never advance
    if not (math.isfinite(scale) and math.isfinite(log_zero)):
        raise ShapeError(f"scale and log_zero must be finite, got {scale!r} and {log_zero!r}")
    library = _library_or_none()
    if library is None:
        raise NativeBuildError(_failure or "the kernel is unavailable")
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    strides = [*q.stride(), *k.stride(), *v.stride()]
    for t, rank in ((log_mag, 3), (phase, 3), (initial_state, 4), (initial_state_im, 4)):
        strides += t.stride() if t is not None else (0,) * rank
    address = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    status = library.chunked_linear_attention_forward(
        address(q), address(k), address(v), address(log_mag), address(phase), address(initial_state),
        address(initial_state_im), (ctypes.c_int64 * len(strides))(*strides), B, H, L, Dk, Dv, chunk_size, scale,
        log_zero, out.data_ptr(), final_state.data_ptr(), final_state_im.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise MemoryError("the chunk kernel could not allocate its per-thread workspace")


def _check_arguments(q, k, v, log_mag, phase, initial_state, initial_state_im, out, final_state, final_state_im):
    """The kernel reads and writes raw memory: refuse anything but the shapes and dtypes it assumes."""
    if q.dim() != 4 or v.dim() != 4:
        raise ShapeError(f"q and v must have shape (B, H, L, D), got {tuple(q.shape)} and {tuple(v.shape)}")
    if phase is not None and log_mag is None:
        raise ShapeError("phase needs log_mag (a complex decay has both)")
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    sequence, state = (B, H, L), (B, H, Dk, Dv)
    expected = {"q": (q, (B, H, L, Dk)), "k": (k, (B, H, L, Dk)), "v": (v, (B, H, L, Dv)),
                "log_mag": (log_mag, sequence), "phase": (phase, sequence), "initial_state": (initial_state, state),
                "initial_state_im": (initial_state_im, state), "out": (out, (B, H, L, Dv)),
                "final_state": (final_state, state), "final_state_im": (final_state_im, state)}
    for name, (t, shape) in expected.items():
        if t is None:
            continue
        if tuple(t.shape) != shape or t.dtype != torch.float32 or t.device.type != "cpu":
            raise ShapeError(f"{name} must be a float32 CPU tensor of shape {shape}, got {t.dtype} {t.device.type} "
                             f"{tuple(t.shape)}")
    outputs = (out, final_state, final_state_im)
    if any(t is None or not t.is_contiguous() for t in outputs):
        raise ShapeError("out, final_state and final_state_im must be contiguous tensors")


def _chunked(q: Tensor, k: Tensor, v: Tensor, log_mag: Optional[Tensor], phase: Optional[Tensor],
             initial_state: Optional[Tensor], initial_state_im: Optional[Tensor], scale: float,
             chunk_size: int, log_zero: float) -> tuple[Tensor, Tensor, Tensor]:
    B, H, L, Dk = q.shape
    out = q.new_empty(B, H, L, v.shape[-1])
    final_state, final_state_im = q.new_empty(B, H, Dk, v.shape[-1]), q.new_empty(B, H, Dk, v.shape[-1])
    forward_into(q, k, v, log_mag, phase, initial_state, initial_state_im, scale, chunk_size, log_zero, out,
                 final_state, final_state_im)
    return out, final_state, final_state_im


chunked_linear_attention = torch.library.custom_op("attnspec::chunked_linear_attention", mutates_args=(),
                                                   device_types="cpu")(_chunked)
chunked_linear_attention.__doc__ = """Causal gated linear attention by the CPU kernel: ``o (B, H, L, Dv)`` and the
final state's real and imaginary parts ``(B, H, Dk, Dv)``.

Arguments as in :func:`forward_into`. A torch op, so ``torch.compile`` keeps it in the graph
(``fullgraph=True`` holds) with any sequence length. Forward only: it has no autograd formula.
"""


def run_chunked(*args) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`chunked_linear_attention` (same arguments): through the op where code is being traced, as a
    plain call otherwise. The op's eager dispatch imports torch._dynamo on its first call (about a
    second of `attnspec run`'s start-up) and adds nothing outside a graph."""
    if torch.compiler.is_compiling():
        return chunked_linear_attention(*args)
    return _chunked(*args)


@chunked_linear_attention.register_fake
def _(q, k, v, log_mag, phase, initial_state, initial_state_im, scale, chunk_size, log_zero):
    B, H, L, Dk = q.shape
    return q.new_empty(B, H, L, v.shape[-1]), q.new_empty(B, H, Dk, v.shape[-1]), q.new_empty(B, H, Dk, v.shape[-1])
