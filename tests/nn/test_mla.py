"""Multi-head latent attention (``kind: mla``) against its definition written out here in float64: per
head, keys [W_UK c_t, RoPE(k^R_t)] and values W_UV c_t decompressed from the normalised latent, queries
[q^C, RoPE(q^R)], causal softmax. Interleaved RoPE is written as its own rotation of pairs (2i, 2i + 1).
Decoding (the absorbed form over a cache of the latent) continues a prefill as the full pass does.
transformers' DeepseekV3Attention is the outside oracle in tests/hf/test_interop.py.
Tolerance 1e-12: float64 sums of a few dozen products."""

from __future__ import annotations

import math

import pytest
import torch

import attnspec
from attnspec.errors import SpecError

HEADS, D_QK, D_V, RANK, Q_RANK, ROPE, BASE = 3, 10, 7, 8, 6, 4, 100.0


def _model(interleaved: bool):
    mixer = {"kind": "mla", "heads": HEADS, "d_qk": D_QK, "d_v": D_V, "kv_rank": RANK, "q_rank": Q_RANK,
             "rope_dim": ROPE, "position": {"kind": "rope", "base": BASE, "interleaved": interleaved}}
    spec = {"name": "mla", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 12, "max_len": 32,
            "dtype": "float64", "layers": [{"mixer": mixer, "mlp": "none", "norm": "rmsnorm"}]}
    torch.manual_seed(0)
    model = attnspec.build(spec)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def _rope(x, t, interleaved):
    """Rotate x (..., ROPE) at position t: pairs (i, i + ROPE/2), or (2i, 2i + 1) when interleaved."""
    out = x.clone()
    for i in range(ROPE // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + ROPE // 2)
        angle = t * BASE ** (-2 * i / ROPE)
        out[..., a] = x[..., a] * math.cos(angle) - x[..., b] * math.sin(angle)
        out[..., b] = x[..., a] * math.sin(angle) + x[..., b] * math.cos(angle)
    return out


def _reference(m, u, interleaved):
    rms = lambda t, w: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + m.norm_eps) * w  # noqa: E731
    B, L, _ = u.shape
    q = m.q_b_proj(rms(m.q_a_proj(u), m.q_norm)).view(B, L, HEADS, D_QK)
    c, k_rope = m.kv_a_proj(u).split([RANK, ROPE], -1)
    kv = m.kv_b_proj(rms(c, m.kv_norm)).view(B, L, HEADS, D_QK - ROPE + D_V)
    out = torch.zeros(B, L, HEADS, D_V, dtype=u.dtype)
    for t in range(L):
        for h in range(HEADS):
            qt = torch.cat([q[:, t, h, :D_QK - ROPE], _rope(q[:, t, h, D_QK - ROPE:], t, interleaved)], -1)
            keys = torch.stack([torch.cat([kv[:, s, h, :D_QK - ROPE], _rope(k_rope[:, s], s, interleaved)], -1)
                                for s in range(t + 1)], 1)
            weights = torch.softmax((keys @ qt.unsqueeze(-1)).squeeze(-1) * D_QK ** -0.5, -1)
            out[:, t, h] = (weights.unsqueeze(-1) * kv[:, :t + 1, h, D_QK - ROPE:]).sum(1)
    return m.out_proj(out.reshape(B, L, -1))


@pytest.mark.parametrize("interleaved", [False, True])
def test_latent_attention_is_its_definition_and_decodes_in_the_absorbed_form(interleaved):
    model = _model(interleaved)
    mixer = model.blocks[0].mixer
    u = torch.randn(2, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (mixer(u) - _reference(mixer, u, interleaved)).abs().max() < 1e-12
        tokens = torch.randint(0, 16, (2, 11), generator=torch.Generator().manual_seed(2))
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :4])
        assert state[1].shape[-1] == RANK + ROPE  # the cache holds the latent, not the heads' keys
        for t in range(4, 11):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-12


@pytest.mark.parametrize("field, value, words", [("position", {"kind": "alibi"}, "rope"), ("rope_dim", 3, "even"),
                                                 ("rope_dim", 16, "no channels"), ("kv_heads", 1, "no `kv_heads`")])
def test_what_latent_attention_cannot_have_is_a_located_error(field, value, words):
    mixer = {"kind": "mla", "heads": 2, "d_qk": 16, "kv_rank": 8, "rope_dim": 4, "position": "rope", field: value}
    spec = {"name": "m", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 16, "max_len": 64,
            "layers": [{"mixer": mixer}]}
    with pytest.raises(SpecError, match=words):
        attnspec.build(spec)
