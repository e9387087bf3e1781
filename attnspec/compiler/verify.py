"""Mode verification: every valid mode of every *distinct* block, in float64, against its reference mode.

Blocks of one structure (the same resolved spec node and planned mode: a 30-block Llama has one) compute
the same function of their weights, so each structure is verified once, on its first block: the block
alone is copied to float64 (never the whole model) and run on a random hidden state in each mode in turn,
against its family's ``reference_mode`` (the recurrent mode where it exists, the defining recurrence;
otherwise the only mode). Tolerance: 1e-9 relative to the output's largest magnitude, in float64 (the
modes differ only in summation order: ~1e-15 is typical). The report's rows name how many blocks each
stands for.

A bfloat16 or float16 model is also checked against the exact function at its own dtype: each distinct
block in its planned mode against the same block in float64, within :data:`HALF_TOLERANCE` of the
output's largest magnitude (a part rounded that must not be, or a cast dropped, differs by the output's
whole size).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnspec.compiler.tracing import example_input
from attnspec.io import all_finite
from attnspec.nn.model import HALF, Model
from attnspec.spec.walk import iter_blocks

TOLERANCE = 1e-9
HALF_TOLERANCE = {torch.bfloat16: 2.0 ** -2, torch.float16: 2.0 ** -5}
"""A half-precision block against float64, relative to its output's largest magnitude: 64 units in the last
place (eps 2^-8, 2^-11). Measured on the shipped specs' whole models in bfloat16 (logits after every
block, a bound for one block): 1 to 10 units, the LRU 40."""


@dataclass
class VerifyRow:
    layer: str
    mode: str
    abs_diff: float
    rel_diff: float
    tolerance: float
    ok: bool
    blocks: int = 1
    """How many blocks of the model this row stands for (those of the same structure)."""


@dataclass
class VerifyReport:
    rows: list[VerifyRow]

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    def to_json(self) -> dict:
        return {"ok": self.ok, "tolerance": TOLERANCE,
                "worst_rel_diff": max((row.rel_diff for row in self.rows if row.tolerance == TOLERANCE), default=0.0),
                "rows": [asdict(row) for row in self.rows]}


def distinct_blocks(model: Model) -> dict[int, list[int]]:
    """The model's blocks grouped by structure: the first block's index -> every index of its kind (the same
    resolved spec node and planned mode)."""
    groups: dict[str, list[int]] = {}
    for index, ((_, node), block) in enumerate(zip(iter_blocks(model.spec, expand=True), model.blocks)):
        key = json.dumps([node.model_dump(mode="json"), block.mixer.mode], sort_keys=True)
        groups.setdefault(key, []).append(index)
    return {indices[0]: indices for indices in groups.values()}


def verify_model(model: Model, length: int | None = None, batch: int = 2, seed: int = 0) -> VerifyReport:
    """Compare every valid mode of every distinct block with its reference mode, in float64, at a short odd
    length (and a half-precision model's blocks with float64: module docstring)."""
    length = length or max(2, min(model.spec.max_len, 37))
    generator = torch.Generator().manual_seed(seed)
    device = model.embed.weight.device
    rows = []
    for index, indices in distinct_blocks(model).items():
        block = model.blocks[index]
        block64 = copy.deepcopy(block).double().eval()
        x, embeddings = (torch.randn(batch, length, model.spec.d_model, generator=generator, dtype=torch.float64)
                         .to(device) for _ in range(2))
        sharing = _lent_example(block.mixer, batch, length, generator, device)
        planned, reference = block.mixer.mode, block.mixer.reference_mode
        with torch.no_grad():
            block64.mixer.mode = reference
            expected = block64(x, None, embeddings, **sharing)
            scale = expected.abs().max().clamp_min(1e-300).item()
            for mode in block64.mixer.modes:
                if mode == reference:
                    continue
                block64.mixer.mode = mode
                got = block64(x, None, embeddings, **sharing)
                abs_diff = (got - expected).abs().max().item()
                rows.append(VerifyRow(f"blocks[{index}]", mode, abs_diff, abs_diff / scale, TOLERANCE,
                                      bool(abs_diff / scale <= TOLERANCE and torch.isfinite(got).all()), len(indices)))
            dtype = model.embed.weight.dtype
            if dtype in HALF:
                # lent keys and values come in float32 (the attention's own are widened so)
                got = block(x.to(dtype), None, embeddings.to(dtype),
                            **{name: tuple(t.float() for t in kv) for name, kv in sharing.items()}).double()
                abs_diff = (got - expected).abs().max().item()
                rows.append(VerifyRow(f"blocks[{index}]", f"{planned} in {str(dtype).removeprefix('torch.')}",
                                      abs_diff, abs_diff / scale, HALF_TOLERANCE[dtype],
                                      bool(abs_diff / scale <= HALF_TOLERANCE[dtype] and torch.isfinite(got).all()),
                                      len(indices)))
        del block64
    return VerifyReport(rows)


def _lent_example(mixer, batch: int, length: int, generator: torch.Generator, device) -> dict:
    """For an attention reading another block's keys and values (``kv_from``), random ones to read in float64
    (``{"kv": (keys (B, H_k, L, Dk), values (B, H_v, L, Dv))}``: the block is verified alone); else nothing."""
    if not getattr(mixer, "borrows_kv", False):
        return {}
    return {"kv": tuple(torch.randn(batch, heads, length, width, generator=generator, dtype=torch.float64).to(device)
                        for heads, width in ((mixer.k_heads, mixer.d_qk), (mixer.v_heads, mixer.d_v)))}


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
        if tensor.is_floating_point() and not all_finite(tensor):
            parts = name.split(".")
            owner = f" of {where(int(parts[1]))}" if parts[0] == "blocks" else ""
            return (f"the model's tensor {name}{owner} holds NaN or infinite values at {model.spec.dtype}; check "
                    "the initialisation fields of that part of the spec")
    length = length or max(2, min(model.spec.max_len, 37))
    # one sequence: whether a dtype overflows shows in any; at 360M the whole model's forward is most of this
    inputs = example_input(model, 1, length, torch.Generator().manual_seed(seed))
    first: list[int] = []
    hooks = [block.register_forward_hook(  # (a block lending its keys and values returns them second)
        lambda module, args, output, index=index: first.append(index)
        if not first and not bool(torch.isfinite(output[0] if isinstance(output, tuple) else output).all()) else None)
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
