"""bfloat16 and float16 inputs to every op and mode, against the float64 reference.

The inputs are rounded to the half dtype first and the reference sees the very same numbers, so the
only errors are the op's own. On the graph path (every mode on the CPU) half-precision inputs are
computed in float32 and the output is rounded once, so each output element obeys

    |out - ref| <= u |ref| + (u + 1) * 1e-5 * max|ref|

with u the unit roundoff of the output dtype (2^-8 bfloat16, 2^-11 float16): the rounding of the
float32 result (at most u of it), plus the float32 computation's own error (observed below 1e-6 of
the largest value; 1e-5 leaves a 10x margin). A state accumulated in half precision would miss this
by orders of magnitude at L = 300 (a bfloat16 running sum loses all digits below 2^-8 of itself).
The Triton kernels on CUDA also narrow their products' operands; they are held to
tests/ops/test_triton_chunk.py's tolerance (8u of the largest value) instead.
"""

from __future__ import annotations

import pytest
import torch

from attnspec.ops import scatterbrain_attention, softmax_attention
from attnspec.ops.linear import MODES, linear_attention
from attnspec.ops.linear.naive import linear_attention_reference
from attnspec.ops.support import local_support
from tests.conftest import DEVICES
from attnspec.ops.softmax.naive import softmax_reference

ROUNDOFF = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}
HALF = list(ROUNDOFF)


def _inputs(dtype, decay, L=300, B=2, H=2, K=12, V=10, positive=False):
    g = torch.Generator().manual_seed(0)
    rounded = lambda *shape: torch.randn(*shape, generator=g).to(dtype).double()  # noqa: E731
    q, k, v = rounded(B, H, L, K), rounded(B, H, L, K), rounded(B, H, L, V)
    if positive:
        q, k = q.abs(), k.abs()
    log_a = None
    if decay == "real":
        log_a = -torch.rand(B, H, L, generator=g, dtype=torch.float64) * 0.1
    elif decay == "channel":
        log_a = -torch.rand(B, H, L, K, generator=g, dtype=torch.float64) * 0.1
    elif decay == "complex":
        log_a = torch.complex(-torch.rand(B, H, L, generator=g, dtype=torch.float64) * 0.1,
                              torch.randn(B, H, L, generator=g, dtype=torch.float64))
    return q, k, v, log_a


def _within_bound(out, ref, dtype, device, mode):
    assert out.dtype == dtype and torch.isfinite(out).all()
    error = (out.double().cpu() - ref).abs()
    scale = ref.abs().max()
    u = ROUNDOFF[dtype]
    if device == "cuda" and mode == "chunk":  # the Triton kernels narrow operands
        assert error.max() <= 8 * u * scale, (error.max() / scale).item()
        return
    bound = u * ref.abs() + (u + 1) * 1e-5 * scale
    assert (error <= bound).all(), ((error - bound).max() / scale).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("decay, normalize", [(None, False), ("real", False), ("channel", False), ("complex", False),
                                              (None, True), ("real", True), ("channel", True)])
def test_linear_attention_in_half_precision(device, dtype, mode, decay, normalize):
    """(A complex decay's normaliser Re(q . z) changes sign, and the clamped quotient overflows float16
    as it should, so it is not normalised here.)"""
    q, k, v, log_a = _inputs(dtype, decay, L=300 if mode != "recurrent" else 90, positive=normalize)
    on = lambda t: t.to(device, dtype)  # noqa: E731
    log_a_in = None if log_a is None else log_a.to(device, torch.complex64 if log_a.is_complex() else torch.float32)
    out, state = linear_attention(on(q), on(k), on(v), log_a_in, mode=mode, normalize=normalize, return_state=True,
                                  max_length=300)
    ref, S, _ = linear_attention_reference(q, k, v, log_a, normalize=normalize)
    _within_bound(out, ref, dtype, device, mode)
    S_out = state[0] if normalize else state
    assert S_out.dtype in (torch.float32, torch.complex64)  # the state stays in the accumulation dtype
    # the graph path keeps the state to float32's digits; the Triton kernels round the decayed keys to
    # the input dtype before the tensor-core product (as FLA does: observed 0.4u bfloat16, 0.5u
    # float16 on an H200), so their state is held to the output's 8u of the largest value
    tolerance = 8 * ROUNDOFF[dtype] if device == "cuda" and mode == "chunk" else 1e-5
    assert (S_out.cpu().to(torch.complex128) - S).abs().max() <= tolerance * S.abs().max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["chunk", "scan", "quadratic"])
def test_half_precision_gradients(device, dtype, mode):
    """Gradients reach half-precision inputs in their dtype and match the float64 reference's to 8u of
    the largest (the incoming gradient is rounded to the input dtype, then the same bound applies)."""
    q, k, v, log_a = _inputs(dtype, "real", L=130)
    leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    log_mag = log_a.to(device, torch.float32).requires_grad_()
    out = linear_attention(*leaves, log_mag, mode=mode, max_length=130)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * weight.to(device)).sum().backward()
    exact = [t.clone().requires_grad_() for t in (q, k, v, log_a)]
    (linear_attention_reference(*exact)[0] * weight).sum().backward()
    for mine, truth in zip([*leaves, log_mag], exact):
        assert mine.grad.dtype == mine.dtype
        error = (mine.grad.double().cpu() - truth.grad).abs().max() / truth.grad.abs().max()
        assert error <= 8 * ROUNDOFF[dtype], error.item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
def test_softmax_and_scatterbrain_in_half_precision(device, dtype):
    """Softmax (with a decay bias) and Scatterbrain take half-precision inputs and return their dtype,
    within 8u of the largest value of the float64 result (SDPA's own half-precision kernels round
    the probabilities they multiply the values with)."""
    q, k, v, log_a = _inputs(dtype, "real", L=64)
    on = lambda t: t.to(device, dtype)  # noqa: E731
    out = softmax_attention(on(q), on(k), on(v), log_a.to(device, torch.float32))
    ref = softmax_reference(q, k, v, log_a)
    assert out.dtype == dtype
    assert (out.double().cpu() - ref).abs().max() <= 8 * ROUNDOFF[dtype] * ref.abs().max()

    support = local_support(64, 8, causal=True, batch=2, heads=2, device=device)
    features = lambda t: torch.exp(t / 4)  # noqa: E731  positive features
    half = scatterbrain_attention(on(q), on(k), on(v), features(on(q)), features(on(k)), support)
    wide = scatterbrain_attention(q.to(device), k.to(device), v.to(device), features(on(q)).double(),
                                  features(on(k)).double(), support)
    assert half.dtype == dtype
    assert (half.double() - wide).abs().max() <= 8 * ROUNDOFF[dtype] * wide.abs().max()
