"""Mode verification: the built model in every valid mode, in float64, against its reference mode.

For each block whose mixer has several modes, the block is switched to each mode in turn (the
others stay on their reference mode) and the model output is compared with the all-reference
output. The reference is the family's ``reference_mode``: the recurrent mode where it exists
(the defining recurrence), otherwise the only mode. Tolerance: 1e-9 relative to the output's
largest magnitude, in float64 (the modes differ only in summation order: ~1e-15 is typical).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnspec.compiler.tracing import example_input
from attnspec.nn.model import Model

TOLERANCE = 1e-9


@dataclass
class VerifyRow:
    layer: str
    mode: str
    abs_diff: float
    rel_diff: float
    tolerance: float
    ok: bool


@dataclass
class VerifyReport:
    rows: list[VerifyRow]

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    def to_json(self) -> dict:
        return {"ok": self.ok, "tolerance": TOLERANCE,
                "worst_rel_diff": max((row.rel_diff for row in self.rows), default=0.0),
                "rows": [asdict(row) for row in self.rows]}


def verify_model(model: Model, length: int | None = None, batch: int = 2, seed: int = 0) -> VerifyReport:
    """Compare every valid mode of every block with the reference, in float64, at a short odd length."""
    length = length or max(2, min(model.spec.max_len, 37))
    model64 = copy.deepcopy(model).double().eval()
    inputs = example_input(model64, batch, length, torch.Generator().manual_seed(seed))
    references = [block.mixer.reference_mode for block in model64.blocks]
    model64.set_modes(references)
    rows = []
    with torch.no_grad():
        expected = model64(inputs)
        scale = expected.abs().max().clamp_min(1e-300)
        for index, block in enumerate(model64.blocks):
            for mode in block.mixer.modes:
                if mode == references[index]:
                    continue
                block.mixer.mode = mode
                got = model64(inputs)
                block.mixer.mode = references[index]
                abs_diff = (got - expected).abs().max().item()
                rel_diff = abs_diff / scale.item()
                rows.append(VerifyRow(f"blocks[{index}]", mode, abs_diff, rel_diff, TOLERANCE,
                                      bool(rel_diff <= TOLERANCE and torch.isfinite(got).all())))
    return VerifyReport(rows)


def non_finite_problem(model: Model, length: int | None = None, seed: int = 0) -> str | None:
    """Why ``model`` (at its own dtype) is not usable, or None: a parameter or buffer holding NaN or
    infinite values (``a_init: [1e-308]`` is 0 in float32, whose log is -inf), or the first block whose
    output on an example input is not finite (``scale: 1e308`` overflows float32, though the float64
    verification passes: NaN compared with NaN proves nothing)."""
    from attnspec.spec.walk import block_labels

    labels = block_labels(model.spec)

    def where(index: int) -> str:  # the block as explain labels it, and where the spec writes it
        return labels[index]

    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            parts = name.split(".")
            owner = f" of {where(int(parts[1]))}" if parts[0] == "blocks" else ""
            return (f"the model's tensor {name}{owner} holds NaN or infinite values at {model.spec.dtype}; check "
                    "the initialisation fields of that part of the spec")
    length = length or max(2, min(model.spec.max_len, 37))
    inputs = example_input(model, 2, length, torch.Generator().manual_seed(seed))
    first: list[int] = []
    hooks = [block.register_forward_hook(
        lambda module, args, output, index=index: first.append(index)
        if not first and not bool(torch.isfinite(output).all()) else None)
        for index, block in enumerate(model.blocks)]
    try:
        with torch.no_grad():
            output = model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    if first:
        return (f"{where(first[0])} computes NaN or infinite values at {model.spec.dtype} on an example input; "
                "check its mixer's scale, gate and initialisation fields")
    if not bool(torch.isfinite(output).all()):
        return f"the model's output is NaN or infinite at {model.spec.dtype}; check the head's scale"
    return None


def verify_target(target: Path | str, overrides=()) -> VerifyReport:
    """``attnspec verify SPEC|DIR``: build (or load) the model and verify its modes."""
    target = Path(target)
    if target.is_dir():
        from attnspec.compiler.load import load_model

        model = load_model(target)
    else:
        from attnspec.compiler.lower import build_model

        model = build_model(target, *overrides)
    return verify_model(model)
