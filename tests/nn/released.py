"""Shared by the tests that hold attnspec's mixers to released models' own layers in transformers."""

from __future__ import annotations

import torch

BOUND = 2e-5
"""transformers computes these layers in float32: agreement to float32 rounding (measured 2e-7 to
1.5e-6 on outputs of size ~1, see each test's docstring), with room for other machines' summation order."""


def assert_every_mode_matches(mixer, reference, length: int, d_model: int) -> None:
    """``mixer`` (attnspec) in each of its modes against ``reference`` (transformers) on random inputs
    (2, length, d_model), outputs not near zero (so the comparison can fail)."""
    x = torch.randn(2, length, d_model, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(x)
        for mode in mixer.modes:
            assert (mixer(x, mode) - expected).abs().max() < BOUND, mode
    assert expected.abs().max() > 0.05
