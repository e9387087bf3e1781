"""RWKV-4 (`rwkv` time mixing, `rwkv_channel` channel mixing): the WKV operator in every mode held to its definition
summed directly in float64 (odd lengths and chunks, keys to ±80 where e^k overflows float32, decay rates from 3e-4 to
55, gradients), the mixers to their definitions written out from their own weights, decoding to the full pass (eager
and compiled without recompiles), compile across lengths, and the located errors."""

from __future__ import annotations

import math

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.ops import rwkv as wkv
from tests.nn.decoding import assert_compiled_step_equals_full_pass, assert_decodes_as_full_pass

D = 16


def _definition(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """wkv_t = (Σ_{i<t} e^{k_i - (t-1-i) w} v_i + e^{u + k_t} v_t) / (same with v = 1), summed term by term in
    float64 (e^80 is a float64 number)."""
    w, u, k, v = (t.double() for t in (w, u, k, v))
    out = torch.empty_like(v)
    for t in range(k.shape[1]):
        weights = [torch.exp(k[:, i] - (t - 1 - i) * w) for i in range(t)] + [torch.exp(u + k[:, t])]
        values = [v[:, i] for i in range(t + 1)]
        out[:, t] = sum(a * b for a, b in zip(weights, values)) / sum(weights)
    return out


def _inputs(L: int, C: int, spread: float, dtype=torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    k = (torch.rand(2, L, C, generator=generator, dtype=torch.float64) * 2 - 1) * spread
    v = torch.randn(2, L, C, generator=generator, dtype=torch.float64)
    w = torch.exp(torch.linspace(-8, 4, C, dtype=torch.float64))  # 3e-4 (no decay) .. 55 (gone in a step)
    u = torch.linspace(-3, 3, C, dtype=torch.float64)
    return (t.to(dtype) for t in (w, u, k, v))


MODES = {"quadratic": wkv.wkv_quadratic, "chunk": lambda w, u, k, v: wkv.wkv_chunk(w, u, k, v, 4),
         "chunk-8": lambda w, u, k, v: wkv.wkv_chunk(w, u, k, v, 8),
         "recurrent": lambda w, u, k, v: wkv.wkv_recurrent(w, u, k, v)[0]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("L", [1, 7, 13])
def test_every_mode_is_the_definition_in_float64_with_gradients(mode, L):
    w, u, k, v = _inputs(L, 6, spread=5.0)
    for t in (w, u, k, v):
        t.requires_grad_(True)
    ours, reference = MODES[mode](w, u, k, v), _definition(w, u, k, v)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad(ours, (w, u, k, v), cotangent, allow_unused=True, materialize_grads=True),
                    torch.autograd.grad(reference, (w, u, k, v), cotangent, allow_unused=True,
                                        materialize_grads=True)):  # one position: w is not read
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_keys_whose_exponential_overflows_float32_stay_exact_in_float32(mode):
    """Keys to ±80 (e^80 > float32's largest): every mode is within 2e-5 of the float64 definition (float32's
    rounding of logits near 80 is 1e-5 absolute, which the softmax turns into as much relative error), no NaN."""
    w, u, k, v = _inputs(21, 6, spread=80.0, dtype=torch.float32, seed=1)
    ours = MODES[mode](w, u, k, v)
    reference = _definition(w, u, k, v)
    assert torch.isfinite(ours).all()
    assert (ours.double() - reference).abs().max() < 2e-5


def test_the_recurrent_state_continues_a_sequence_and_final_state_is_its_end():
    w, u, k, v = _inputs(11, 5, spread=10.0)
    whole, end = wkv.wkv_recurrent(w, u, k, v)
    first, state = wkv.wkv_recurrent(w, u, k[:, :4], v[:, :4])
    rest, after = wkv.wkv_recurrent(w, u, k[:, 4:], v[:, 4:], state)
    assert torch.allclose(torch.cat([first, rest], 1), whole, rtol=0, atol=1e-13)
    for a, b in zip(wkv.final_state(w, k, v), end):  # the same sums, however normalised
        assert a.shape == b.shape
    numerator, denominator, top = wkv.final_state(w, k, v)
    assert torch.allclose(numerator * torch.exp(top), end[0] * torch.exp(end[2]), rtol=1e-12)
    assert torch.allclose(denominator * torch.exp(top), end[1] * torch.exp(end[2]), rtol=1e-12)


def _model(*layers, **fields):
    torch.manual_seed(0)
    blocks = [{"mixer": {"kind": "rwkv", "width": 12, "chunk_size": 4}, "mlp": "none", "norm": "layernorm"},
              {"mixer": {"kind": "rwkv_channel", "hidden": 24}, "mlp": "none", "norm": "layernorm"}]
    spec = {"name": "rwkv", "input": {"kind": "tokens", "vocab_size": 50, "norm": "layernorm"}, "d_model": D,
            "max_len": 64, "dtype": "float64", "layers": list(layers) or blocks, **fields}
    model = attnspec.build(spec).eval()
    with torch.no_grad():  # off RWKV's initialisation, so that every μ, w and u counts
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def test_the_time_mixing_is_its_definition_forward_and_backward():
    mixer = _model().blocks[0].mixer
    x = torch.randn(2, 9, D, dtype=torch.float64, requires_grad=True)
    shifted = torch.cat([torch.zeros(2, 1, D, dtype=torch.float64), x[:, :-1]], 1)

    def lerp(mix):
        return x * mix + shifted * (1 - mix)

    k, v = mixer.key(lerp(mixer.time_mix_key)), mixer.value(lerp(mixer.time_mix_value))
    r = torch.sigmoid(mixer.receptance(lerp(mixer.time_mix_receptance)))
    reference = mixer.output(r * _definition(torch.exp(mixer.time_decay), mixer.time_first, k, v))
    cotangent = torch.randn_like(reference)
    inputs = (x, mixer.time_decay, mixer.time_first, mixer.time_mix_key)
    expected = torch.autograd.grad(reference, inputs, cotangent)
    for mode in ("chunk", "quadratic", "recurrent"):
        ours = mixer(x, mode)
        assert torch.allclose(ours, reference, rtol=0, atol=1e-12), mode
        for a, b in zip(torch.autograd.grad(ours, inputs, cotangent), expected):
            assert torch.allclose(a, b, rtol=0, atol=1e-10), mode


def test_the_channel_mixing_is_its_definition():
    mixer = _model().blocks[1].mixer
    x = torch.randn(2, 9, D, dtype=torch.float64)
    shifted = torch.cat([torch.zeros(2, 1, D, dtype=torch.float64), x[:, :-1]], 1)
    k_in = x * mixer.time_mix_key + shifted * (1 - mixer.time_mix_key)
    r_in = x * mixer.time_mix_receptance + shifted * (1 - mixer.time_mix_receptance)
    reference = torch.sigmoid(mixer.receptance(r_in)) * mixer.value(torch.relu(mixer.key(k_in)) ** 2)
    with torch.no_grad():
        assert torch.allclose(mixer(x), reference, rtol=0, atol=1e-13)


def test_the_output_at_a_position_reads_no_later_position():
    model = _model()
    tokens = torch.randint(0, 50, (1, 10))
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 50
    with torch.no_grad():
        assert torch.equal(model(tokens)[:, :6], model(changed)[:, :6])


@pytest.mark.parametrize("prompt", [1, 5])
def test_decoding_continues_the_full_pass(prompt):
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    assert_decodes_as_full_pass(_model(), tokens, prompt)


def test_the_compiled_step_and_the_compiled_chunks_neither_recompile_nor_differ():
    """The step: one graph for every position. The chunked mode: no graph after the first length's, for lengths 9, 13
    and 22."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model = _model()
    tokens = torch.randint(0, 50, (2, 22), generator=torch.Generator().manual_seed(2))
    assert_compiled_step_equals_full_pass(model, tokens[:, :8].contiguous())
    with torch.no_grad():
        full = model(tokens)
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
        first = None
        for L in (9, 13, 22):
            assert torch.allclose(compiled(tokens[:, :L].contiguous()), full[:, :L], rtol=0, atol=1e-9), L
            first = first or counter.frame_count  # (the first length's count: dynamo may trace it twice)
        assert counter.frame_count == first


def test_half_precision_keeps_the_decay_in_float32_and_follows_float32():
    model = _model()
    tokens = torch.randint(0, 50, (1, 9))
    half = attnspec.build({**model.spec.model_dump(mode="json"), "dtype": "bfloat16"})
    half.load_state_dict(model.state_dict())
    assert half.blocks[0].mixer.time_decay.dtype == torch.float32
    with torch.no_grad():
        assert (half.eval()(tokens).double() - model(tokens)).abs().max() < 0.1 * model(tokens).abs().max()


@pytest.mark.parametrize("mixer, where", [({"kind": "rwkv", "d_qk": 4}, "d_qk"),
                                          ({"kind": "rwkv", "position": {"kind": "rope"}}, "position"),
                                          ({"kind": "rwkv", "causal": False}, "causal"),
                                          ({"kind": "rwkv", "heads": 2}, "heads"),
                                          ({"kind": "rwkv", "chunk_size": 6}, "chunk_size"),
                                          ({"kind": "rwkv_channel", "qkv_bias": True}, "qkv_bias")])
def test_impossible_rwkv_mixers_are_located_errors(mixer, where):
    with pytest.raises(SpecError, match=f"layers\\[0\\].mixer.{where}"):
        _model({"mixer": mixer, "mlp": "none"})


def test_rwkv_init_follows_its_first_layer():
    built = attnspec.build({"name": "r", "input": {"kind": "tokens", "vocab_size": 5}, "d_model": 8, "max_len": 8,
                            "layers": [{"mixer": {"kind": "rwkv", "width": 5}, "mlp": "none"}]}).blocks[0].mixer
    assert torch.allclose(built.time_decay, -5 + 8 * (torch.arange(5.0) / 4) ** 0.7)
    assert torch.allclose(built.time_first, math.log(0.3) + ((torch.arange(5.0) + 1) % 3 - 1) * 0.5)
    assert torch.allclose(built.time_mix_receptance, (torch.arange(8.0) / 8) ** 0.5)
