"""Gated DeltaNet against the truth: transformers' Qwen3NextGatedDeltaNet (the linear-attention layer of
Qwen3-Next, its CPU torch path) with attnspec's weights copied in.

attnspec writes the layer as a `delta` mixer: l2norm features, a `mamba` transition per head, a short
SiLU convolution on q/k/v, q/k shared by groups of value heads (`qk_groups`: Qwen3-Next's
num_k_heads < num_v_heads), per-head RMSNorm then the SiLU gate. transformers packs q, k, v, z per
key head in in_proj_qkvz and b, a per key head in in_proj_ba, and shares one norm weight by every head.

Tolerance: transformers computes in float32 (its chunked delta rule casts); measured max |diff|
8.0e-7 on outputs of size ~1.0 at L = 50 and 130 in every mode (chunk, recurrent, quadratic); the
bound 2e-5 leaves 25x for other machines' summation order, far below a real difference.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

import attnspec
from tests.nn.released import assert_every_mode_matches

D_MODEL, V_HEADS, K_HEADS, DK, DV = 16, 4, 2, 8, 6


def _spec(chunk_size: int = 16) -> dict:
    mixer = {"kind": "delta", "heads": V_HEADS, "d_qk": DK, "d_v": DV, "qk_groups": K_HEADS, "chunk_size": chunk_size,
             "feature_map": "l2norm", "transition": {"kind": "mamba", "per": "head"},
             "conv": {"kind": "short", "width": 4, "projections": ["q", "k", "v"], "activation": "silu"},
             "group_norm": True, "shared_norm_weight": True, "output_gate": "swish", "norm_eps": 1e-6}
    return {"name": "gdn", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": D_MODEL, "max_len": 256,
            "layers": [{"mixer": mixer, "norm": "rmsnorm"}]}


def _per_key_head(*blocks: torch.Tensor) -> torch.Tensor:
    """Rows of several projections, interleaved per key head: [a_0, b_0, ..., a_1, b_1, ...]."""
    return torch.cat([part for group in zip(*(block.chunk(K_HEADS) for block in blocks)) for part in group])


def _transformers_layer(mixer) -> Qwen3NextGatedDeltaNet:
    config = Qwen3NextConfig(hidden_size=D_MODEL, linear_num_value_heads=V_HEADS, linear_num_key_heads=K_HEADS,
                             linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=4,
                             rms_norm_eps=1e-6, hidden_act="silu", num_hidden_layers=1,
                             layer_types=["linear_attention"])
    layer = Qwen3NextGatedDeltaNet(config, layer_idx=0)
    with torch.no_grad():
        layer.in_proj_qkvz.weight.copy_(_per_key_head(mixer.q_proj.weight, mixer.k_proj.weight, mixer.v_proj.weight,
                                                      mixer.gate.weight))
        layer.in_proj_ba.weight.copy_(_per_key_head(mixer.beta_proj.weight, mixer.transition.dt_proj.weight))
        filters = mixer.conv.filters
        layer.conv1d.weight.copy_(torch.cat([filters["q"], filters["k"], filters["v"]]).unsqueeze(1))
        layer.dt_bias.copy_(mixer.transition.dt_bias)
        layer.A_log.copy_(mixer.transition.A_log)
        layer.norm.weight.copy_(mixer.norm_weight)  # one weight shared by the heads, as attnspec's
        layer.out_proj.weight.copy_(mixer.out_proj.weight)
    return layer.eval()


@pytest.mark.parametrize("length, chunk_size", [(50, 16), (130, 64)])
def test_the_delta_mixer_computes_qwen3_next_gated_deltanet(length, chunk_size):
    torch.manual_seed(0)
    model = attnspec.build(_spec(chunk_size))
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        mixer.norm_weight.copy_(torch.linspace(0.5, 1.5, DV))  # not all ones
    reference = _transformers_layer(mixer)
    assert_every_mode_matches(mixer, reference, length, D_MODEL)
