"""Initialisation as spec data: each `init` field draws what it says, the head's scale multiplies the
logits, and a rebuilt model is the same model."""

from __future__ import annotations

import math

import pytest
import torch

import attnspec
from tests.conftest import ROOT

SPEC = ROOT / "specs" / "softmax-transformer.yaml"
SMALL = ["d_model=64", "layers[0].repeat=3", "max_len=32", "input.vocab_size=300"]


def _std(t: torch.Tensor) -> float:
    return float(t.detach().double().std())


def test_the_embedding_and_projections_take_the_stds_the_spec_names():
    model = attnspec.build(SPEC, *SMALL, "init.embedding_std=0.05", "init.projection_std=0.03")
    assert _std(model.embed.weight) == pytest.approx(0.05, rel=0.05)
    for block in model.blocks:
        for projection in (*block.mixer.projections(), *block.mlp.projections()):
            assert _std(projection.weight) == pytest.approx(0.03, rel=0.1)
            assert projection.bias is None or not projection.bias.any()


@pytest.mark.parametrize("distribution, bound", [("truncated_normal", 3.0), ("uniform", math.sqrt(3.0))])
def test_the_distribution_draws_the_embedding_and_projections_within_its_bound(distribution, bound):
    """Each distribution at its std: the std matches (truncated at 3 std keeps 0.986 of it) and no
    weight lies beyond the distribution's bound (a normal of 19,200 draws would pass 3 std ~50 times)."""
    model = attnspec.build(SPEC, *SMALL, f"init.distribution={distribution}", "init.embedding_std=0.05",
                           "init.projection_std=0.03")
    shrink = 0.986 if distribution == "truncated_normal" else 1.0
    assert _std(model.embed.weight) == pytest.approx(0.05 * shrink, rel=0.05)
    assert float(model.embed.weight.abs().max()) <= bound * 0.05 + 1e-7
    for projection in (*model.blocks[0].mixer.projections(), *model.blocks[0].mlp.projections()):
        assert _std(projection.weight) == pytest.approx(0.03 * shrink, rel=0.1)
        assert float(projection.weight.abs().max()) <= bound * 0.03 + 1e-7


def test_a_distribution_alone_redraws_the_embedding_at_std_1():
    model = attnspec.build(SPEC, *SMALL, "init.distribution=uniform")
    assert float(model.embed.weight.abs().max()) <= math.sqrt(3.0) + 1e-6
    assert _std(model.embed.weight) == pytest.approx(1.0, rel=0.05)


def test_residual_scaling_shrinks_what_writes_into_the_residual_stream():
    plain = attnspec.build(SPEC, *SMALL, "init.projection_std=0.02")
    scaled = attnspec.build(SPEC, *SMALL, "init.projection_std=0.02", "init.residual_scaling=true")
    shrink = 1 / math.sqrt(2 * 3)
    for a, b in zip(plain.blocks, scaled.blocks):
        assert _std(b.mixer.out_proj.weight) == pytest.approx(shrink * _std(a.mixer.out_proj.weight), rel=1e-6)
        assert _std(b.mlp.down.weight) == pytest.approx(shrink * _std(a.mlp.down.weight), rel=1e-6)
        assert torch.equal(a.mixer.q_proj.weight, b.mixer.q_proj.weight)


def test_the_mixers_init_scale_multiplies_a_drawn_projection_std():
    model = attnspec.build(SPEC, *SMALL, "init.projection_std=0.02", "blocks[*].mixer.init_scale=3")
    assert _std(model.blocks[0].mixer.k_proj.weight) == pytest.approx(0.06, rel=0.1)
    assert _std(model.blocks[0].mlp.up.weight) == pytest.approx(0.02, rel=0.1)


def test_pytorchs_initialisation_is_one_field_value_away():
    """embedding_std 1 and no projection_std draw nothing again: PyTorch's nn.Embedding N(0, 1) and
    nn.Linear defaults, the behaviour before initialisation was spec data."""
    model = attnspec.build(SPEC, *SMALL, "init.embedding_std=1.0", "head.scale=1.0")
    assert _std(model.embed.weight) == pytest.approx(1.0, rel=0.05)
    bound = 1 / math.sqrt(64)  # nn.Linear: uniform in +-1/sqrt(fan_in)
    assert float(model.blocks[0].mixer.q_proj.weight.abs().max()) <= bound
    assert _std(model.blocks[0].mixer.q_proj.weight) == pytest.approx(bound / math.sqrt(3), rel=0.1)


def test_the_head_scale_multiplies_the_logits():
    tokens = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    one = attnspec.build(SPEC, *SMALL, "head.scale=1.0")
    half = attnspec.build(SPEC, *SMALL, "head.scale=0.5")
    with torch.no_grad():
        torch.testing.assert_close(half(tokens), 0.5 * one(tokens), rtol=1e-6, atol=1e-6)


def test_the_default_starts_training_near_ln_vocab():
    """The default initialisation's first loss on random next tokens is within 1 nat of ln(vocab)
    (uniform predictions): logits of order 1, not the ~sqrt(d_model) an N(0, 1) tied head gives."""
    for overrides in (SMALL, ["input.vocab_size=512"]):
        model = attnspec.build(SPEC, *overrides)
        vocab = model.spec.input.vocab_size
        tokens = torch.randint(0, vocab, (8, 32), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        assert abs(float(loss) - math.log(vocab)) < 1.0, (overrides, float(loss))


def test_a_version_1_spec_keeps_its_unscaled_head():
    """Build and run directories written before the head's scale existed record `version: 1` and no
    scale: they load computing what they computed then."""
    old = attnspec.build(SPEC, *SMALL, "version=1")
    assert old.head_scale == 1.0 and attnspec.build(SPEC, *SMALL).head_scale == 1 / 64
