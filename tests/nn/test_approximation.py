"""Approximate mixers against the exact computation they stand for, built from the shipped specs.

Mode-equivalence cannot catch a bug every mode shares (the Performer normaliser clamp, the biased
orthogonal projections), so each mechanism is compared here with its exact target, in float64:

* Performer features vs exact softmax attention (same spec, seed and weights, `exp` kernel), as the
  number of features grows, at d_qk = 16, 64, 128;
* Scatterbrain vs exact softmax as the sparse support grows (exact when it covers every pair), and
  vs Performer alone at the same number of features;
* cosFormer's linear form (Ptolemy split) vs its quadratic definition with cos(pi/2 (i-j)/M);
* normalised linear attention vs its explicit normalised quadratic form;
* the normaliser clamp acts on the true scale of the normaliser.

Errors are relative Frobenius norms of the mixer output, ||y - y_exact|| / ||y_exact||.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnspec
from attnspec.ops.features import random_projection
from attnspec.ops.linear import apply_normalizer
from tests.conftest import ROOT

SPECS = ROOT / "specs"

PERFORMER = SPECS / "performer.yaml"


def _one_block(spec, *overrides):
    """A float64 model of ``spec`` with one block (the first group's repeat set to 1)."""
    return attnspec.build(spec, "layers[0].repeat=1", *overrides).double()


def _inputs(L: int, rms: float, d_model: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, L, d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * rms


def _rel(y: torch.Tensor, exact: torch.Tensor) -> float:
    return ((y - exact).norm() / exact.norm()).item()


def performer_error(d_qk: int, features: int, rms: float, L: int = 256) -> float:
    """Relative error of the Performer mixer of specs/performer.yaml against exact softmax attention."""
    mixer = "layers[0].layers[0].mixer"
    common = (f"{mixer}.heads={128 // d_qk}", f"{mixer}.scale={d_qk ** -0.5!r}", "max_len=512")
    approx = _one_block(PERFORMER, *common, f"{mixer}.feature_map.num_features={features}")
    exact = _one_block(PERFORMER, *common, f"{mixer}.feature_map=exp")
    x = _inputs(L, rms)
    with torch.no_grad():
        return _rel(approx.blocks[0].mixer(x), exact.blocks[0].mixer(x))


@pytest.mark.parametrize("d_qk", [16, 64, 128])
def test_performer_mixer_approaches_softmax_as_features_grow(d_qk):
    # Mixer inputs of RMS 0.5: attention logits of std ~0.3, the regime in which FAVOR+ at 4096
    # features has a per-pair relative std of sqrt((e^|x_q + x_k|^2 - 1) / m) ~ 0.03 (the estimator's
    # own variance, not a tolerance). Before the normaliser fix every d_qk >= 32 gave 1.000.
    errors = [performer_error(d_qk, m, rms=0.5) for m in (256, 1024, 4096)]
    assert errors[2] <= 0.05, errors
    # Each 4x more features must cut the error by >= 1.3x: the 1/sqrt(m) rate gives 2x, measured
    # 1.65-2.3x. The biased orthogonal projections stalled (0.0284 -> 0.0284 at d_qk = 16).
    assert errors[0] > 1.3 * errors[1] and errors[1] > 1.3 * errors[2], errors


def test_performer_at_the_default_initialisation_scale():
    # Unit-RMS inputs (what a LayerNorm feeds the first block) give q, k entries of variance 1/3 and a
    # per-pair relative std of ~0.22 at 4096 features by the formula above; the mixer must be at that
    # level, not at 1.0 (the clamp) and not at 0.5 (the biased projections gave 0.028 -> 0.028 at d=16).
    errors = [performer_error(64, m, rms=1.0) for m in (1024, 4096)]
    assert errors[1] < 0.3 and errors[1] < 0.75 * errors[0], errors


def test_orthogonal_projection_directions_are_haar_distributed():
    # Without the sign fix of QR the first direction's first coordinate averages -0.2 at dim 16.
    firsts = []
    for seed in range(2000):
        w = random_projection(16, 16, orthogonal=True, seed=seed, dtype=torch.float64)
        firsts.append((w[0, 0] / w[0].norm()).item())
    values = torch.tensor(firsts)
    assert abs(values.mean().item()) < 5 * values.std().item() / math.sqrt(len(values))  # 5 sigma: 0.011
    w = random_projection(48, 16, orthogonal=True, seed=3, dtype=torch.float64)
    block = w[:16] / w[:16].norm(dim=-1, keepdim=True)
    assert torch.allclose(block @ block.T, torch.eye(16, dtype=torch.float64), atol=1e-12)


def test_clamp_acts_on_the_true_normaliser():
    # Stored normaliser 1e-17 with log scale 40: the true normaliser is 1e-17 * e^40 = 2.35, far above eps.
    out = torch.tensor([[3e-17, 1e-17]], dtype=torch.float64)
    scaled = apply_normalizer(out, 1e-6, torch.tensor([40.0], dtype=torch.float64))
    assert torch.allclose(scaled, torch.tensor([[3.0]], dtype=torch.float64))
    # A true normaliser below eps is clamped to eps: output = true numerator / eps.
    tiny = torch.tensor([[3e-30, 1e-30]], dtype=torch.float64)
    clamped = apply_normalizer(tiny, 1e-6, torch.tensor([10.0], dtype=torch.float64))
    assert torch.allclose(clamped, torch.tensor([[3e-30 * math.exp(10.0) / 1e-6]], dtype=torch.float64))
    # float32 and extreme log scales: never 0/0 or inf.
    extreme = apply_normalizer(torch.tensor([[1e-30, 0.0]]), 1e-6, torch.tensor([500.0]))
    assert torch.isfinite(extreme).all()


def test_performer_decoding_step_uses_the_same_normaliser():
    model = _one_block(PERFORMER, "layers[0].layers[0].mixer.heads=2", "max_len=64")
    tokens = torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        state = model.init_state(2)
        for t in range(20):
            logits, *state = model.step(tokens[:, t], *state)
    assert torch.allclose(logits, full[:, -1], rtol=1e-9, atol=1e-9)


def _copy_projections(source, target) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(target, name).load_state_dict(getattr(source, name).state_dict())


def scatterbrain_error(window: int, features: int, L: int = 256) -> tuple[float, float]:
    """(Scatterbrain error, Performer-alone error) against exact softmax, local support of ``window``."""
    mixer = "layers[0].layers[0].mixer"
    spec = SPECS / "scatterbrain.yaml"
    base = ("max_len=256", f"{mixer}.heads=2", f"{mixer}.budget=null")
    sb = _one_block(spec, *base, f"{mixer}.sparse={{kind: local, window: {window}}}",
                    f"{mixer}.lowrank={{kind: performer, num_features: {features}}}")
    exact = _one_block(PERFORMER, f"{mixer}.heads=2", "max_len=256", f"{mixer}.feature_map=exp",
                       f"{mixer}.scale={64 ** -0.5!r}")
    performer = _one_block(PERFORMER, f"{mixer}.heads=2", "max_len=256", f"{mixer}.scale={64 ** -0.5!r}",
                           f"{mixer}.feature_map.num_features={features}")
    _copy_projections(exact.blocks[0].mixer, sb.blocks[0].mixer)
    _copy_projections(exact.blocks[0].mixer, performer.blocks[0].mixer)
    x = _inputs(L, 1.0)
    with torch.no_grad():
        y = exact.blocks[0].mixer(x)
        return _rel(sb.blocks[0].mixer(x), y), _rel(performer.blocks[0].mixer(x), y)


def test_scatterbrain_is_exact_when_the_support_covers_every_pair():
    error, _ = scatterbrain_error(window=256, features=16)
    assert error <= 1e-12  # the sparse correction replaces every low-rank estimate by exp(q.k)


def test_scatterbrain_error_falls_as_the_support_grows_and_beats_performer_alone():
    results = [scatterbrain_error(window, features=64) for window in (16, 64, 128)]
    errors = [sb for sb, _ in results]
    assert errors[0] > errors[1] > errors[2], errors
    for sb, performer in results:  # the same random features, with exact values on the support
        assert sb < performer, results


def _explicit_linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sum_j w_ij phi(q_i).phi(k_j) v_j / sum_j w_ij phi(q_i).phi(k_j) for j <= i, from the O(L^2) scores."""
    scores = (q @ k.transpose(-1, -2)) * weight
    scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), 0.0)
    return (scores @ v) / scores.sum(-1, keepdim=True)


@pytest.mark.parametrize("spec_name", ["linear-elu", "cosformer"])
def test_linear_form_equals_the_quadratic_definition_in_every_mode(spec_name):
    model = _one_block(SPECS / f"{spec_name}.yaml", "max_len=128")
    mixer = model.blocks[0].mixer
    x = _inputs(63, 1.0, model.spec.d_model)
    q, k, v, _ = mixer._project(x)
    q = mixer.features(q, True)[0]
    k = mixer.features(k, False)[0]
    L = x.shape[1]
    if spec_name == "cosformer":  # weights cos(pi/2 (i - j) / M), 1-based positions
        i = torch.arange(1, L + 1, dtype=torch.float64)
        weight = torch.cos(math.pi / 2 * (i.view(-1, 1) - i.view(1, -1)) / mixer.reweighting.M)
    else:
        weight = torch.ones(L, L, dtype=torch.float64)
    with torch.no_grad():
        expected = mixer._output(_explicit_linear(q, k, v, weight), x)
        for mode in mixer.modes:
            assert torch.allclose(mixer(x, mode), expected, rtol=1e-10, atol=1e-12), mode
