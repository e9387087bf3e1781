"""Which kernel runs a mode: one applicability predicate per kernel, asked by the plan and by the op.

A family names the kernels that may run each of its modes (:meth:`MixerComponent.backends`, in
order of preference, the graph path last) and what a mode hands them
(:meth:`MixerComponent.kernel_inputs`). Whether a kernel applies to a call is decided here, once: the
plan asks with the spec's facts and the regime it plans for, and the op asks with the facts of its
tensors. So the kernel ``explain`` and the manifest name is the kernel that runs; when the one an op
is told to run does not take its call, the op raises (:class:`KernelError`) instead of running
something else.

* ``graph``: plain torch ops (what ``torch.compile`` and ``torch.export`` trace): every call.
* ``native``: the C++ CPU chunk kernel (:func:`attnspec.ops.linear.backends.native.problem`).
* ``triton``: the Triton chunk kernels (:func:`attnspec.ops.linear.backends.triton.problem`).

A plugin family with a kernel of its own registers its predicate with :func:`register_kernel`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.ops.linear.backends import native
from attnspec.spec.family import KernelInputs, Regime

Predicate = Callable[[KernelInputs, Regime], "str | None"]


class KernelError(ShapeError):
    """The kernel a call was told to run does not take it (the message says why and what to do)."""


def _graph_problem(inputs: KernelInputs, regime: Regime) -> str | None:
    return None  # plain torch runs every call


def _triton_problem(inputs: KernelInputs, regime: Regime) -> str | None:
    if regime.device != "cuda":  # decided before importing Triton, which only a CUDA machine needs
        return f"it runs on CUDA, not on {regime.device}"
    from attnspec.ops.linear.backends import triton

    return triton.problem(inputs, regime)


_PREDICATES: dict[str, Predicate] = {"graph": _graph_problem, "native": native.problem, "triton": _triton_problem}
BUILT_IN = tuple(_PREDICATES)


def register_kernel(name: str, predicate: Predicate) -> None:
    """Make kernel ``name`` known, with ``predicate(inputs, regime)`` returning why it does not run a
    call or None (a plugin family's own kernel; the built-in names cannot be replaced)."""
    if name in BUILT_IN:
        raise ShapeError(f"kernel {name!r} is built in; register yours under another name")
    _PREDICATES[name] = predicate


def kernel_problem(name: str, inputs: KernelInputs, regime: Regime) -> str | None:
    """Why kernel ``name`` does not run a call of ``inputs`` in ``regime``; None when it does."""
    if name not in _PREDICATES:
        raise ShapeError(f"unknown kernel {str(name)[:40]!r}: known are {', '.join(_PREDICATES)}")
    return _PREDICATES[name](inputs, regime)


def first_that_runs(names: Sequence[str], inputs: KernelInputs, regime: Regime) -> str:
    """The first of ``names`` (in order of preference) that runs the call; the graph path otherwise."""
    return next((name for name in names if kernel_problem(name, inputs, regime) is None), "graph")


def call_regime(*tensors: Tensor | None) -> Regime:
    """The regime of a call on ``tensors`` (the first one's device and dtype): a gradient is needed when
    grad mode is on and any of them requires one; ``export`` while ``torch.export`` traces."""
    first = next(t for t in tensors if t is not None)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return Regime(first.device.type, str(first.dtype).removeprefix("torch."), grad, torch.compiler.is_exporting())


def chosen_kernel(requested: str, names: Sequence[str], inputs: KernelInputs, regime: Regime) -> str:
    """The kernel an op runs: ``requested`` (a plan's choice) when it takes the call, else a
    :class:`KernelError`; ``"auto"``: the first of ``names`` that runs it."""
    if requested == "auto":
        return first_that_runs(names, inputs, regime)
    if requested not in names:
        raise ShapeError(f"backend must be auto or one of {', '.join(names)}, got {str(requested)[:40]!r}")
    why = kernel_problem(requested, inputs, regime)
    if why is not None:
        raise KernelError(
            f"the {requested} kernel was chosen for this mixer but cannot run a {regime.dtype} call on "
            f"{regime.device}{' with a gradient' if regime.grad else ''}{' under export' if regime.export else ''}: "
            f"{why}; pass backend='auto' (the first kernel that takes the call), or the kernel a plan for "
            "this device, dtype and regime names")
    return requested


__all__ = ["BUILT_IN", "KernelError", "Predicate", "call_regime", "chosen_kernel", "first_that_runs",
           "kernel_problem", "register_kernel"]
