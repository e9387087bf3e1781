"""Mamba-1's selective scan (``kind: mamba``) against its defining recurrence, written out here in float64
from the module's own parameters (not through attnspec's linear-attention ops, which every mode uses):

    h_t[c] = exp(Δ_t[c] A[c]) ⊙ h_(t-1)[c] + Δ_t[c] x_t[c] B_t,   y_t[c] = C_t · h_t[c] + D[c] x_t[c]

Every mode, outputs and gradients, an odd length across several chunks, gates near 0 and 1, and the
decoding step continuing a prefill. transformers' own MambaMixer is the outside oracle in
tests/hf/test_interop.py (whole models, float32).

Tolerance: 1e-10 in float64; the modes sum the same products in other orders (chunk: log-space
pairwise decays from float64 cumulative sums), so they agree to ~1e-13 on outputs of size ~1.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnspec
from attnspec.errors import SpecError

D_MODEL, STATE, LENGTH = 12, 5, 37


def _model(selection_norm: str = "none", **mixer):
    spec = {"name": "mamba1", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": D_MODEL, "max_len": 64,
            "dtype": "float64", "layers": [{"mixer": {"kind": "mamba", "d_qk": STATE, "d_inner": 20, "dt_rank": 3,
                                                      "chunk_size": 8, "selection_norm": selection_norm, **mixer},
                                            "mlp": "none", "norm": "rmsnorm"}]}
    torch.manual_seed(0)
    model = attnspec.build(spec)
    with torch.no_grad():  # away from the initialisation, so every part moves the output
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def _reference(mixer, u: torch.Tensor) -> torch.Tensor:
    """The selective scan written out: a loop over positions, per channel, in float64."""
    x, z = mixer.in_proj(u).chunk(2, dim=-1)
    width = mixer.conv.filters["v"].shape[1]
    padded = F.pad(x, (0, 0, width - 1, 0))
    x = F.silu(sum(padded[:, j:j + x.shape[1]] * mixer.conv.filters["v"][:, j] for j in range(width))
               + mixer.conv.biases["v"])
    dt, b, c = mixer.x_proj(x).split([mixer.rank, mixer.state, mixer.state], dim=-1)
    dt, b, c = mixer._normalized(dt, "dt"), mixer._normalized(b, "B"), mixer._normalized(c, "C")
    dt = F.softplus(mixer.dt_proj(dt))  # (B, L, d_inner)
    A = -torch.exp(mixer.A_log)  # (d_inner, N)
    h = u.new_zeros(u.shape[0], mixer.channels, mixer.state)
    ys = []
    for t in range(u.shape[1]):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[:, :, None] * b[:, t, None, :]
        ys.append((h * c[:, t, None, :]).sum(-1) + mixer.D * x[:, t])
    return mixer.out_proj(torch.stack(ys, 1) * F.silu(z))


@pytest.mark.parametrize("selection_norm", ["none", "rms", "rmsnorm"])
def test_every_mode_computes_the_selective_scan_with_its_gradients(selection_norm):
    mixer = _model(selection_norm).blocks[0].mixer
    u = torch.randn(2, LENGTH, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = _reference(mixer, u)
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), list(mixer.parameters()))
    assert expected.abs().max() > 0.1
    for mode in mixer.modes:
        out = mixer(u, mode)
        assert (out - expected).abs().max() < 1e-10, mode
        grads = torch.autograd.grad(out.pow(2).sum(), list(mixer.parameters()))
        for (name, _), grad, want in zip(mixer.named_parameters(), grads, expected_grads):
            assert (grad - want).abs().max() < 1e-9 * max(1.0, float(want.abs().max())), (mode, name)


@pytest.mark.parametrize("dt_bias", [-30.0, 30.0])
def test_gates_near_one_and_near_zero_stay_exact(dt_bias):
    """Δ ~ 1e-13 (the state keeps everything, a ~ 1) and Δ ~ 30 (a ~ e^-30: the state forgets at once)."""
    mixer = _model().blocks[0].mixer
    with torch.no_grad():
        mixer.dt_proj.bias.fill_(dt_bias)
        mixer.dt_proj.weight.zero_()
    u = torch.randn(2, LENGTH, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected = _reference(mixer, u)
    for mode in mixer.modes:
        out = mixer(u, mode)
        assert torch.isfinite(out).all() and (out - expected).abs().max() < 1e-10, mode


@pytest.mark.parametrize("mode", ["chunk", "scan"])
def test_decoding_continues_the_prefill_as_the_full_pass(mode):
    """A prompt of 20 prefilled in ``mode`` (its final state and the convolution's window), then stepped."""
    model = _model()
    model.set_modes([mode])
    tokens = torch.randint(0, 16, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :20])
        assert (logits - full[:, :20]).abs().max() < 1e-10
        for t in range(20, LENGTH):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10, t


@pytest.mark.parametrize("field, value, words", [
    ("heads", 4, "d_inner"),
    ("d_v", 8, "one value"),
    ("causal", False, "causal: true"),
    ("conv", {"kind": "short", "projections": ["q", "v"]}, "projections: [v]"),
    ("output_gate", "sigmoid", "has no `output_gate`"),
    ("position", "rope", "remove `position`"),
])
def test_what_a_mamba_mixer_cannot_have_is_a_located_error(field, value, words):
    spec = {"name": "m", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 16, "max_len": 64,
            "layers": [{"mixer": {"kind": "mamba", field: value}}]}
    with pytest.raises(SpecError) as error:
        attnspec.build(spec)
    assert f"layers[0].mixer.{field}" in str(error.value) and words in str(error.value)
