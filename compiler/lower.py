"""Lowering: a resolved spec becomes an ``attnspec.nn`` model with its plan's modes set.

Also the parameter count of a spec, from its model built on the meta device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnspec.errors import BuildError
from attnspec.nn.model import Model, build_model_from_spec
from attnspec.spec.load import load_spec
from attnspec.spec.ir import Spec
from attnspec.compiler.plan import Calibration, Plan, plan_spec


def as_spec(spec_or_path: Any, overrides=()) -> Spec:
    """A resolved Spec from a Spec, a dict or a spec file path (with ``--set``-style overrides)."""
    if isinstance(spec_or_path, Spec):
        if overrides:
            from attnspec.spec import spec_to_data

            return load_spec(spec_to_data(spec_or_path, minimal=False), overrides)
        return spec_or_path
    if isinstance(spec_or_path, (str, Path, dict)):
        return load_spec(spec_or_path, overrides)
    raise TypeError(f"expected a Spec, a dict or a path, got {type(spec_or_path).__name__}")


def lower(spec: Spec, plan: Plan | None = None) -> Model:
    """Build the eager model of ``spec`` and set each mixer's full-sequence mode from ``plan``."""
    plan = plan or plan_spec(spec)
    model = build_model_from_spec(spec)
    model.set_modes(plan.full_modes)
    model.eval()
    return model


def resolve_device(device: Any) -> torch.device:
    """``device`` ("cpu", "cuda", "cuda:1", a torch.device or None for the CPU) checked to exist here.

    Raises:
        BuildError: not a device name, a device type attnspec does not build for, or a CUDA device
            this machine lacks (the message says what to do).
    """
    if device is None:
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise BuildError(f"device {str(device)[:40]!r} is not a device name; use cpu or cuda (cuda:N)") from None
    if resolved.type not in ("cpu", "cuda"):
        raise BuildError(f"attnspec builds for cpu and cuda devices, not {resolved.type!r}")
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BuildError("no CUDA device on this machine (or this PyTorch is a CPU build); use --device cpu, "
                             "or build on a machine with a GPU")
        if resolved.index is not None and resolved.index >= count:
            raise BuildError(f"device {resolved} does not exist: this machine has {count} CUDA device(s)")
    return resolved


def build_model(spec_or_path: Any, *overrides: str, length: int | None = None, device: Any = None) -> Model:
    """Build an eager, planned ``nn.Module`` from a spec (path, dict or :class:`Spec`).

    Args:
        spec_or_path: a ``.yaml``/``.attn`` path, spec data, or a Spec.
        overrides: ``"dotted.path=value"`` strings, as ``--set``.
        length: sequence length the plan optimises for (default: the spec's ``max_len``).
        device: where the model lives ("cpu", "cuda", "cuda:N" or a torch.device; default the CPU).

    Returns:
        The model (in eval mode). Call ``model(tokens)``; ``model.step`` decodes one token when
        ``model.has_step``.
    """
    spec = as_spec(spec_or_path, overrides)
    device = resolve_device(device)
    return lower(spec, plan_spec(spec, length, calibration=device_calibration(device))).to(device)


def device_calibration(device: torch.device) -> Calibration | None:
    """The calibration to plan with on ``device``: this machine's (None: the cached one) on the CPU; the
    cost model alone on a GPU, which the calibration, measured on and keyed by the CPU, does not describe."""
    return None if device.type == "cpu" else Calibration.empty()


def count_parameters(spec: Spec) -> int:
    """The number of trainable parameters of the model of ``spec``, from the lowered model built on
    the meta device: no memory is allocated, so the count is safe before the limit check
    (an 89-billion-parameter spec is counted in under a second), and no formula can drift from
    what the modules really hold (tests keep a hand-written formula as an oracle)."""
    with torch.device("meta"):
        model = Model(spec)
    return sum(parameter.numel() for parameter in model.parameters())
