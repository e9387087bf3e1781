"""Lowering: a resolved spec becomes an ``attnspec.nn`` model with its plan's modes set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnspec.nn.model import Model, build_model_from_spec
from attnspec.spec.load import load_spec
from attnspec.spec.ir import Spec
from attnspec.compiler.device import device_calibration, resolve_device
from attnspec.compiler.plan import Plan, plan_spec


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


def lower(spec: Spec, plan: Plan | None = None, *, empty: bool = False) -> Model:
    """Build the eager model of ``spec`` and set each mixer's full-sequence mode from ``plan``; ``empty``:
    its parameters on the meta device, for weights to be assigned (``build_model_from_spec``)."""
    plan = plan or plan_spec(spec)
    model = build_model_from_spec(spec, empty=empty)
    model.set_modes(plan.full_modes)
    model.eval()
    return model


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
    plan = plan_spec(spec, length, calibration=device_calibration(device), device=device.type)
    return lower(spec, plan).to(device)
