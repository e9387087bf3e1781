"""The gated short convolution (``kind: gated_conv``, LFM2's conv layers) against its definition written
out here in float64: out_t = W_out (c_t ⊙ sum_j w_j ⊙ (b ⊙ x)_(t-j) + bias), [b, c, x] = W_in u_t.
Also its gradient, its causality, and the decoding step continuing a prefill. transformers' Lfm2ShortConv
is the outside oracle in tests/hf/test_interop.py. Tolerance 1e-12: sums of a few products in float64."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError

D_MODEL, LENGTH = 8, 13


def _model():
    spec = {"name": "conv", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": D_MODEL, "max_len": 32,
            "dtype": "float64", "layers": [{"mixer": {"kind": "gated_conv", "qkv_bias": True, "out_bias": True,
                                                      "conv": {"kind": "short", "width": 4, "projections": ["v"],
                                                               "bias": True}},
                                            "mlp": "none", "norm": "rmsnorm"}]}
    torch.manual_seed(0)
    return attnspec.build(spec)


def _reference(mixer, u):
    b, c, x = mixer.in_proj(u).chunk(3, dim=-1)
    product, weight = b * x, mixer.conv.filters["v"]  # weight (d, width): column width - 1 reads position t
    width = weight.shape[1]
    h = torch.zeros_like(product) + mixer.conv.biases["v"]
    for t in range(u.shape[1]):
        for j in range(width):
            if t - j >= 0:
                h[:, t] = h[:, t] + weight[:, width - 1 - j] * product[:, t - j]
    return mixer.out_proj(c * h)


def test_it_is_the_gated_convolution_with_its_gradient_and_it_is_causal():
    mixer = _model().blocks[0].mixer
    u = torch.randn(2, LENGTH, D_MODEL, dtype=torch.float64, requires_grad=True)
    out, expected = mixer(u), _reference(mixer, u)
    assert (out - expected).abs().max() < 1e-12 and expected.abs().max() > 0.1
    grad, = torch.autograd.grad(out[:, 6].sum(), u)
    assert grad[:, 7:].abs().max() == 0 and grad[:, 3:7].abs().min() > 0  # sees positions 3..6 (width 4)


def test_decoding_continues_the_prefill():
    model = _model()
    tokens = torch.randint(0, 16, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :5])
        for t in range(5, LENGTH):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-12


@pytest.mark.parametrize("field, value", [("heads", 2), ("qk_norm", "rmsnorm"), ("causal", False),
                                          ("conv", {"kind": "shift"})])
def test_what_a_gated_convolution_cannot_have_is_a_located_error(field, value):
    spec = {"name": "m", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 16, "max_len": 64,
            "layers": [{"mixer": {"kind": "gated_conv", field: value}}]}
    with pytest.raises(SpecError, match=rf"layers\[0\]\.mixer\.{field}"):
        attnspec.build(spec)
