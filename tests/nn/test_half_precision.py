"""Every shipped spec's model under bfloat16 autocast (what `attnspec train --precision bfloat16` runs),
on every device present: finite, and close to the float32 model.

Autocast rounds the operands of every projection and feed-forward product to bfloat16 (unit roundoff
u = 2^-8); the attention ops take their inputs in bfloat16 and accumulate in float32 (their own
bounds are in tests/ops/test_dtypes.py). At the test widths (2-4 blocks) the output's relative RMS
error was 0.3-1.2% (hybrid the largest, 1.24%); the tolerance, 8u = 3.1%, is 2.5x that, far below
what a mixer summing its state over L = 200 positions in bfloat16 gives (up to L u = 78%).
"""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.compiler.tracing import example_input
from tests.compiler.conftest import small_overrides
from tests.conftest import DEVICES, SPECS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda path: path.stem)
def test_bfloat16_autocast_forward_and_backward(spec, device):
    model = attnspec.build(spec, *small_overrides(spec), device=device).train()
    inputs = example_input(model, 2, min(200, model.spec.max_len), torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(inputs)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = model(inputs)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    error = (out.float() - reference).pow(2).mean().sqrt() / reference.pow(2).mean().sqrt()
    assert error <= 8 * 2 ** -8, error.item()
    out.float().pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
