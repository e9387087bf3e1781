"""Chunked attention (`chunk`, Llama 4's `attention_chunk_size`): each position attends to the earlier positions of its
own chunk, held to the definition written out in float64 (with gradients), through the decoding step's ring of one
chunk (eager and compiled, prompts ending anywhere in a chunk), packed documents (chunks counted from each document's
start), and its located errors."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.ops.documents import from_ids
from tests.nn.decoding import assert_compiled_step_equals_full_pass

CHUNK = 4
SPEC = {"name": "chunked", "input": {"kind": "tokens", "vocab_size": 50}, "d_model": 16, "max_len": 64,
        "dtype": "float64",
        "layers": [{"mixer": {"kind": "softmax", "heads": 2, "kv_heads": 1, "chunk": CHUNK,
                              "position": {"kind": "rope"}}}]}


def _model(**mixer):
    torch.manual_seed(0)
    layers = [{"mixer": {**SPEC["layers"][0]["mixer"], **mixer}}]
    return attnspec.build({**SPEC, "layers": layers}).eval()


def _reference(mixer, x: torch.Tensor) -> torch.Tensor:
    """Softmax over the pairs (t, s) with s <= t and s // CHUNK == t // CHUNK, from the mixer's own q, k, v."""
    q, k, v, _ = mixer._project(x)
    L = x.shape[1]
    t = torch.arange(L)
    allowed = (t.view(-1, 1) >= t.view(1, -1)) & (t.view(-1, 1) // CHUNK == t.view(1, -1) // CHUNK)
    scores = (q @ k.transpose(-1, -2) * mixer.scale).masked_fill(~allowed, float("-inf"))
    return mixer._output(scores.softmax(-1) @ v, x, v)


def test_chunked_attention_is_its_definition_forward_and_backward():
    mixer = _model().blocks[0].mixer
    x = torch.randn(2, 11, 16, dtype=torch.float64, requires_grad=True)
    ours, reference = mixer(x), _reference(mixer, x)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    assert torch.allclose(torch.autograd.grad(ours, x, cotangent)[0], torch.autograd.grad(reference, x, cotangent)[0],
                          rtol=0, atol=1e-10)
    # the chunks change the function: position 5 does not see position 3
    assert not torch.allclose(ours, _model(chunk=None).blocks[0].mixer(x))


@pytest.mark.parametrize("prompt", [1, 3, 4, 6])
def test_decoding_through_a_ring_of_one_chunk_continues_the_full_pass(prompt):
    """A prefill of ``prompt`` tokens (ending before, at and after a chunk's end), then a step per token across two
    chunk boundaries; the cache holds one chunk."""
    model = _model()
    tokens = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :prompt])
        assert any(t.dim() == 4 and t.shape[2] == CHUNK for t in state)  # keys (B, kv heads, one chunk, d)
        for t in range(prompt, 13):
            logits, *state = model.step(tokens[:, t], *state)
            assert torch.allclose(logits, full[:, t], rtol=0, atol=1e-10), t


def test_the_compiled_step_reads_its_chunk_without_recompiling():
    """One graph (fullgraph) serves every position, across two chunk boundaries, and equals the full pass."""
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    assert_compiled_step_equals_full_pass(_model(), tokens)


def test_packed_documents_count_chunks_from_each_document_s_start():
    mixer = _model().blocks[0].mixer
    x = torch.randn(1, 11, 16, dtype=torch.float64)
    with torch.no_grad():
        packed = mixer(x, documents=from_ids(torch.tensor([[0] * 5 + [1] * 6])))
        assert torch.allclose(packed[:, :5], mixer(x[:, :5]), rtol=0, atol=1e-12)
        assert torch.allclose(packed[:, 5:], mixer(x[:, 5:]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("fields, where", [({"window": 3}, "chunk"), ({"causal": False}, "chunk")])
def test_impossible_chunks_are_located_errors(fields, where):
    with pytest.raises(SpecError, match=f"layers\\[0\\].mixer.{where}"):
        _model(**fields)
