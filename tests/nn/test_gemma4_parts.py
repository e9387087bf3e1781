"""The parts Gemma 4 brought, each held to its definition written out in float64: proportional RoPE (`proportional`:
the rotated pairs spread over the whole head at the head's own frequencies), value norms (`v_norm`), values taken
from the keys' projection (`values_from_keys`) and a learnt scalar on a block's output (`output_scale`); forward and
gradients, decoding equal to the full pass (eager and compiled), and their located errors."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.spec.walk import iter_blocks
from tests.nn.decoding import (assert_compiled_step_equals_full_pass, assert_decodes_as_full_pass,
                                assert_reads_no_later_position)

D, VOCAB = 24, 41


def _model(layers=1, block=None, **mixer):
    torch.manual_seed(0)
    mixer = {"kind": "softmax", "heads": 4, "kv_heads": 2, "d_qk": 8, "d_v": 8, **mixer}
    spec = {"name": "parts", "input": {"kind": "tokens", "vocab_size": VOCAB}, "d_model": D, "max_len": 40,
            "dtype": "float64", "layers": [{"mixer": mixer, "mlp": {"kind": "glu", "expansion": 2}, "norm": "rmsnorm",
                                            **(block or {})}] * layers}
    return attnspec.build(spec).eval()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention, query head h over key/value head h // (H / H_kv), scale d^-1/2, heads merged
    and projected by ``out``: q (B, H, L, d), k, v (B, H_kv, L, d)."""
    H, L, d = q.shape[1], q.shape[2], q.shape[3]
    group = H // k.shape[1]
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    heads = [(q[:, h] @ k[:, h // group].transpose(-1, -2) / d ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
             @ v[:, h // group] for h in range(H)]
    return torch.cat(heads, -1) @ out.T


def _heads(y: torch.Tensor, n: int) -> torch.Tensor:
    B, L, _ = y.shape
    return y.view(B, L, n, -1).transpose(1, 2)


def _rms(t: torch.Tensor, eps: float) -> torch.Tensor:
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("fraction, d_qk", [(0.25, 16), (0.5, 8), (1.0, 8)])
def test_proportional_rope_turns_the_first_pairs_of_a_whole_head_rope(fraction, d_qk):
    position = _model(position={"kind": "rope", "base": 50.0, "proportional": True, "rotary_fraction": fraction},
                      d_qk=d_qk, d_v=d_qk).blocks[0].mixer.position
    L, half, pairs = 9, d_qk // 2, int(fraction * d_qk) // 2
    q, k = torch.randn(2, 4, L, d_qk, dtype=torch.float64), torch.randn(2, 2, L, d_qk, dtype=torch.float64)
    expected = []
    for x in (q, k):  # channel i < pairs turns with channel i + d/2 by t / base^(2i/d); the rest stay
        y = x.clone()
        for i in range(pairs):
            angle = torch.arange(L, dtype=torch.float64) * 50.0 ** (-2 * i / d_qk)
            first, second = x[..., i], x[..., i + half]
            y[..., i], y[..., i + half] = first * angle.cos() - second * angle.sin(), second * angle.cos() + first * \
                angle.sin()
        expected.append(y)
    for got, want in zip(position.rotate(q, k), expected):
        assert torch.allclose(got, want, rtol=0, atol=1e-13)


def test_a_model_with_proportional_rope_decodes_as_its_full_pass():
    model = _model(2, position={"kind": "rope", "proportional": True, "rotary_fraction": 0.25}, d_qk=16, d_v=16)
    tokens = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    assert_decodes_as_full_pass(model, tokens, prompt=5)
    assert_compiled_step_equals_full_pass(model, tokens[:, :6])


@pytest.mark.parametrize("values_from_keys", [False, True])
def test_value_norms_and_values_from_keys_are_their_definition_forward_and_backward(values_from_keys):
    mixer = _model(v_norm=True, values_from_keys=values_from_keys, qk_norm="rmsnorm",
                   norm_eps=1e-5).blocks[0].mixer
    with torch.no_grad():
        for weight in mixer.qk_norm.values():
            weight.normal_(1.0, 0.3)
    assert (mixer.v_proj is None) == values_from_keys
    x = torch.randn(2, 10, D, dtype=torch.float64, requires_grad=True)
    q = _rms(_heads(x @ mixer.q_proj.weight.T, 4), 1e-5) * mixer.qk_norm["q"]
    raw_k = _heads(x @ mixer.k_proj.weight.T, 2)
    k = _rms(raw_k, 1e-5) * mixer.qk_norm["k"]
    v = _rms(raw_k if values_from_keys else _heads(x @ mixer.v_proj.weight.T, 2), 1e-5)  # no weight
    reference, ours = _attention(q, k, v, mixer.out_proj.weight), mixer(x)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    inputs = [x, mixer.k_proj.weight, mixer.qk_norm["k"]]
    for a, b in zip(torch.autograd.grad(ours, inputs, cotangent), torch.autograd.grad(reference, inputs, cotangent)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)
    assert_reads_no_later_position(mixer, 9, 5, D)


def test_value_norms_and_values_from_keys_decode_as_the_full_pass_and_show_in_explain():
    model = _model(2, v_norm=True, values_from_keys=True, position={"kind": "rope"}, window=4)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    assert_decodes_as_full_pass(model, tokens, prompt=5)
    assert_compiled_step_equals_full_pass(model, tokens[:, :7])
    node = next(iter(iter_blocks(model.spec, expand=True)))[1].mixer
    assert "v = k" in node.describe() and ("v_norm", "yes") in node.parts()


def test_an_output_scale_multiplies_the_blocks_output_and_learns():
    plain, scaled = _model(block={"norm_placement": "sandwich"}), _model(block={"norm_placement": "sandwich",
                                                                              "output_scale": True})
    scaled.load_state_dict({**plain.state_dict(), "blocks.0.output_scale": torch.tensor([0.7], dtype=torch.float64)})
    x = torch.randn(2, 9, D, dtype=torch.float64)
    assert torch.allclose(scaled.blocks[0](x), 0.7 * plain.blocks[0](x), rtol=0, atol=1e-13)
    gradient, = torch.autograd.grad(scaled.blocks[0](x).sum(), [scaled.blocks[0].output_scale])
    assert torch.allclose(gradient, plain.blocks[0](x).sum().reshape(1), rtol=1e-12)
    two = _model(2, block={"output_scale": True}, position={"kind": "rope"})
    with torch.no_grad():
        two.blocks[0].output_scale.fill_(1.3)
    tokens = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(3))
    assert_decodes_as_full_pass(two, tokens, prompt=4)


@pytest.mark.parametrize("mixer, path, words", [
    ({"values_from_keys": True, "d_v": 6}, "layers[0].mixer.values_from_keys", "set d_v = d_qk"),
    ({"values_from_keys": True, "qk_groups": 2, "kv_heads": None}, "layers[0].mixer.values_from_keys",
     "a value head per key head"),
    ({"position": {"kind": "rope", "proportional": True, "interleaved": True}}, "layers[0].mixer.position.proportional",
     "remove `interleaved`"),
    ({"position": {"kind": "rope", "proportional": True, "scaling": "yarn", "factor": 2.0, "original_max_len": 16}},
     "layers[0].mixer.position.proportional", "linear"),
])
def test_impossible_uses_are_located_errors(mixer, path, words):
    with pytest.raises(SpecError) as error:
        _model(**mixer)
    assert any(p.path == path and words in p.message for p in error.value.problems), \
        [(p.path, p.message) for p in error.value.problems]


@pytest.mark.parametrize("widths", [{"d_qk": 6}, {"d_v": 6}, {}])
def test_values_from_keys_with_one_width_set_take_it_for_both(widths):
    """Values are the keys: with ``values_from_keys`` the width set (``d_qk`` or ``d_v``) is both widths,
    as is d_model / heads where neither is; the model builds and runs (before, the unset one took
    d_model / heads and the build failed with an unlocated reshape error)."""
    model = _model(**{"d_qk": None, "d_v": None, **widths}, values_from_keys=True)
    node = next(iter(iter_blocks(model.spec, expand=True)))[1].mixer
    width = widths.get("d_qk", widths.get("d_v", D // 4))
    assert (node.d_qk, node.d_v) == (width, width)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    assert model(tokens).shape == (2, 9, VOCAB)
    assert_decodes_as_full_pass(model, tokens, prompt=4)
