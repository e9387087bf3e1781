"""The kernel the plan names is the kernel that runs, for every shipped spec (issue 35).

The plan asks each kernel's predicate (:mod:`attnspec.ops.kernels`) with the spec's facts and the
regime it plans for; at a call the module asks the same predicates with its tensors' facts and the op
runs the kernel it is told or raises. Here every shipped spec (at the compiler tests' small widths) is
planned on the CPU in float32, float64 and bfloat16, for inference and for training, and run eagerly
and through ``torch.export`` (what a build's ``model.pt2`` is): the kernel each block's op ran is
recorded and must be the plan's ``backend`` (``export_backend`` under export), and a block whose plan
names a kernel must have run it. A family's facts that disagree with its tensors (a key width, a
decay) fail here, as would an op that chose on its own.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import attnspec.ops.linear as linear_ops
from attnspec.compiler import plan_spec
from attnspec.compiler.calibration import Calibration
from attnspec.compiler.export import export_model
from attnspec.compiler.tracing import example_input
from attnspec.nn.model import build_model_from_spec
from attnspec.spec import load_spec
from tests.compiler.conftest import small_overrides
from tests.conftest import SPECS

DTYPES = ["float32", "float64", "bfloat16"]
LENGTH = 100


@pytest.fixture
def ran(monkeypatch):
    """``record(model)``: the kernels each block's op ran since, as {block index: {kernel}}."""
    runs: dict[int, set[str]] = {}
    current = [None]
    original = linear_ops._kernel

    def recorded(*args, **kwargs):
        kernel = original(*args, **kwargs)
        runs.setdefault(current[0], set()).add(kernel)
        return kernel

    monkeypatch.setattr(linear_ops, "_kernel", recorded)

    def record(model):
        for index, block in enumerate(model.blocks):
            block.mixer.register_forward_pre_hook(lambda module, args, index=index: current.__setitem__(0, index))
        runs.clear()
        return runs

    return record


def _agree(plan, runs: dict[int, set[str]], field: str) -> None:
    for index, layer in enumerate(plan.layers):
        named = getattr(layer, field)
        assert runs.get(index, {"graph"}) == {named}, (layer.path, named, runs.get(index))
        assert named == "graph" or index in runs, (layer.path, f"the plan names {named}, nothing ran")


def _model(path, dtype: str, training: bool):
    """The plan and model of a float32 or float64 spec; bfloat16 is a float32 model under autocast
    (what ``attnspec train --precision bfloat16`` runs), planned for the dtype its mixers compute in."""
    spec = load_spec(path, [*small_overrides(path), f"dtype={'float64' if dtype == 'float64' else 'float32'}"])
    plan = plan_spec(spec, training=training, calibration=Calibration.empty(), dtype=dtype)  # as a build plans
    model = build_model_from_spec(spec)
    model.set_modes(plan.full_modes)
    return plan, model.train(training)


def _precision(dtype: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_eager_calls_run_the_kernel_the_plan_names(path, ran):
    for dtype in DTYPES:
        for training in (False, True):
            plan, model = _model(path, dtype, training)
            runs = ran(model)
            inputs = example_input(model, 2, LENGTH, torch.Generator().manual_seed(0))
            with torch.set_grad_enabled(training), _precision(dtype):
                out = model(inputs)
            if training:
                out.float().square().mean().backward()
            _agree(plan, runs, "backend")


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_exported_programs_hold_the_kernel_the_plan_names(path, ran, tmp_path):
    # float32 only: on the CPU it is the one dtype whose eager calls may take a kernel (the native chunk
    # kernel), which export must turn away; in float64 and bfloat16 the kernels refuse the call by dtype
    # before export is asked (the eager test above holds every dtype to its plan)
    for dtype in ["float32"]:
        plan, model = _model(path, dtype, training=False)
        runs = ran(model)
        with _precision(dtype):
            export_model(model.eval(), tmp_path / f"{dtype}.pt2")
        _agree(plan, runs, "export_backend")
