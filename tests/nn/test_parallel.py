"""Parallel branches (``kind: parallel``): the block's mixer is the weighted sum of whole mixers of other
families on the same input, held to those mixers built alone (the same weights loaded) in every mode,
forward and backward, through decoding, and planned, resolved and refused like a block's own mixer.
Tolerance 1e-12: float64, the same operations in the same order but for one sum."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.nn.model import build_model_from_spec
from attnspec.spec import load_spec
from attnspec.spec.emit import spec_to_data

MAMBA2 = {"kind": "linear", "heads": 4, "d_qk": 6, "d_v": 8, "qk_groups": 2, "feature_map": "identity",
          "normalize": False, "transition": {"kind": "mamba", "scale_input": True}, "skip": True,
          "conv": {"kind": "short", "projections": ["q", "k", "v"], "activation": "silu"},
          "group_norm": True, "norm_span": "group", "output_gate": "swish", "chunk_size": 8}
ATTENTION = {"kind": "softmax", "heads": 2, "kv_heads": 1, "position": "rope"}


def _spec(mixer: dict, **extra) -> dict:
    return {"name": "parallel", "dtype": "float64", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 16,
            "max_len": 64, "layers": [{"mixer": mixer, "norm": "rmsnorm", "mlp": "none"}], **extra}


def _parallel(weights=(0.5, 2.0)):
    torch.manual_seed(0)
    return build_model_from_spec(load_spec(_spec({"kind": "parallel", "branches": [MAMBA2, ATTENTION],
                                                  "weights": list(weights)})))


def test_a_parallel_mixer_is_the_weighted_sum_of_its_branches_built_alone_in_every_mode():
    model = _parallel()
    mixer = model.blocks[0].mixer
    alone = [build_model_from_spec(load_spec(_spec(branch))).blocks[0].mixer for branch in (MAMBA2, ATTENTION)]
    for single, branch in zip(alone, mixer.branches):
        single.load_state_dict(branch.state_dict())
    x = torch.randn(2, 21, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert mixer.modes == ("chunk", "recurrent", "scan", "quadratic")
    for mode in mixer.modes:
        expected = 0.5 * alone[0](x, mode) + 2.0 * alone[1](x, "quadratic")
        out = mixer(x, mode)
        assert (out - expected).abs().max() < 1e-12, mode
        (grad,) = torch.autograd.grad(out.pow(2).sum(), x)
        (wanted,) = torch.autograd.grad(expected.pow(2).sum(), x)
        assert (grad - wanted).abs().max() < 1e-10, mode


def test_the_plan_s_mode_reaches_each_branch_that_has_it_and_a_forced_branch_keeps_its_own():
    model = build_model_from_spec(load_spec(_spec({"kind": "parallel", "branches": [
        {**MAMBA2, "mode": "scan"}, {"kind": "linear", "heads": 2}, ATTENTION]})))
    mixer = model.blocks[0].mixer
    model.set_modes(["chunk"])
    assert [branch.mode for branch in mixer.branches] == ["scan", "chunk", "quadratic"]


def test_decoding_continues_the_prefill_with_both_states():
    model = _parallel().eval()
    tokens = torch.randint(0, 16, (2, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :7])
        assert len(state) == 1 + sum(model.blocks[0].mixer.state_counts)
        for t in range(7, 19):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10


def test_a_resolved_parallel_spec_states_each_branch_and_rebuilds_the_same_model():
    spec = load_spec(_spec({"kind": "parallel", "branches": [{"kind": "linear", "heads": 2}, ATTENTION]},
                           position="rope"))
    branches = spec.layers[0].mixer.branches
    assert [(b.d_qk, b.d_v, b.position.kind) for b in branches] == [(8, 8, "rope"), (8, 8, "rope")]
    again = load_spec(spec_to_data(spec))
    assert again == spec
    tokens = torch.randint(0, 16, (1, 9))
    torch.manual_seed(0)
    first = attnspec.build(spec)
    torch.manual_seed(0)
    assert torch.equal(first(tokens), attnspec.build(again)(tokens))


@pytest.mark.parametrize("mixer, where", [
    ({"kind": "parallel", "branches": [{"kind": "none"}, ATTENTION]}, r"branches\[0\]\.kind"),
    ({"kind": "parallel", "branches": [{"kind": "linear", "heads": 3}, ATTENTION]}, r"branches\[0\]\.heads"),
    ({"kind": "parallel", "branches": [{"kind": "linear", "causal": False}, ATTENTION]}, r"branches\[0\]\.causal"),
    ({"kind": "parallel", "branches": [MAMBA2, ATTENTION], "weights": [1.0, 2.0, 3.0]}, r"mixer\.weights"),
    ({"kind": "parallel", "branches": [MAMBA2, ATTENTION], "heads": 2}, r"mixer\.heads"),
])
def test_what_a_parallel_mixer_cannot_be_is_a_located_error(mixer, where):
    with pytest.raises(SpecError, match=where):
        load_spec(_spec(mixer))


def test_one_edit_swaps_a_branch_s_family_dropping_the_fields_the_new_one_lacks():
    relu = {"kind": "linear", "heads": 2, "feature_map": "relu"}
    spec = load_spec(_spec({"kind": "parallel", "branches": [relu, ATTENTION]}),
                     ["layers[0].mixer.branches[0].kind=softmax"])
    assert [branch.kind for branch in spec.layers[0].mixer.branches] == ["softmax", "softmax"]
