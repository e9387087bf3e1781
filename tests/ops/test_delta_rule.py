"""The delta rule (attnspec.ops.delta): every mode against the float64 reference loop, at odd sizes,
with initial states, gradients of every input, gates at 0 and 1, beta at 0, 1 and 2, long sequences,
half precision, causality, the decoding step continuing a prefill, and compiled code that does not
recompile across lengths.

Tolerances: float64 modes agree with the loop to 1e-10 of the largest value (measured about 4e-15;
a wrong term would show at 1e-2 or more). Gradients: 1e-9 (measured 1.2e-15). float32: relative
RMS 1e-5 (a state summed in float32 over L steps, measured 7.6e-7). Half precision: the one rounding
of a float32 result, 8u of the largest value (u = 2^-8 for bf16, 2^-11 for fp16).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnspec.errors import ShapeError
from attnspec.ops.delta import MODES, delta_rule, delta_step
from attnspec.ops.delta.naive import delta_rule_reference

GATES = ["none", "head", "channel"]


def inputs(B, H, L, Dk, Dv, gate, *, dtype=torch.float64, beta_max=2.0, seed=0, gates=None):
    """Unit-norm keys (what the l2norm feature map gives), beta in [0, beta_max], gates as asked."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, Dk, generator=generator, dtype=torch.float64)
    k = F.normalize(torch.randn(B, H, L, Dk, generator=generator, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, L, Dv, generator=generator, dtype=torch.float64)
    beta = torch.rand(B, H, L, generator=generator, dtype=torch.float64) * beta_max
    shape = {"none": None, "head": (B, H, L), "channel": (B, H, L, Dk)}[gate]
    log_a = None if shape is None else -torch.rand(*shape, generator=generator, dtype=torch.float64) * 0.5
    if gates is not None and log_a is not None:
        log_a = gates(log_a)
    return [t if t is None else t.to(dtype) for t in (q, k, v, beta, log_a)]


def relative(got, want):
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("L, Dk, Dv, chunk", [(63, 20, 12, 16), (130, 60, 33, 64), (500, 20, 33, 64), (7, 20, 12, 64)])
def test_every_mode_equals_the_reference(gate, L, Dk, Dv, chunk):
    q, k, v, beta, log_a = inputs(2, 3, L, Dk, Dv, gate)
    state = torch.randn(2, 3, Dk, Dv, dtype=torch.float64)
    want, want_state = delta_rule_reference(q, k, v, beta, log_a, scale=0.7, initial_state=state)
    for mode in MODES:
        if mode == "quadratic" and L > 200:
            continue  # the L x L transform is for short sequences
        got, got_state = delta_rule(q, k, v, beta, log_a, mode=mode, scale=0.7, chunk_size=chunk,
                                    initial_state=state, return_state=True)
        assert relative(got, want) < 1e-10 and relative(got_state, want_state) < 1e-10, mode


@pytest.mark.parametrize("gate", GATES)
def test_gradients_of_every_input_equal_the_reference(gate):
    leaves = [t.requires_grad_() for t in inputs(1, 2, 37, 12, 9, gate) if t is not None]
    state = torch.randn(1, 2, 12, 9, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(1, 2, 37, 9, dtype=torch.float64)
    weights_state = torch.randn(1, 2, 12, 9, dtype=torch.float64)

    def grads(function):
        out, final = function(*leaves[:4], leaves[4] if len(leaves) > 4 else None, state)
        return torch.autograd.grad((out * weights).sum() + (final * weights_state).sum(), [*leaves, state])

    want = grads(lambda q, k, v, b, a, s: delta_rule_reference(q, k, v, b, a, scale=0.5, initial_state=s))
    for mode in MODES:
        got = grads(lambda q, k, v, b, a, s: delta_rule(q, k, v, b, a, mode=mode, scale=0.5, chunk_size=8,
                                                        initial_state=s, return_state=True))
        for name, g, w in zip(["q", "k", "v", "beta", "log_a", "state"][:len(want) - 1] + ["state"], got, want):
            assert relative(g, w) < 1e-9, (mode, name)


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_gates_at_zero_and_one_and_beta_at_its_limits(gate):
    """a = 0 (log -inf: a reset), a = 1 (log 0), a = e^-20 mixed in; beta exactly 0, 1 and 2."""
    def extreme(log_a):
        log_a = log_a.clone()
        log_a[:, :, 5] = float("-inf")
        log_a[:, :, 10:20] = 0.0
        log_a[:, :, 30] = -20.0
        log_a[:, :, 60:] = -1e-12
        return log_a

    q, k, v, beta, log_a = inputs(1, 2, 90, 16, 8, gate, gates=extreme)
    beta[:, :, :30] = 0.0
    beta[:, :, 30:40] = 1.0
    beta[:, :, 40:50] = 2.0
    want, _ = delta_rule_reference(q, k, v, beta, log_a)
    for mode in MODES:
        got = delta_rule(q, k, v, beta, log_a, mode=mode, chunk_size=16)
        assert torch.isfinite(got).all() and relative(got, want) < 1e-10, mode
    # a reset forgets everything before it: the outputs after it do not depend on what came before
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    v2[:, :, :5] += 100.0
    after = delta_rule(q2, k2, v2, beta, log_a, chunk_size=16)
    assert torch.allclose(after[:, :, 5:], delta_rule(q, k, v, beta, log_a, chunk_size=16)[:, :, 5:], atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("gate", GATES)
def test_a_very_long_sequence_is_finite_and_equals_the_recurrence_on_a_slice(gate):
    """L = 65536 in chunk mode; the outputs of a slice equal the recurrent mode run from the chunk
    mode's state at the slice's start."""
    L, start, width = 65536, 50_000, 300
    q, k, v, beta, log_a = inputs(1, 1, L, 16, 16, gate, dtype=torch.float32)
    out = delta_rule(q, k, v, beta, log_a, chunk_size=64)
    assert torch.isfinite(out).all()
    part = lambda t: None if t is None else t[:, :, :start]  # noqa: E731
    _, state = delta_rule(*(part(t) for t in (q, k, v, beta, log_a)), chunk_size=64, return_state=True)
    piece = lambda t: None if t is None else t[:, :, start:start + width]  # noqa: E731
    again = delta_rule(*(piece(t) for t in (q, k, v, beta, log_a)), mode="recurrent", initial_state=state)
    assert relative(again, out[:, :, start:start + width]) < 1e-4


@pytest.mark.parametrize("gate", GATES)
def test_float32_is_close_to_float64(gate):
    q, k, v, beta, log_a = inputs(2, 2, 300, 32, 24, gate)
    want, _ = delta_rule_reference(q, k, v, beta, log_a)
    for mode in MODES:
        got = delta_rule(*(t if t is None else t.float() for t in (q, k, v, beta, log_a)), mode=mode)
        rms = float((got.double() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())
        assert got.dtype == torch.float32 and rms < 1e-5, mode


@pytest.mark.parametrize("dtype, unit", [(torch.bfloat16, 2 ** -8), (torch.float16, 2 ** -11)])
def test_half_precision_accumulates_in_float32(dtype, unit):
    q, k, v, beta, log_a = inputs(1, 2, 130, 16, 16, "channel", dtype=dtype)
    want, _ = delta_rule_reference(q, k, v, beta, log_a)
    for mode in MODES:
        got, state = delta_rule(q, k, v, beta, log_a, mode=mode, chunk_size=32, return_state=True)
        assert got.dtype == dtype and state.dtype == torch.float32
        assert relative(got, want) < 8 * unit, mode


@pytest.mark.parametrize("mode", MODES)
def test_causality(mode):
    q, k, v, beta, log_a = (t.requires_grad_() for t in inputs(1, 2, 40, 8, 8, "channel"))
    out = delta_rule(q, k, v, beta, log_a, mode=mode, chunk_size=16)
    grads = torch.autograd.grad(out[:, :, 17].sum(), [q, k, v, beta, log_a])
    for grad in grads:
        assert grad[:, :, 18:].abs().max() == 0


def test_decoding_continues_a_prefill_exactly():
    q, k, v, beta, log_a = inputs(2, 2, 50, 12, 10, "head")
    full = delta_rule(q, k, v, beta, log_a, mode="recurrent")
    _, state = delta_rule(*(t[:, :, :30] for t in (q, k, v, beta, log_a)), chunk_size=8, return_state=True)
    for t in range(30, 50):
        out, state = delta_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], log_a[:, :, t], state)
        assert relative(out, full[:, :, t]) < 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("gate", GATES)
def test_compiled_chunk_mode_equals_eager_without_recompiling_across_lengths(gate):
    def attention(q, k, v, beta, log_a):
        return delta_rule(q, k, v, beta, log_a, chunk_size=16, max_length=1024)

    compiled = torch.compile(attention, fullgraph=True, dynamic=True)
    for i, L in enumerate((70, 129, 300, 37)):
        args = inputs(1, 2, L, 8, 8, gate, dtype=torch.float32, seed=i)
        if i == 0:
            got = compiled(*args)
        else:
            with torch.compiler.set_stance("fail_on_recompile"):
                got = compiled(*args)
        assert relative(got, attention(*args)) < 1e-5


def test_bad_arguments_are_shape_errors():
    q, k, v, beta, log_a = inputs(1, 2, 10, 4, 3, "head")
    for call in (lambda: delta_rule(q[0], k, v, beta), lambda: delta_rule(q, k[..., :3], v, beta),
                 lambda: delta_rule(q, k, v, beta[..., :5]), lambda: delta_rule(q, k, v, beta, log_a[..., :5]),
                 lambda: delta_rule(q, k, v, beta, mode="scan"), lambda: delta_rule(q, k, v, beta, chunk_size=0),
                 lambda: delta_rule(q, k, v, beta, initial_state=torch.zeros(1, 2, 3, 3)),
                 lambda: delta_rule(q.long(), k.long(), v.long(), beta)):
        with pytest.raises(ShapeError):
            call()
