"""Differential attention (`differential: true`, Ye et al. 2024; transformers' DiffLlama): each pair of heads attends
with the difference of two softmax maps over one value head of twice the width. Held to the definition written out in
float64 from the mixer's own projection weights (grouped keys with g = 1, 2 and 3, causal and not, with gradients), to
causality, to the decoding cache (eager and compiled without recompiles, with a window), to λ_init's schedule over
depth, and its located errors."""

from __future__ import annotations

import math

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from tests.nn.decoding import (assert_compiled_step_equals_full_pass, assert_decodes_as_full_pass,
                                assert_reads_no_later_position)

D = 24
SPEC = {"name": "differential", "input": {"kind": "tokens", "vocab_size": 50}, "d_model": D, "max_len": 64,
        "dtype": "float64",
        "layers": [{"mixer": {"kind": "softmax", "heads": 4, "kv_heads": 2, "differential": True, "norm_eps": 1e-5,
                              "position": {"kind": "rope"}}}]}


def _model(layers: int = 1, **mixer):
    torch.manual_seed(0)
    block = {"mixer": {**SPEC["layers"][0]["mixer"], **mixer}}
    return attnspec.build({**SPEC, "layers": [block] * layers}).eval()


def _reference(mixer, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """The definition, in float64: query head 2gi + t and 2gi + g + t form pair (i, t), reading key heads 2i and
    2i + 1 and the value head [v_2i, v_2i+1] (the v projection's kv heads side by side);
    y = RMS((A_1 - λ A_2) V) (1 - λ_init) per pair, the pairs merged in order gi + t, then the output projection."""
    B, L, _ = x.shape
    H, d = mixer.heads, mixer.d_qk
    kv = mixer.k_heads
    g = H // kv
    q, k, _, _ = mixer._project(x, expand=False)  # rotated q (B, H, L, d), k (B, kv, L, d)
    units = (x @ mixer.v_proj.weight.T).view(B, L, kv, d).transpose(1, 2)  # (B, kv, L, d)
    lam_q1, lam_k1, lam_q2, lam_k2 = (mixer.lambdas[n].double() for n in ("lambda_q1", "lambda_k1", "lambda_q2",
                                                                           "lambda_k2"))
    lam_init = float(mixer.lambda_init)
    lam = torch.exp(lam_q1 @ lam_k1) - torch.exp(lam_q2 @ lam_k2) + lam_init
    allowed = torch.ones(L, L, dtype=torch.bool).tril() if causal else torch.ones(L, L, dtype=torch.bool)

    def attention_map(m):  # query head m's softmax over its key head m // g
        scores = q[:, m] @ k[:, m // g].transpose(-1, -2) * d ** -0.5
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1)

    pairs = []
    for i in range(kv // 2):
        value = torch.cat([units[:, 2 * i], units[:, 2 * i + 1]], -1)  # (B, L, 2d)
        for t in range(g):
            y = attention_map(2 * g * i + t) @ value - lam * (attention_map(2 * g * i + g + t) @ value)
            y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)
            pairs.append(y * (1 - lam_init))
    return mixer.out_proj(torch.cat(pairs, -1))


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4), (6, 2), (8, 4)])
@pytest.mark.parametrize("causal", [True, False])
def test_differential_attention_is_its_definition_forward_and_backward(heads, kv_heads, causal):
    mixer = _model(heads=heads, kv_heads=kv_heads, causal=causal, d_qk=4, d_v=4,
                   **({} if causal else {"position": {"kind": "none"}})).blocks[0].mixer
    with torch.no_grad():  # λ away from λ_init, so the learnt vectors count
        for weight in mixer.lambdas.values():
            weight.normal_(0, 0.5)
    x = torch.randn(2, 11, D, dtype=torch.float64, requires_grad=True)
    ours, reference = mixer(x), _reference(mixer, x, causal)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    inputs = (x, *mixer.lambdas.values(), mixer.q_proj.weight)
    for a, b in zip(torch.autograd.grad(ours, inputs, cotangent), torch.autograd.grad(reference, inputs, cotangent)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)


def test_the_output_at_a_position_reads_no_later_position():
    assert_reads_no_later_position(_model().blocks[0].mixer, 9, 6, D)


def test_lambda_init_follows_depth():
    """λ_init = 0.8 - 0.6 exp(-0.3 l) at block l (from 0): the paper's schedule, transformers' too."""
    model = _model(layers=3)
    for depth, block in enumerate(model.blocks):
        assert float(block.mixer.lambda_init) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * depth), abs=1e-15)
    assert "blocks.2.mixer.lambda_init" not in model.state_dict()  # a fixed function of depth, as ALiBi's slopes


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("prompt", [1, 5])
def test_decoding_through_the_cache_continues_the_full_pass(window, prompt):
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    assert_decodes_as_full_pass(_model(layers=2, window=window), tokens, prompt)


def test_the_compiled_step_equals_the_full_pass_without_recompiling():
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    assert_compiled_step_equals_full_pass(_model(layers=2), tokens)


@pytest.mark.parametrize("fields, where", [({"kv_heads": 1}, "differential"), ({"heads": 3, "kv_heads": None},
                                                                               "differential"),
                                           ({"group_norm": True}, "group_norm"),
                                           ({"output_gate": "sigmoid", "gate_per_head": True}, "gate_per_head")])
def test_impossible_differential_attention_is_a_located_error(fields, where):
    with pytest.raises(SpecError, match=f"layers\\[0\\].mixer.{where}"):
        _model(**fields)
