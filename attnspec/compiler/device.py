"""The device a model is built, loaded or trained on: checked to exist here, and the calibration that
describes it. Kept apart from lowering, so that loading a build directory imports no spec front-end."""

from __future__ import annotations

from typing import Any

import torch

from attnspec.compiler.calibration import Calibration
from attnspec.errors import BuildError


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


def device_calibration(device: torch.device) -> Calibration | None:
    """The calibration to plan with on ``device``: this machine's (None: the cached one) on the CPU; the
    cost model alone on a GPU, which the calibration, measured on and keyed by the CPU, does not describe."""
    return None if device.type == "cpu" else Calibration.empty()
