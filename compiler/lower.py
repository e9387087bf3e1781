"""Lowering: a resolved spec becomes an ``attnspec.nn`` model with its plan's modes set.

Also the analytical parameter count of a spec, computed from the IR alone (a test checks it
against the built model, which catches lowering that silently adds or drops weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnspec.nn.model import Model, build_model_from_spec
from attnspec.spec.load import load_spec
from attnspec.spec.ir import TRAINABLE_FEATURES, LinearMixer, ScatterbrainMixer, Spec, iter_blocks
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


def lower(spec: Spec, plan: Plan | None = None) -> Model:
    """Build the eager model of ``spec`` and set each mixer's full-sequence mode from ``plan``."""
    plan = plan or plan_spec(spec)
    model = build_model_from_spec(spec)
    model.set_modes(plan.full_modes)
    model.eval()
    return model


def build_model(spec_or_path: Any, *overrides: str, length: int | None = None) -> Model:
    """Build an eager, planned ``nn.Module`` from a spec (path, dict or :class:`Spec`).

    Args:
        spec_or_path: a ``.yaml``/``.attn`` path, spec data, or a Spec.
        overrides: ``"dotted.path=value"`` strings, as ``--set``.
        length: sequence length the plan optimises for (default: the spec's ``max_len``).

    Returns:
        The model (in eval mode). Call ``model(tokens)``; ``model.step`` decodes one token when
        ``model.has_step``.
    """
    spec = as_spec(spec_or_path, overrides)
    return lower(spec, plan_spec(spec, length))


def count_parameters(spec: Spec) -> int:
    """The number of trainable parameters the model of ``spec`` has, computed from the IR alone."""
    d = spec.d_model
    total = spec.input.vocab_size * d if spec.input.kind == "tokens" else spec.input.dim * d + d
    norm = {"layernorm": 2 * d, "rmsnorm": d, "none": 0}
    for _, block in iter_blocks(spec, expand=True):
        total += _mixer_parameters(block.mixer, d)
        total += norm[block.norm]
        if block.mlp.kind != "none":
            hidden = block.mlp.expansion * d
            total += (d * hidden + hidden) * (2 if block.mlp.kind == "glu" else 1) + hidden * d + d
            total += norm[block.norm]
    total += norm[spec.final_norm]
    if spec.head.kind == "lm" and not spec.head.tied:
        total += spec.input.vocab_size * d
    elif spec.head.kind == "classifier":
        total += d * spec.head.classes + spec.head.classes
    return total


def _mixer_parameters(mixer, d: int) -> int:
    H, dk, dv = mixer.heads, mixer.d_qk, mixer.d_v
    total = 2 * d * H * dk + 2 * H * dv * d  # q, k, v and output projections
    total += d * H * dv if mixer.output_gate != "none" else 0
    total += H * dv if mixer.group_norm else 0
    transition = getattr(mixer, "transition", None)
    if transition is not None and transition.kind != "none":
        width = H * (dk if transition.per == "channel" else 1)
        if transition.kind == "fixed":
            total += width * (2 if transition.complex else 1)
        else:
            total += (d * width + width) * (2 if transition.phase != "none" else 1)
    fmap = mixer.feature_map if isinstance(mixer, LinearMixer) else (
        mixer.lowrank.feature_map if isinstance(mixer, ScatterbrainMixer) and mixer.lowrank.kind == "linear" else None)
    if fmap is not None and fmap.kind in TRAINABLE_FEATURES:
        groups = 1 if fmap.share_across_heads else H
        if fmap.kind == "aoglu":  # W_f plus the low-rank gate U V
            per_unit = dk * dk + 2 * dk * (fmap.rank or max(1, dk // 4))
        else:  # W (softplus_linear) or W_f and W_g (glu, oglu)
            per_unit = dk * dk * (1 if fmap.kind == "softplus_linear" else 2)
        total += groups * fmap.stack * per_unit
    return total
