"""A mixture of attention experts (`query_experts`, JetMoE's MoA): each token's queries and output projection come
from the top-k experts its router chooses, the keys and values shared. Held to the definition written out in float64
token by token, expert by expert, from the mixer's own weights (grouped keys within an expert, RoPE; forward and
gradients, the router's included), to causality, to decoding through the shared keys' cache (eager and compiled
without recompiles), and its located errors."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from tests.nn.decoding import (assert_compiled_step_equals_full_pass, assert_decodes_as_full_pass,
                                assert_reads_no_later_position)

D, E, TOP_K = 24, 4, 2
MIXER = {"kind": "softmax", "heads": 4, "kv_heads": 2, "d_qk": 6, "d_v": 5, "out_bias": True,
         "position": {"kind": "rope"}, "query_experts": {"experts": E, "top_k": TOP_K}}


def _model(layers: int = 1, **fields):
    torch.manual_seed(0)
    spec = {"name": "moa", "input": {"kind": "tokens", "vocab_size": 50}, "d_model": D, "max_len": 64,
            "dtype": "float64", "layers": [{"mixer": {**MIXER, **fields}}] * layers}
    return attnspec.build(spec).eval()


def _reference(mixer, x: torch.Tensor) -> torch.Tensor:
    """y_t = Σ_{e in top-k of W_r x_t} softmax(chosen logits)_e W_o^e Attn(RoPE(W_q^e x_t), K, V) + b, with expert
    e's query head h reading key head h // (heads / kv_heads)."""
    B, L, _ = x.shape
    H, kv, dk, dv = 4, 2, 6, 5
    keys = (x @ mixer.k_proj.weight.T).view(B, L, kv, dk).transpose(1, 2)
    values = (x @ mixer.v_proj.weight.T).view(B, L, kv, dv).transpose(1, 2)
    queries = (x @ mixer.q_proj.weight.T).view(B, L, E * H, dk).transpose(1, 2)
    queries, keys = mixer.position.rotate(queries, keys, 0)  # RoPE by position, whatever the head
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    logits = x @ mixer.router.weight.T  # (B, L, E)
    out = torch.zeros(B, L, D, dtype=x.dtype) + mixer.out_proj.bias
    for e in range(E):
        heads = []
        for h in range(H):
            scores = queries[:, e * H + h] @ keys[:, h // (H // kv)].transpose(-1, -2) * dk ** -0.5
            heads.append(scores.masked_fill(~causal, float("-inf")).softmax(-1) @ values[:, h // (H // kv)])
        expert_out = torch.cat(heads, -1) @ mixer.out_proj.weight[:, e * H * dv:(e + 1) * H * dv].T  # (B, L, D)
        top = logits.topk(TOP_K, dim=-1)
        chosen = (top.indices == e)
        gate = (torch.softmax(top.values, -1) * chosen).sum(-1, keepdim=True)  # 0 where e is not chosen
        out = out + gate * expert_out
    return out


def test_attention_experts_are_their_definition_forward_and_backward():
    mixer = _model().blocks[0].mixer
    x = torch.randn(2, 9, D, dtype=torch.float64, requires_grad=True)
    ours, reference = mixer(x), _reference(mixer, x)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    inputs = (x, mixer.router.weight, mixer.q_proj.weight, mixer.out_proj.weight)
    for a, b in zip(torch.autograd.grad(ours, inputs, cotangent), torch.autograd.grad(reference, inputs, cotangent)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)


def test_the_output_at_a_position_reads_no_later_position():
    assert_reads_no_later_position(_model().blocks[0].mixer, 9, 5, D)


@pytest.mark.parametrize("prompt", [1, 6])
def test_decoding_through_the_shared_keys_cache_continues_the_full_pass(prompt):
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    state = assert_decodes_as_full_pass(_model(layers=2), tokens, prompt)
    caches = [t for t in state if t.dim() == 4]  # keys and values (B, heads, C, d) of each layer
    assert caches and all(t.shape[1] == 2 for t in caches)  # the 2 shared key heads, not every expert's


def test_the_compiled_step_equals_the_full_pass_without_recompiling():
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    assert_compiled_step_equals_full_pass(_model(layers=2), tokens)


@pytest.mark.parametrize("fields, where", [({"query_experts": {"experts": 2, "top_k": 3}}, "query_experts.top_k"),
                                           ({"sinks": True}, "sinks"), ({"differential": True}, "differential"),
                                           ({"output_gate": "sigmoid"}, "output_gate")])
def test_impossible_attention_experts_are_located_errors(fields, where):
    with pytest.raises(SpecError, match=f"layers\\[0\\].mixer.{where}"):
        _model(**fields)
