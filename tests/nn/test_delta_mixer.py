"""The `delta` mixer kind (DeltaNet, Gated DeltaNet, KDA) inside a model: every mode computes the same
function, the decoding step continues the full pass, the Mamba-style gate (the `mamba` transition)
starts in its stated ranges, and the parts are validated like any mixer's. The op itself is tested in tests/ops/test_delta_rule.py."""

from __future__ import annotations

import math

import pytest
import torch

import attnspec
from attnspec.errors import SpecError

SPEC = {"name": "delta", "input": {"kind": "tokens", "vocab_size": 64}, "d_model": 32, "max_len": 64,
        "dtype": "float64", "layers": [{"mixer": {"kind": "delta", "heads": 2, "chunk_size": 16}}]}


def spec(**mixer):
    return {**SPEC, "layers": [{"mixer": {**SPEC["layers"][0]["mixer"], **mixer}}]}


HEAD_GATE = {"kind": "mamba", "per": "head"}
CHANNEL_GATE = {"kind": "mamba", "per": "channel"}


@pytest.mark.parametrize("mixer", [{}, {"transition": HEAD_GATE, "group_norm": True, "output_gate": "swish"},
                                   {"transition": CHANNEL_GATE, "beta": "2sigmoid"},
                                   {"transition": {**CHANNEL_GATE, "rank": 5}, "qk_groups": 1, "skip": True},
                                   {"transition": HEAD_GATE, "kv_heads": 1, "qk_norm": "rmsnorm"},
                                   {"transition": {"kind": "fixed", "init": "lru"}, "position": {"kind": "rope"}},
                                   {"transition": HEAD_GATE, "feature_map": {"kind": "l2norm", "activation": "silu"},
                                    "conv": {"kind": "short", "width": 4, "projections": ["q", "k", "v"],
                                             "activation": "silu", "bias": True}}])
def test_modes_agree_and_decoding_continues_the_full_pass(mixer):
    model = attnspec.build(spec(**mixer))
    tokens = torch.randint(0, 64, (2, 45), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = {mode: model(tokens, mode) for mode in ("recurrent", "chunk", "quadratic")}
        state = model.init_state(2)
        for t in range(tokens.shape[1]):
            logits, *state = model.step(tokens[:, t], *state)
    reference = outputs["recurrent"]
    for mode, out in outputs.items():
        assert torch.allclose(out, reference, rtol=0, atol=1e-10), mode
    assert torch.allclose(logits, reference[:, -1], rtol=0, atol=1e-10)
    assert all(t.shape[0] == 2 for t in state)  # constant size: (B, H, d_qk, d_v) and the convolutions' windows


def test_the_gate_starts_in_its_stated_ranges():
    model = attnspec.build(spec(transition={**CHANNEL_GATE, "a_init": [2.0, 4.0], "dt_init": [0.01, 0.02]}))
    mixer = model.blocks[0].mixer
    a = torch.exp(mixer.transition.A_log.detach())
    dt = torch.nn.functional.softplus(mixer.transition.dt_bias.detach())
    assert a.shape == (2 * 16,) and 2.0 <= float(a.min()) and float(a.max()) <= 4.0
    assert 0.01 - 1e-12 <= float(dt.min()) and float(dt.max()) <= 0.02 + 1e-12
    assert math.isclose(mixer.scale, 16 ** -0.5)  # 1/sqrt(d_qk), as flash-linear-attention's layers


@pytest.mark.parametrize("mixer, message", [
    ({"causal": False}, "needs `causal: true`"),
    ({"transition": {**CHANNEL_GATE, "a_init": [5.0, 1.0]}}, "low 5.0 above high 1.0"),
    ({"mode": "scan"}, "mode 'scan' is impossible"),
    ({"gate": "head"}, "gate"),
    ({"feature_map": "relu"}, "unit-norm keys.*use l2norm"),
    ({"transition": {"kind": "data"}}, "decay must be real"),
    ({"transition": {**HEAD_GATE, "scale_input": True}}, "no input for Δ_t to scale"),
    ({"qk_groups": 3}, "cannot be split into 3 equal groups"),
    ({"gate_before_norm": True}, "needs `group_norm: true`"),
])
def test_bad_delta_mixers_are_located_errors(mixer, message):
    with pytest.raises(SpecError, match=message):
        attnspec.build(spec(**mixer))
