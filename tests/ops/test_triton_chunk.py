"""The Triton chunk kernels against the float64 reference: outputs, final states and every gradient.

On a machine without CUDA they run on Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in
tests/conftest.py), which executes the same kernel code with numpy, so CI checks them without a GPU;
with a CUDA device the same tests also run there. Unwritten outputs show up: tests/ops/conftest.py
fills every ``torch.empty`` with NaN.

Tolerances, as a fraction of the largest reference value (errors are absolute), measured through the
interpreter in brackets:
* float32: 5e-6 [<= 5.4e-7]. Each output is a sum of at most L = 500 products accumulated in float32
  (unit roundoff 6e-8); any wrong term (one missing or doubled term is O(1 / L) of the output,
  >= 2e-3 here) is far above it.
* bfloat16 / float16, with unit roundoff u = 2^-8 / 2^-11 (inputs rounded first, so the reference sees
  the very same numbers): 8u, i.e. 2^-5 / 2^-8 [<= 1.7u]. The output is rounded to the input dtype
  (u), the incoming gradient too (u), and on a GPU the kernels narrow the operands of their matrix
  products to the input dtype (scores, decayed keys and queries), as flash-linear-attention does,
  and the float32 states to TF32 (10 mantissa bits): each a relative rounding of at most u on terms
  that partly cancel. (The interpreter multiplies bfloat16 operands in float32, see
  ``triton_chunk._meta``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attnspec.ops.linear import linear_attention
from attnspec.ops.linear.naive import linear_attention_reference
from tests.conftest import DEVICES, ROOT

pytestmark = pytest.mark.slow  # Triton's CPU interpreter: 25-50 s in all

triton_chunk = pytest.importorskip("attnspec.ops.linear.backends.triton")
pytestmark = pytest.mark.skipif(not triton_chunk.available(), reason="Triton is not installed (pip install triton)")

TOLERANCE = {torch.float32: 5e-6, torch.bfloat16: 2 ** -5, torch.float16: 2 ** -8}


def _ready(device: str):
    if device == "cpu" and not triton_chunk.interpreted():
        pytest.skip("the Triton kernels were defined without TRITON_INTERPRET=1, so they cannot run on the CPU")


def _problem(B, H, L, K, V, decay, initial, *, dtype=torch.float32, gates=None, seed=0):
    """float64 leaves (inputs rounded to ``dtype`` first) for the kernel and the reference."""
    g = torch.Generator().manual_seed(seed)
    rounded = lambda *shape: torch.randn(*shape, generator=g).to(dtype).double()  # noqa: E731
    q, k, v = rounded(B, H, L, K), rounded(B, H, L, K), rounded(B, H, L, V)
    log_mag = phase = None
    if decay is not None:
        if gates == "extreme":  # a = 0 (reset), a within 1e-7 of 1, and a near 0, mixed
            choice = torch.randint(0, 3, (B, H, L), generator=g)
            log_mag = torch.where(choice == 0, float("-inf"), torch.where(choice == 1, -1e-7, -20.0)).double()
        else:
            log_mag = -torch.rand(B, H, L, generator=g, dtype=torch.float64) * 0.5
    if decay == "complex":
        phase = torch.randn(B, H, L, generator=g, dtype=torch.float64) * 2
    s0_re = torch.randn(B, H, K, V, generator=g, dtype=torch.float64) if initial else None
    s0_im = torch.randn(B, H, K, V, generator=g, dtype=torch.float64) if initial and decay == "complex" else None
    return q, k, v, log_mag, phase, s0_re, s0_im


def _compare(device, dtype, q, k, v, log_mag, phase, s0_re, s0_im, *, scale=0.5, chunk=64, grads=True):
    """Max errors of the kernels against the reference, relative to the reference's largest entry:
    output, final state, then the gradient of every given input."""
    named = {name: t for name, t in zip(("q", "k", "v", "log_mag", "phase", "s0_re", "s0_im"),
                                         (q, k, v, log_mag, phase, s0_re, s0_im)) if t is not None}
    for name, t in named.items():  # (the reference's gradient at a = 0 exactly is NaN: 0 * inf)
        t.requires_grad_(grads and bool(torch.isfinite(t).all()))
    on = lambda t, as_dtype=None: None if t is None else t.to(device, as_dtype or torch.float32)  # noqa: E731
    out, final_re, final_im = triton_chunk.chunked_linear_attention(
        on(q, dtype), on(k, dtype), on(v, dtype), on(log_mag), on(phase), on(s0_re), on(s0_im), scale, chunk)
    assert out.dtype == dtype and final_re.dtype == torch.float32
    log_a = None if log_mag is None else (log_mag if phase is None else torch.complex(log_mag, phase))
    s0 = None if s0_re is None else (s0_re if s0_im is None else torch.complex(s0_re, s0_im))
    ref_out, S, _ = linear_attention_reference(q, k, v, log_a, scale=scale, S0=s0)
    rel = lambda a, b: ((a.double().cpu() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()  # noqa: E731
    errors = {"out": rel(out, ref_out), "state": rel(final_re, S.real)}
    if final_im is not None:
        errors["state_im"] = rel(final_im, S.imag)
    assert torch.isfinite(out).all()
    if not grads:
        return errors
    g = torch.Generator().manual_seed(1)
    w_out = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    w_re, w_im = (torch.randn(S.shape, generator=g, dtype=torch.float64) for _ in range(2))
    mine = (out.double().cpu() * w_out).sum() + (final_re.double().cpu() * w_re).sum()
    truth = (ref_out * w_out).sum() + (S.real * w_re).sum()
    if final_im is not None:
        mine, truth = mine + (final_im.double().cpu() * w_im).sum(), truth + (S.imag * w_im).sum()
    differentiable = {name: t for name, t in named.items() if t.requires_grad}
    for name, a, b in zip(differentiable, torch.autograd.grad(mine, list(differentiable.values())),
                          torch.autograd.grad(truth, list(differentiable.values()))):
        errors["d" + name] = rel(a, b)
    return errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decay", [None, "real", "complex"])
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("B, H, L, K, V, chunk", [(1, 2, 63, 16, 20, 16), (2, 1, 130, 60, 33, 64)])
def test_float32_matches_the_float64_reference(device, decay, initial, B, H, L, K, V, chunk):
    _ready(device)
    errors = _compare(device, torch.float32, *_problem(B, H, L, K, V, decay, initial), chunk=chunk)
    assert max(errors.values()) <= TOLERANCE[torch.float32], errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decay", ["real", "complex"])
@pytest.mark.parametrize("reset", [float("-inf"), -1000.0])
def test_gates_near_zero_and_one_over_a_long_sequence(device, decay, reset):
    """L = 500 with resets (a = 0), a = 1 - 1e-7 and a = e^-20 mixed: float64 differences of the in-chunk
    sums keep every decay exact, so the float32 tolerance holds and nothing is NaN. A reset written as
    log a = -1000 (exp is exactly 0 in float64 too) also checks the decays' gradients, which the
    reference cannot give at -inf."""
    _ready(device)
    q, k, v, log_mag, phase, s0_re, s0_im = _problem(1, 2, 500, 16, 16, decay, True, gates="extreme")
    log_mag = log_mag.masked_fill(log_mag.isinf(), reset)
    errors = _compare(device, torch.float32, q, k, v, log_mag, phase, s0_re, s0_im)
    assert max(errors.values()) <= TOLERANCE[torch.float32], errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decay", [None, "real", "complex"])
def test_half_precision_inputs(device, dtype, decay):
    _ready(device)
    errors = _compare(device, dtype, *_problem(2, 2, 100, 32, 24, decay, False, dtype=dtype))
    assert max(errors.values()) <= TOLERANCE[dtype], errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_at_the_performer_shape(device, dtype):
    """The shape and values a Performer layer hands the kernels: 64 positive features in (0, 1] spanning
    seven decades (exp of minus half a squared distance), 8 value channels plus the normaliser's
    column of ones (V = 9), no decay. (On an H200 and an H100 with torch 2.11 and Triton 3.6, the
    output was 70% off here in both half dtypes, worse chunk by chunk, while float32 was exact: the
    state read as a bfloat16/float16 operand was miscompiled, and with normal q, k it read out of
    bounds. Read as TF32, the H100 gave 2.3e-3 (bfloat16) and 5.3e-4 (float16) of the largest
    value here, 2026-11-28.)"""
    _ready(device)
    g = torch.Generator().manual_seed(0)
    features = lambda: torch.exp(-7 * torch.rand(1, 2, 200, 64, generator=g, dtype=torch.float64) ** 2)  # noqa: E731
    q, k = features().to(dtype).double(), features().to(dtype).double()
    v = torch.cat([torch.randn(1, 2, 200, 8, generator=g), torch.ones(1, 2, 200, 1)], -1).to(dtype).double()
    errors = _compare(device, dtype, q, k, v, None, None, None, None, scale=1.0)
    assert max(errors.values()) <= TOLERANCE[dtype], errors


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs_as_the_mixers_make_them(device):
    """q, k, v as views (B, L, H, D) -> (B, H, L, D), the layout the mixers pass: no copy is needed and
    the result equals that of contiguous inputs exactly."""
    _ready(device)
    B, L, H, D = 2, 40, 3, 16
    x = torch.randn(3, B, L, H, D, device=device)
    q, k, v = (t.transpose(1, 2) for t in x)
    log_mag = -torch.rand(B, H, L, device=device)
    strided = triton_chunk.chunked_linear_attention(q, k, v, log_mag, None, None, None, 1.0, 16)[0]
    packed = triton_chunk.chunked_linear_attention(q.contiguous(), k.contiguous(), v.contiguous(), log_mag, None,
                                                   None, None, 1.0, 16)[0]
    assert torch.equal(strided, packed)


@pytest.mark.parametrize("decay", [None, "real", "complex"])
def test_linear_attention_takes_the_kernels_on_cuda(decay):
    """On CUDA the chunk mode of :func:`linear_attention` is the Triton path (normalised as well)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    q, k, v, log_mag, phase, _, _ = _problem(2, 2, 300, 32, 32, decay, False)
    q, k = q.abs(), k.abs()  # positive features, as a normalised map gives
    log_a = None if log_mag is None else (log_mag if phase is None else torch.complex(log_mag, phase))
    cuda = lambda t: None if t is None else t.cuda().to(torch.complex64 if t.is_complex() else torch.float32)  # noqa: E731
    from attnspec.ops.linear import _kernel
    from attnspec.ops.linear.checks import _split_log_a

    decay_pair = None if log_a is None else _split_log_a(cuda(log_a), cuda(q))
    # the kernels, not the graph path
    assert _kernel("auto", cuda(q), cuda(k), cuda(v), decay_pair, None, True, "chunk") == "triton"
    out = linear_attention(cuda(q), cuda(k), cuda(v), cuda(log_a), normalize=True, mode="chunk")
    ref = linear_attention_reference(q, k, v, log_a, normalize=True)[0]
    assert ((out.double().cpu() - ref).abs().max() / ref.abs().max()).item() <= TOLERANCE[torch.float32]


def test_compiled_and_exported_programs_keep_the_kernels_on_cuda(tmp_path):
    """fullgraph compile keeps the op and does not recompile across lengths; export with a dynamic length
    and an AOTInductor package run it and equal eager."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    from torch._dynamo.utils import counters

    def attend(q, k, v, log_mag, phase):
        return triton_chunk.chunked_linear_attention(q, k, v, log_mag, phase, None, None, 0.25, 64)[0]

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attend, fullgraph=True, dynamic=True)
    for L in (100, 257, 1000):
        q, k, v = (torch.randn(2, 4, L, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        log_mag, phase = -torch.rand(2, 4, L, device="cuda"), torch.randn(2, 4, L, device="cuda")
        torch.testing.assert_close(compiled(q, k, v, log_mag, phase), attend(q, k, v, log_mag, phase))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, log_mag, phase):
            return attend(q, k, v, log_mag, phase)

    length = torch.export.Dim("L", min=2, max=8192)
    program = torch.export.export(Attend(), (q, k, v, log_mag, phase),
                                  dynamic_shapes=tuple({2: length} for _ in range(5)))
    short = [t[:, :, :333].contiguous() for t in (q, k, v, log_mag, phase)]
    torch.testing.assert_close(program.module()(*short), attend(*short))
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "attend.pt2"))
    torch.testing.assert_close(torch._inductor.aoti_load_package(package)(*short), attend(*short))


def test_compile_and_export_trace_the_kernels_without_a_gpu():
    """On any machine: ``torch.compile(fullgraph=True)`` captures the op in one graph for three lengths,
    and ``torch.export`` keeps it with a symbolic length. Tracing only (fake tensors), so it runs in a
    process where the kernels are real Triton kernels, not interpreted ones."""
    script = textwrap.dedent("""
        import torch
        from attnspec.ops.linear.backends import triton as triton_chunk
        graphs = []
        class NotRun(Exception):
            pass
        def backend(gm, inputs):
            graphs.append(gm)
            def run(*args):
                raise NotRun
            return run
        def attend(q, k, v, log_mag, phase):
            return triton_chunk.chunked_linear_attention(q, k, v, log_mag, phase, None, None, 0.5, 64)
        compiled = torch.compile(attend, fullgraph=True, backend=backend, dynamic=True)
        for L in (70, 129, 300):
            q, k, v = (torch.randn(2, 3, L, 32, dtype=torch.bfloat16) for _ in range(3))
            args = (q, k, v, -torch.rand(2, 3, L), torch.randn(2, 3, L))
            try:
                compiled(*args)
            except NotRun:
                pass
        ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function" and "triton_chunk" in str(n.target)]
        print("graphs", len(graphs), "ops", ops)
        class Attend(torch.nn.Module):
            def forward(self, q, k, v, log_mag, phase):
                return attend(q, k, v, log_mag, phase)[0]
        length = torch.export.Dim("L", min=2, max=8192)
        program = torch.export.export(Attend(), args, dynamic_shapes=tuple({2: length} for _ in range(5)))
        kept = [str(n.target) for n in program.graph.nodes if "triton_chunk" in str(n.target)]
        print("exported", kept, sorted(set(str(r) for r in program.range_constraints.values())))
    """)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graphs 1 ops ['attnspec.triton_chunk']" in done.stdout, done.stdout
    assert "exported ['attnspec.triton_chunk.default'] ['VR[2, 8192]']" in done.stdout, done.stdout


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decay", [None, "real", "complex"])
def test_causality_by_autograd(device, decay):
    """The output at t has zero gradient with respect to every input after t (chunk boundary at 16 inside)."""
    _ready(device)
    q, k, v, log_mag, phase, _, _ = _problem(1, 2, 40, 16, 16, decay, False)
    leaves = [t.float().to(device).requires_grad_() for t in (q, k, v, log_mag, phase) if t is not None]
    q, k, v = leaves[:3]
    decays = leaves[3:] + [None] * (5 - len(leaves))
    out = triton_chunk.chunked_linear_attention(q, k, v, decays[0], decays[1], None, None, 1.0, 16)[0]
    t = 21
    for grad in torch.autograd.grad(out[:, :, t].sum(), leaves):
        assert torch.all(grad[:, :, t + 1:] == 0), "the output at t depends on inputs after t"
        assert grad[:, :, :t + 1].abs().sum() > 0
