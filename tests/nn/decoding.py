"""Shared by the tests that hold a part's decoding to its full pass (a prefill then one step per token, eager and
compiled: fullgraph, one graph for every position) and its causality."""

from __future__ import annotations

import torch


def assert_decodes_as_full_pass(model, tokens: torch.Tensor, prompt: int, atol: float = 1e-10) -> list:
    """A prefill of ``prompt`` tokens (its last logits) then one step per token give the full pass's logits (float64
    models: ``atol`` is rounding). Returns the state the prefill left, for a test to inspect."""
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :prompt])
        prefilled = list(state)
        assert torch.allclose(logits[:, -1], full[:, prompt - 1], rtol=0, atol=atol)
        for t in range(prompt, tokens.shape[1]):
            logits, *state = model.step(tokens[:, t], *state)
            assert torch.allclose(logits, full[:, t], rtol=0, atol=atol), t
    return prefilled


def assert_compiled_step_equals_full_pass(model, tokens: torch.Tensor, atol: float = 1e-9) -> None:
    """``model.step`` compiled (fullgraph, static shapes) from an empty state, one token at a time: the full pass's
    logits, and one graph for every position (no recompile as the position grows)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    with torch.no_grad():
        full = model(tokens)
        step = torch.compile(model.step, fullgraph=True, dynamic=False, backend=counter)
        state = model.init_state(tokens.shape[0])
        for t in range(tokens.shape[1]):
            logits, *state = step(tokens[:, t], *state)
            assert torch.allclose(logits, full[:, t], rtol=0, atol=atol), t
    assert counter.frame_count == 1


def assert_reads_no_later_position(mixer, length: int, cut: int, width: int) -> None:
    """A causal mixer's outputs before position ``cut`` are unchanged when the inputs from ``cut`` on change
    (float64 inputs (1, length, width))."""
    x = torch.randn(1, length, width, dtype=torch.float64)
    changed = x.clone()
    changed[:, cut:] = torch.randn(1, length - cut, width, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(mixer(x)[:, :cut], mixer(changed)[:, :cut])
