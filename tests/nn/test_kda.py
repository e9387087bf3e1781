"""KDA against the truth: transformers' KimiLinearDeltaAttention (Kimi Linear's delta attention, its CPU
torch path) with attnspec's weights copied in.

attnspec writes KDA as a `delta` mixer with a `mamba` transition per key channel and a low-rank gate
projection (`rank`: Kimi's f_a/f_b), l2norm features, a SiLU short convolution, and per-head
RMSNorm then a sigmoid output gate (specs/kda.yaml). Kimi keeps one A per head and a low-rank output
gate (g_a, g_b); attnspec's A is per channel and its gate full rank, so the copy repeats A over each
head's channels and multiplies g_b g_a out: the same function.

Tolerance: transformers computes in float32; measured max |diff| 1.5e-6 on outputs of size ~1.0
(L = 50 and 130, every mode); the bound 2e-5 leaves 13x for other machines' summation order.
"""

from __future__ import annotations

import pytest
import torch
from transformers import KimiLinearConfig
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

import attnspec
from tests.nn.released import assert_every_mode_matches

D_MODEL, HEADS, HEAD_DIM = 16, 2, 8


def _spec(chunk_size: int) -> dict:
    mixer = {"kind": "delta", "heads": HEADS, "d_qk": HEAD_DIM, "d_v": HEAD_DIM, "chunk_size": chunk_size,
             "feature_map": "l2norm", "transition": {"kind": "mamba", "per": "channel", "rank": HEAD_DIM},
             "conv": {"kind": "short", "width": 4, "projections": ["q", "k", "v"], "activation": "silu"},
             "group_norm": True, "shared_norm_weight": True, "output_gate": "sigmoid", "norm_eps": 1e-5}
    return {"name": "kda", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": D_MODEL, "max_len": 256,
            "layers": [{"mixer": mixer}]}


def _kimi_layer(mixer) -> KimiLinearDeltaAttention:
    config = KimiLinearConfig(hidden_size=D_MODEL, num_hidden_layers=1, linear_head_dim=HEAD_DIM,
                              linear_num_heads=HEADS, linear_conv_kernel_dim=4, rms_norm_eps=1e-5,
                              layer_types=["linear_attention"], hidden_act="silu")
    layer = KimiLinearDeltaAttention(config, layer_idx=0)
    transition, filters = mixer.transition, mixer.conv.filters
    gate_rank = torch.linalg.qr(torch.randn(D_MODEL, HEAD_DIM, generator=torch.Generator().manual_seed(5)))[0]
    with torch.no_grad():
        for name in ("q", "k", "v"):
            getattr(layer, f"{name}_proj").weight.copy_(getattr(mixer, f"{name}_proj").weight)
        layer.conv1d.weight.copy_(torch.cat([filters["q"], filters["k"], filters["v"]]).unsqueeze(1))
        layer.forget_gate.f_a_proj.weight.copy_(transition.dt_proj[0].weight)
        layer.forget_gate.f_b_proj.weight.copy_(transition.dt_proj[1].weight)
        layer.forget_gate.dt_bias.copy_(transition.dt_bias)
        layer.forget_gate.A_log.copy_(transition.A_log.view(HEADS, HEAD_DIM)[:, 0].view(1, 1, HEADS, 1))
        layer.b_proj.weight.copy_(mixer.beta_proj.weight)
        # attnspec's full-rank gate W = g_b g_a: take g_a orthonormal rows, g_b = W g_aᵀ
        layer.g_a_proj.weight.copy_(gate_rank.T)
        layer.g_b_proj.weight.copy_(mixer.gate.weight @ gate_rank)
        layer.o_norm.weight.copy_(mixer.norm_weight)
        layer.o_proj.weight.copy_(mixer.out_proj.weight)
    return layer.eval()


@pytest.mark.parametrize("length, chunk_size", [(50, 16), (130, 64)])
def test_the_kda_spec_computes_kimi_linear_delta_attention(length, chunk_size):
    torch.manual_seed(0)
    model = attnspec.build(_spec(chunk_size))
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        # Kimi has one A per head: make attnspec's the same (its norm weight is shared like Kimi's), and
        # attnspec's full-rank output gate rank HEAD_DIM so a low-rank copy is exact
        per_head = mixer.transition.A_log.view(HEADS, HEAD_DIM)[:, :1].expand(HEADS, HEAD_DIM).reshape(-1).clone()
        mixer.transition.A_log.copy_(per_head)
        mixer.norm_weight.copy_(torch.linspace(0.5, 1.5, HEAD_DIM))
        gate_rank = torch.linalg.qr(torch.randn(D_MODEL, HEAD_DIM, generator=torch.Generator().manual_seed(5)))[0]
        mixer.gate.weight.copy_(mixer.gate.weight @ gate_rank @ gate_rank.T)
    reference = _kimi_layer(mixer)
    assert_every_mode_matches(mixer, reference, length, D_MODEL)
