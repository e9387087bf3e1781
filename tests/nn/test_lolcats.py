"""LoLCATs' mixer (Zhang et al. 2024, "LoLCATs: On Low-Rank Linearizing of Large Language Models") as a spec: softmax
attention over a sliding window beside linear attention over the positions before it, one normaliser, the softmax
terms weighted by a learnt factor per head and scaled by their row's maximum. Scatterbrain's sparse + low-rank split
expresses it with a `local` support, a `linear` low-rank part reading q and k unscaled, `sparse_weight` and
`sparse_scale: row_max`. Held to LoLCATs' definition written out in float64 (its quadratic form: the window's
w_h exp(s - max s) and the older positions' φ(q).φ(k), summed over one normaliser) in every mode, with gradients; to
causality; and its decoding to its full pass."""

from __future__ import annotations

import pytest
import torch

import attnspec
from tests.nn.decoding import assert_decodes_as_full_pass, assert_reads_no_later_position

D, WINDOW = 24, 4


def lolcats_mixer(feature_map: str = "elu1", **extra) -> dict:
    """The spec of LoLCATs' sliding-window + linear attention (LoLCATs' Hedgehog map is `hedgehog`, a plugin)."""
    return {"kind": "scatterbrain", "heads": 2, "d_qk": 6, "d_v": 5,
            "lowrank": {"kind": "linear", "feature_map": feature_map, "scaled_inputs": False},
            "sparse": {"kind": "local", "window": WINDOW}, "sparse_weight": True, "sparse_scale": "row_max", **extra}


def _model(layers: int = 1, **mixer):
    torch.manual_seed(0)
    spec = {"name": "lolcats", "input": {"kind": "tokens", "vocab_size": 37}, "d_model": D, "max_len": 32,
            "dtype": "float64", "layers": [{"mixer": lolcats_mixer(**mixer)}] * layers}
    return attnspec.build(spec).eval()


def _phi(x: torch.Tensor, kind: str) -> torch.Tensor:
    return torch.nn.functional.elu(x) + 1 if kind == "elu1" else torch.nn.functional.softplus(x)


def _reference(mixer, x: torch.Tensor, kind: str) -> torch.Tensor:
    """LoLCATs' hybrid attention, from its definition: for query i, the window W(i) = {j: i - W < j <= i} and the
    older positions O(i) = {j <= i - W};
        a_ij = sigmoid(w_h) exp(q_i.k_j / sqrt(d) - max_{j' in W(i)} q_i.k_j' / sqrt(d))  (j in W(i)),
        a_ij = φ(q_i).φ(k_j)                                                          (j in O(i)),
        y_i = sum_j a_ij v_j / sum_j a_ij,
    heads merged, then the output projection."""
    B, L, _ = x.shape
    H, d = 2, 6
    q = (x @ mixer.q_proj.weight.T).view(B, L, H, d).transpose(1, 2)
    k = (x @ mixer.k_proj.weight.T).view(B, L, H, d).transpose(1, 2)
    v = (x @ mixer.v_proj.weight.T).view(B, L, H, 5).transpose(1, 2)
    t = torch.arange(L)
    window = (t[None, :] <= t[:, None]) & (t[:, None] - t[None, :] < WINDOW)
    older = t[None, :] <= t[:, None] - WINDOW
    scores = (q @ k.transpose(-1, -2) / d ** 0.5).masked_fill(~window, float("-inf"))
    factor = torch.sigmoid(mixer.sparse_weight).view(1, H, 1, 1)
    soft = factor * torch.exp(scores - scores.amax(-1, keepdim=True))
    linear = (_phi(q, kind) @ _phi(k, kind).transpose(-1, -2)).masked_fill(~older, 0.0)
    weights = soft + linear
    y = (weights @ v) / weights.sum(-1, keepdim=True)
    return y.transpose(1, 2).reshape(B, L, H * 5) @ mixer.out_proj.weight.T


@pytest.mark.parametrize("kind", ["elu1", "softplus"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent", "quadratic"])
def test_the_spec_computes_lolcats_definition_in_every_mode_forward_and_backward(kind, mode):
    mixer = _model(feature_map=kind, chunk_size=4).blocks[0].mixer
    with torch.no_grad():
        mixer.sparse_weight.copy_(torch.tensor([-1.5, 0.7]))
    x = torch.randn(2, 13, D, dtype=torch.float64, requires_grad=True)
    ours, reference = mixer(x, mode), _reference(mixer, x, kind)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    inputs = (x, mixer.sparse_weight, mixer.q_proj.weight, mixer.k_proj.weight)
    for a, b in zip(torch.autograd.grad(ours, inputs, cotangent), torch.autograd.grad(reference, inputs, cotangent)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)


def test_the_window_factor_starts_at_lolcats_and_matters():
    mixer = _model().blocks[0].mixer
    assert torch.allclose(torch.sigmoid(mixer.sparse_weight), torch.full((2,), 0.1, dtype=torch.float64))
    x = torch.randn(1, 9, D, dtype=torch.float64)
    with torch.no_grad():
        before = mixer(x)
        mixer.sparse_weight.add_(2.0)
        assert (mixer(x) - before).abs().max() > 1e-3


def test_lolcats_reads_no_later_position_and_decodes_as_its_full_pass():
    assert_reads_no_later_position(_model().blocks[0].mixer, 11, 6, D)
    model = _model(2)
    tokens = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(1))
    assert_decodes_as_full_pass(model, tokens, prompt=5)
    assert "learnt sparse weights, row-max exact terms" in model.spec.layers[0].mixer.describe()
