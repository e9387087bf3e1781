"""The mixer family is the planner's unit: each family's costs and backends, the plan's (mode, backend).

The plan reads ``mode_costs`` and ``backends`` from the family's IR class and branches on no kind
name; the chosen backend reaches the op (``linear_attention(backend=...)``) through the lowered
model, where each call runs the first of the family's kernels whose predicate (attnspec.ops.kernels, the
one the plan asked) takes it; an op told to run a kernel runs it or raises.
"""

from __future__ import annotations

import pytest
import torch

import attnspec.ops.linear as linear_ops
from attnspec.compiler import build_model, plan_spec
from attnspec.compiler.calibration import Calibration
from attnspec.compiler.plan import estimated_costs
from attnspec.errors import ShapeError
from attnspec.ops.kernels import KernelError
from attnspec.ops import linear_attention
from attnspec.ops.linear.backends import native
from attnspec.spec import loads_spec
from attnspec.spec.family import delta_costs, linear_costs

GLA = """
name: gla
input: {kind: tokens, vocab_size: 32}
d_model: 32
max_len: 4096
dtype: DTYPE
layers:
  - mixer: {kind: linear, heads: 2, feature_map: relu, normalize: false, mode: chunk,
            transition: {kind: data, per: PER, phase: none}}
"""


def _spec(per: str = "head", dtype: str = "float32"):
    return loads_spec(GLA.replace("PER", per).replace("DTYPE", dtype))


@pytest.fixture
def triton_installed(monkeypatch):
    """Plan for a CUDA machine on this one: Triton is what a CUDA install of torch brings (the
    predicate's other facts are the call's, which the plan states)."""
    from attnspec.ops.linear.backends import triton as triton_chunk

    if triton_chunk.triton is None:
        monkeypatch.setattr(triton_chunk, "triton", object())


@pytest.mark.parametrize("per, dtype, device, training, backend, exported", [
    ("head", "float32", "cpu", False, "native", "graph"),     # the CPU kernel; exported programs take the graph
    ("head", "float32", "cpu", True, "graph", "graph"),       # the kernel has no backward
    ("head", "float64", "cpu", False, "graph", "graph"),      # the kernel is float32 only
    ("channel", "float32", "cpu", False, "graph", "graph"),   # the kernels take one decay per head
    ("head", "float32", "cuda", False, "triton", "triton"),   # Triton: forward, backward, export
    ("head", "float32", "cuda", True, "triton", "triton"),
    ("channel", "float32", "cuda", True, "graph", "graph"),
])
def test_the_plan_chooses_the_backend_by_device_dtype_and_regime(per, dtype, device, training, backend, exported,
                                                                 triton_installed):
    if backend == "native" and not native.available():
        pytest.skip("the CPU kernel did not build on this machine")
    plan = plan_spec(_spec(per, dtype), 1024, training=training, device=device, calibration=Calibration.empty())
    layer = plan.layers[0]
    assert (layer.full_mode, layer.backend, layer.export_backend) == ("chunk", backend, exported)
    assert plan.to_json()["layers"][0]["backend"] == backend and plan.to_json()["device"] == device


def test_a_lowered_model_runs_the_kernel_of_each_call_s_regime(monkeypatch):
    if not native.available():
        pytest.skip("the CPU kernel did not build on this machine")
    calls = []
    original = linear_ops._native_chunked
    monkeypatch.setattr(linear_ops, "_native_chunked", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = build_model(_spec())
    assert model.blocks[0].mixer.kernels["chunk"][0] == ("triton", "native", "graph")
    tokens = torch.randint(0, 32, (2, 100))
    with torch.no_grad():
        planned = model(tokens)
    assert calls == [1]
    with native.disabled():  # switched off: the predicate says so and the graph path runs
        graph = model(tokens).detach()
    assert calls == [1] and torch.allclose(planned, graph, atol=1e-5)
    # a gradient is the training regime, which the kernel does not serve: the graph path runs, as
    # the training plan says
    model(tokens).sum().backward()
    assert calls == [1]


def test_a_plugin_kernel_is_chosen_by_its_own_predicate(monkeypatch):
    """A plugin family's kernel: registered with its predicate, chosen where it applies, passed over where
    it does not; the built-in names cannot be taken and an unknown name is refused."""
    from attnspec.ops import kernels
    from attnspec.spec.family import KernelInputs, Regime

    monkeypatch.setattr(kernels, "_PREDICATES", dict(kernels._PREDICATES))  # registration is process-wide
    kernels.register_kernel("probe", lambda inputs, regime: None if regime.dtype == "float64" else "float64 only")
    inputs = KernelInputs("chunk", True)
    assert kernels.first_that_runs(["probe", "graph"], inputs, Regime("cpu", "float64")) == "probe"
    assert kernels.first_that_runs(["probe", "graph"], inputs, Regime("cpu", "float32")) == "graph"
    with pytest.raises(ShapeError, match="built in"):
        kernels.register_kernel("native", lambda inputs, regime: None)
    with pytest.raises(ShapeError, match="unknown kernel"):
        kernels.kernel_problem("nope", inputs, Regime("cpu", "float32"))


def test_a_named_kernel_runs_or_raises_and_a_bad_name_is_refused():
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(3))
    reference = linear_attention(q, k, v, mode="chunk", backend="graph")
    assert torch.equal(linear_attention(q, k, v, mode="chunk", backend="auto"), reference)  # float64: graph
    with pytest.raises(KernelError, match="native kernel .* float64 call on cpu: it runs float32 on the CPU"):
        linear_attention(q, k, v, mode="chunk", backend="native")
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    with pytest.raises(KernelError, match="with a gradient: it has no backward"):
        linear_attention(q32, k32, v32, mode="chunk", backend="native")
    with pytest.raises(KernelError, match="it computes the causal chunk mode only, not causal scan"):
        linear_attention(q32.detach(), k32.detach(), v32.detach(), mode="scan", backend="native")
    with pytest.raises(ShapeError, match="backend must be auto or one of"):
        linear_attention(q, k, v, backend="cuda-magic")


def test_each_family_is_costed_by_its_own_cost_function():
    spec = loads_spec("""
name: families
input: {kind: tokens, vocab_size: 32}
d_model: 64
max_len: 4096
layers:
  - mixer: {kind: delta, heads: 4, transition: {kind: mamba, per: channel}}
  - mixer: {kind: linear, heads: 4, feature_map: relu}
  - mixer: {kind: softmax, heads: 4}
""")
    delta, linear, softmax = (block.mixer for block in spec.layers)
    L = 2048
    expected = delta_costs(L, 4, 16, 16, 64, per_channel=True)
    assert {mode: cost.macs for mode, cost in estimated_costs(delta, L).items()} == \
        {mode: cost.macs for mode, cost in expected.items()}
    # the delta rule's chunk form costs more than gated linear attention's at the same widths (the UT transform)
    assert estimated_costs(delta, L)["chunk"].macs > linear_costs(L, 4, 16, 16, 64, True, False)["chunk"].macs
    assert set(estimated_costs(linear, L)) == {"chunk", "recurrent", "scan", "quadratic"}
    assert set(estimated_costs(softmax, L)) == {"quadratic"}
    plan = plan_spec(spec, L, calibration=Calibration.empty())
    native_or_graph = "native" if native.available() else "graph"
    assert [layer.backend for layer in plan.layers] == ["graph", native_or_graph, "graph"]
    assert plan.layers[0].full_mode == "chunk" and plan.layers[2].decode_mode == "cache"
    assert plan.layers[2].decode_cache == 4096 and plan.layers[0].decode_cache is None
