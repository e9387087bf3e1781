"""DeepSeek Sparse Attention (`mla` with an `indexer`): each query attends to the `topk` earlier keys of highest index
score. Held to the definition written out in float64 from the mixer's own weights (the scores, the choice by sorting,
the attention over the chosen keys; forward and the input's gradient), to plain latent attention where every key is
chosen, to causality, to decoding (the indexer's keys cached beside the latent; eager and compiled without
recompiles), to packed documents, and its located errors."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.ops.documents import from_ids
from tests.nn.decoding import (assert_compiled_step_equals_full_pass, assert_decodes_as_full_pass,
                                assert_reads_no_later_position)

D, TOPK = 32, 3
MIXER = {"kind": "mla", "heads": 2, "d_qk": 12, "d_v": 8, "rope_dim": 4, "kv_rank": 10, "q_rank": 12,
         "position": {"kind": "rope", "interleaved": True},
         "indexer": {"heads": 16, "d_head": 8, "topk": TOPK}}
SPEC = {"name": "sparse", "input": {"kind": "tokens", "vocab_size": 50}, "d_model": D, "max_len": 64,
        "dtype": "float64", "layers": [{"mixer": MIXER}]}


def _model(layers: int = 1, **fields):
    torch.manual_seed(0)
    indexer = {**MIXER["indexer"], **fields.pop("indexer", {})}
    return attnspec.build({**SPEC, "layers": [{"mixer": {**MIXER, "indexer": indexer, **fields}}] * layers}).eval()


def _rotate_halves(t: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE on the first half/second half pairs of ``t`` (..., L, r) at ``positions`` (L,), in float64."""
    r = t.shape[-1]
    angles = positions.double().view(-1, 1) * base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-t[..., r // 2:], t[..., :r // 2]], -1)
    return t * cos + rotated * sin


def _reference(mixer, u: torch.Tensor) -> torch.Tensor:
    """The definition: I_t,s = Σ_h w_t,h ReLU(q^I_t,h · k^I_s / sqrt(d)), each query's top-k earlier keys by I (by a
    descending sort), softmax attention of the mixer's decompressed heads over those keys alone."""
    indexer = mixer.indexer
    B, L, _ = u.shape
    c_q = mixer._rms(mixer.q_a_proj(u), mixer.q_norm)
    q = (c_q @ indexer.wq_b.weight.T).view(B, L, indexer.heads, indexer.d_head).transpose(1, 2)
    k = torch.nn.functional.layer_norm(u @ indexer.wk.weight.T, (indexer.d_head,), indexer.k_norm.weight,
                                       indexer.k_norm.bias, 1e-6)
    positions, r = torch.arange(L), indexer.rope
    q = torch.cat([_rotate_halves(q[..., :r], positions), q[..., r:]], -1)
    k = torch.cat([_rotate_halves(k[..., :r], positions), k[..., r:]], -1)
    weights = u @ indexer.weights_proj.weight.T / indexer.heads ** 0.5  # (B, L, heads)
    scores = torch.einsum("bth,bhts->bts", weights, torch.relu(q @ k.unsqueeze(1).transpose(-1, -2)
                                                                / indexer.d_head ** 0.5))
    chosen = torch.zeros(B, L, L, dtype=torch.bool)
    for b in range(B):
        for t in range(L):
            order = torch.argsort(scores[b, t, :t + 1], descending=True)
            chosen[b, t, order[:indexer.topk]] = True
    q_nope, q_rope, c, k_rope, _ = mixer._project(u)
    kv = mixer.kv_b_proj(c).view(B, L, mixer.heads, -1).transpose(1, 2)
    keys = torch.cat([kv[..., :mixer.nope], k_rope.expand(-1, mixer.heads, -1, -1)], -1)
    logits = torch.cat([q_nope, q_rope], -1) @ keys.transpose(-1, -2) * mixer.scale
    attention = logits.masked_fill(~chosen.unsqueeze(1), float("-inf")).softmax(-1)
    return mixer.out_proj((attention @ kv[..., mixer.nope:]).transpose(1, 2).reshape(B, L, -1))


def test_sparse_attention_is_its_definition_forward_and_backward():
    mixer = _model().blocks[0].mixer
    u = torch.randn(2, 13, D, dtype=torch.float64, requires_grad=True)
    ours, reference = mixer(u), _reference(mixer, u)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    inputs = (u, mixer.kv_b_proj.weight, mixer.q_b_proj.weight)
    for a, b in zip(torch.autograd.grad(ours, inputs, cotangent), torch.autograd.grad(reference, inputs, cotangent)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)
    # the choice is not differentiable: the indexer's weights get no gradient from the output
    mixer(u).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in mixer.indexer.parameters())


def test_choosing_every_key_is_plain_latent_attention_and_fewer_change_the_function():
    u = torch.randn(1, 11, D, dtype=torch.float64)
    dense = attnspec.build({**SPEC, "layers": [{"mixer": {k: v for k, v in MIXER.items() if k != "indexer"}}]})
    with torch.no_grad():
        torch.manual_seed(0)
        everything = _model(indexer={"topk": 11}).blocks[0].mixer
        dense.blocks[0].mixer.load_state_dict({k: v for k, v in everything.state_dict().items()
                                               if not k.startswith("indexer.")})
        assert torch.allclose(everything(u), dense.blocks[0].mixer(u), rtol=0, atol=1e-12)
        assert not torch.allclose(_model().blocks[0].mixer(u), dense.blocks[0].mixer(u))


def test_the_output_at_a_position_reads_no_later_position():
    assert_reads_no_later_position(_model().blocks[0].mixer, 10, 7, D)


@pytest.mark.parametrize("prompt", [1, 4, 9])
def test_decoding_with_the_indexer_s_cache_continues_the_full_pass(prompt):
    tokens = torch.randint(0, 50, (2, 14), generator=torch.Generator().manual_seed(1))
    state = assert_decodes_as_full_pass(_model(layers=2), tokens, prompt)
    assert any(t.dim() == 3 and t.shape[-1] == 8 for t in state)  # the indexer's keys (B, C, d_head)


def test_the_compiled_step_equals_the_full_pass_without_recompiling():
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    assert_compiled_step_equals_full_pass(_model(layers=2), tokens)


def test_packed_documents_choose_within_their_own_document():
    mixer = _model().blocks[0].mixer
    u = torch.randn(1, 12, D, dtype=torch.float64)
    with torch.no_grad():
        packed = mixer(u, documents=from_ids(torch.tensor([[0] * 5 + [1] * 7])))
        assert torch.allclose(packed[:, :5], mixer(u[:, :5]), rtol=0, atol=1e-12)
        assert torch.allclose(packed[:, 5:], mixer(u[:, 5:]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("fields, where", [({"q_rank": None}, "indexer"), ({"causal": False}, "indexer"),
                                           ({"indexer": {"rope_dim": 3}}, "indexer.rope_dim"),
                                           ({"indexer": {"rope_dim": 10}}, "indexer.rope_dim")])
def test_impossible_indexers_are_located_errors(fields, where):
    with pytest.raises(SpecError, match=f"layers\\[0\\].mixer.{where}"):
        _model(**fields)
