"""Mamba2 exactly, against the truth: transformers' own Mamba2Mixer (its CPU torch path), with attnspec's
weights copied in, and Mamba2's parts in every mode and decoding step.

attnspec writes Mamba2 as linear attention with identity features, no normaliser, a `mamba`
transition with `scale_input` (Δ_t x_t), shared B/C (`qk_groups`), the D skip, a convolution with
bias and SiLU on x, B and C, and the gated norm RMSNorm(y silu(z)) over each group (specs/mamba2.yaml).
transformers packs z, xBC and dt into one in_proj and x, B, C into one conv1d; the copy below slices them.

Tolerance: transformers computes the scan in float32 (it casts its inputs), so the two agree to
float32 rounding: measured max |diff| 2.4e-7 on outputs of size ~1.9 (L = 50 and 130, chunk 16
and 64, every mode); the bound 2e-5 leaves 100x for the summation order of other machines, far
below a real difference (measured: dropping Δ from the input changes outputs by 1.5, dropping D by 1.8).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Mamba2Config
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

import attnspec
from tests.conftest import SPECS
from tests.nn.released import assert_every_mode_matches

D_MODEL, HEADS, HEAD_DIM, STATE, GROUPS = 16, 4, 8, 6, 2


def _spec(dtype: str = "float32", chunk_size: int = 16) -> dict:
    mixer = {"kind": "linear", "heads": HEADS, "d_qk": STATE, "d_v": HEAD_DIM, "qk_groups": GROUPS,
             "feature_map": "identity", "normalize": False, "scale": 1.0, "chunk_size": chunk_size,
             "transition": {"kind": "mamba", "per": "head", "scale_input": True},
             "conv": {"kind": "short", "width": 4, "projections": ["q", "k", "v"], "activation": "silu", "bias": True},
             "skip": True, "group_norm": True, "output_gate": "swish", "gate_before_norm": True, "norm_eps": 1e-5}
    return {"name": "mamba2", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": D_MODEL, "max_len": 256,
            "dtype": dtype, "layers": [{"mixer": mixer, "mlp": "none", "norm": "rmsnorm"}]}


def _transformers_mixer(mixer) -> Mamba2Mixer:
    """transformers' Mamba2Mixer holding the weights of attnspec's mixer."""
    config = Mamba2Config(hidden_size=D_MODEL, num_heads=HEADS, head_dim=HEAD_DIM, state_size=STATE, n_groups=GROUPS,
                          expand=HEADS * HEAD_DIM // D_MODEL, conv_kernel=4, use_conv_bias=True, use_bias=False,
                          chunk_size=mixer.chunk_size, layer_norm_epsilon=1e-5, num_hidden_layers=1)
    reference = Mamba2Mixer(config, layer_idx=0)
    conv = mixer.conv
    with torch.no_grad():  # in_proj rows: z | x | B | C | dt; conv1d channels: x | B | C
        reference.in_proj.weight.copy_(torch.cat([mixer.gate.weight, mixer.v_proj.weight, mixer.k_proj.weight,
                                                  mixer.q_proj.weight, mixer.transition.dt_proj.weight]))
        reference.conv1d.weight.copy_(torch.cat([conv.filters[name] for name in ("v", "k", "q")]).unsqueeze(1))
        reference.conv1d.bias.copy_(torch.cat([conv.biases[name] for name in ("v", "k", "q")]))
        reference.dt_bias.copy_(mixer.transition.dt_bias)
        reference.A_log.copy_(mixer.transition.A_log)
        reference.D.copy_(mixer.D)
        reference.norm.weight.copy_(mixer.norm_weight)
        reference.out_proj.weight.copy_(mixer.out_proj.weight)
    return reference.eval()


@pytest.mark.parametrize("length, chunk_size", [(50, 16), (130, 64)])
def test_the_mamba2_spec_computes_transformers_mamba2(length, chunk_size):
    torch.manual_seed(0)
    model = attnspec.build(_spec(chunk_size=chunk_size))
    mixer = model.blocks[0].mixer
    with torch.no_grad():  # a gate of some size, so the gated norm is not near zero everywhere
        mixer.transition.dt_bias.add_(torch.linspace(-1, 1, HEADS))
    reference = _transformers_mixer(mixer)
    assert_every_mode_matches(mixer, reference, length, D_MODEL)


def test_mamba2_modes_agree_in_float64_and_decoding_continues_the_full_pass():
    torch.manual_seed(0)
    model = attnspec.build(_spec("float64"))
    tokens = torch.randint(0, 32, (2, 63), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        outputs = {mode: model(tokens, mode) for mode in model.blocks[0].mixer.modes}
        state = model.init_state(2)
        for t in range(tokens.shape[1]):
            logits, *state = model.step(tokens[:, t], *state)
    reference = outputs["recurrent"]
    for mode, out in outputs.items():
        assert (out - reference).abs().max() < 1e-10, mode
    assert (logits - reference[:, -1]).abs().max() < 1e-10


def test_the_shipped_mamba2_spec_is_mamba2_at_its_widths():
    spec = attnspec.load_spec(SPECS[0].parent / "mamba2.yaml")
    mixer = spec.layers[0].layers[0].mixer
    assert mixer.heads * mixer.d_v == 2 * spec.d_model  # d_inner = expand * d_model
    assert (mixer.qk_groups, mixer.skip, mixer.gate_before_norm, mixer.transition.scale_input) == (1, True, True, True)


def test_a_clamped_step_is_the_softplus_clamped_in_every_mode():
    """`dt_min`/`dt_max` (Mamba2's time_step_limit, Nemotron-H's time_step_min): Δ = clamp(softplus(.)),
    the decay and the scaled input both read the clamped Δ, and every mode agrees on it in float64."""
    spec = _spec("float64")
    spec["layers"][0]["mixer"]["transition"].update(dt_min=0.05, dt_max=0.08)
    torch.manual_seed(0)
    mixer = attnspec.build(spec).blocks[0].mixer
    transition = mixer.transition
    x = torch.randn(2, 40, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    raw = torch.nn.functional.softplus(transition.dt_proj(x) + transition.dt_bias).transpose(1, 2).unsqueeze(-1)
    assert (raw < 0.05).any() and (raw > 0.08).any()  # both bounds bite
    assert torch.equal(transition.input_scale(x), raw.clamp(0.05, 0.08))
    with torch.no_grad():
        outputs = {mode: mixer(x, mode) for mode in mixer.modes}
    for mode, out in outputs.items():
        assert (out - outputs["recurrent"]).abs().max() < 1e-10, mode
