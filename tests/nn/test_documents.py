"""Packed documents (:mod:`attnspec.ops.documents`): a row holding several documents computes each exactly as
if it ran alone, in every family and every mode, forward and backward; padding is a document, so a padded
row equals the unpadded sequence.

All in float64 at small widths. Outputs within 1e-10 and gradients within 1e-9 relative: packed and alone
differ in summation order only (chunk boundaries fall elsewhere, cumulative sums start earlier), measured
up to 4e-13 on outputs of size ~1 (mLSTM, Mamba-1, parallel and per-channel delta models, every mode).
"""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import ShapeError
from attnspec.ops.documents import (Documents, from_attention_mask, from_cu_seqlens, from_ids, from_starts,
                                    segment_cummax)
from tests.compiler.conftest import small_overrides
from tests.conftest import SPECS

ROWS = [[5, 1, 9, 6], [12, 9]]
"""Two rows of 21 positions: a one-token document, documents across chunk boundaries (chunk 8), one alone."""
LENGTH = 21

FAMILIES = {  # the families no shipped spec holds, each in a model of its own
    "mlstm": {"kind": "mlstm", "heads": 2, "d_qk": 6, "d_v": 5, "chunk_size": 8, "gate_softcap": 15.0,
              "conv": {"kind": "short", "projections": ["q", "k", "v"]}},
    "rglru": {"kind": "rglru", "heads": 3, "width": 12, "chunk_size": 8, "qkv_bias": True},
    "mla": {"kind": "mla", "heads": 3, "d_qk": 10, "d_v": 7, "kv_rank": 8, "q_rank": 6, "rope_dim": 4,
            "position": {"kind": "rope", "base": 100.0}},
    "mamba1": {"kind": "mamba", "d_qk": 4, "d_inner": 20, "dt_rank": 3, "chunk_size": 8},
    "gated_conv": {"kind": "gated_conv", "conv": {"kind": "short", "width": 3, "projections": ["v"]}},
    "parallel": {"kind": "parallel", "branches": [
        {"kind": "linear", "heads": 2, "chunk_size": 8, "transition": {"kind": "data", "per": "channel"}},
        {"kind": "softmax", "heads": 2, "position": {"kind": "rope"}}]},
    "delta-per-channel": {"kind": "delta", "heads": 2, "chunk_size": 8,
                          "transition": {"kind": "data", "per": "channel", "phase": "none"},
                          "conv": {"kind": "short", "projections": ["q", "k", "v"]}},
    "linear-non-causal": {"kind": "linear", "heads": 2, "causal": False, "feature_map": "elu1"},
    "softmax-non-causal": {"kind": "softmax", "heads": 2, "causal": False},
}


def _perturbed(model):
    """Weights moved off their initialisation, so zero-initialised parts (gates, skips) matter."""
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def _family_model(mixer: dict):
    spec = {"name": "documents", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 12, "max_len": 64,
            "dtype": "float64", "position": "learned",
            "layers": [{"mixer": mixer, "norm": "rmsnorm"}, {"mixer": mixer, "norm": "rmsnorm"}]}
    return _perturbed(attnspec.build(spec))


HEADS = {path: attnspec.build(path, *small_overrides(path)).spec for path in SPECS}
TOKEN_SPECS = [path for path, spec in HEADS.items() if spec.input.kind == "tokens"]


def _spec_model(path):
    model = attnspec.build(path, *small_overrides(path), "max_len=64", "dtype=float64")
    return _perturbed(model)


def _packing():
    """tokens (2, LENGTH), their Documents, and every document as (row, start, length)."""
    tokens = torch.randint(0, 16, (len(ROWS), LENGTH), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([torch.cat([torch.full((n,), d) for d, n in enumerate(row)]).unsqueeze(0) for row in ROWS])
    spans = []
    for r, row in enumerate(ROWS):
        start = 0
        for n in row:
            spans.append((r, start, n))
            start += n
    return tokens, from_ids(ids), spans


def _mixers(model):
    return [block.mixer for block in [*model.blocks, *model.shared_blocks.values()]]


def _assert_packed_equals_alone(model):
    """In every mode of every mixer (each mixer's i-th mode, for i up to the most any has), outputs and
    gradients of the packed rows equal those of each document run alone."""
    tokens, documents, spans = _packing()
    weights = torch.randn(len(ROWS), LENGTH, model.spec.input.vocab_size, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(4))
    mixers = _mixers(model)
    for i in range(max(len(mixer.modes) for mixer in mixers)):
        for mixer in mixers:
            mixer.mode = mixer.modes[min(i, len(mixer.modes) - 1)]
        model.zero_grad()
        packed = model(tokens, documents=documents)
        (packed * weights).sum().backward()
        packed_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        total = 0
        for r, start, n in spans:
            alone = model(tokens[r:r + 1, start:start + n])
            error = (packed[r, start:start + n] - alone[0]).detach().abs().max()
            assert error < 1e-10, (i, r, start, n, float(error))
            total = total + (alone[0] * weights[r, start:start + n]).sum()
        total.backward()
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            scale = p.grad.abs().max().clamp_min(1e-6)
            assert ((packed_grads[name] - p.grad).abs().max() / scale) < 1e-9, (i, name)
    assert packed.abs().max() > 0.1  # the comparison can fail


@pytest.mark.parametrize("path", TOKEN_SPECS, ids=lambda p: p.stem)
def test_packed_documents_compute_as_each_alone_in_every_shipped_spec(path):
    model = _spec_model(path)
    tokens, documents, _ = _packing()
    if HEADS[path].head.kind == "classifier":  # pooling over a row mixes its documents
        with pytest.raises(ShapeError, match="classifier head pools over the whole row"):
            model(tokens, documents=documents)
        return
    _assert_packed_equals_alone(model)


@pytest.mark.parametrize("name", FAMILIES)
def test_packed_documents_compute_as_each_alone_in_every_family(name):
    _assert_packed_equals_alone(_family_model(FAMILIES[name]))


def test_a_left_or_right_padded_row_equals_the_unpadded_sequence():
    model = _spec_model(next(path for path in SPECS if path.stem == "hybrid"))
    sequence = torch.randint(0, 16, (1, 13), generator=torch.Generator().manual_seed(5))
    alone = model(sequence)[0]
    pad = torch.zeros(1, 6, dtype=torch.long)
    ones, zeros = torch.ones(1, 13, dtype=torch.long), torch.zeros(1, 6, dtype=torch.long)
    for tokens, mask, where in ((torch.cat([pad, sequence], 1), torch.cat([zeros, ones], 1), slice(6, None)),
                                (torch.cat([sequence, pad], 1), torch.cat([ones, zeros], 1), slice(0, 13))):
        padded = model(tokens, documents=from_attention_mask(mask))[0, where]
        assert (padded - alone).abs().max() < 1e-10


def test_the_ways_to_say_where_documents_start_agree():
    by_ids = from_ids(torch.tensor([[7, 7, 3, 3, 3, 7]]))
    assert by_ids.ids.tolist() == [[0, 0, 1, 1, 1, 2]]
    assert by_ids.positions.tolist() == [[0, 1, 0, 1, 2, 0]]
    for other in (from_cu_seqlens([0, 2, 5, 6]), from_starts(torch.tensor([[False, False, True, False, False, True]]))):
        assert all(torch.equal(a, b) for a, b in zip(by_ids, other))


def test_segment_cummax_restarts_at_each_document():
    x = torch.randn(2, 3, 37, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    starts = torch.rand(2, 37, generator=torch.Generator().manual_seed(7)) < 0.2
    documents = from_starts(starts)
    expected = x.clone()
    for b in range(2):
        for t in range(1, 37):
            if not documents.starts[b, t]:
                expected[b, :, t] = torch.maximum(expected[b, :, t - 1], x[b, :, t])
    assert torch.equal(segment_cummax(x, documents.ids, 64), expected)


def test_documents_a_model_cannot_honour_are_refused_by_name():
    model = _spec_model(next(path for path in SPECS if path.stem == "hybrid"))
    tokens, documents, _ = _packing()
    with pytest.raises(ShapeError, match=r"documents.ids must be \(2, 20\)"):
        model(tokens[:, :20], documents=documents)
    with pytest.raises(ShapeError, match="Documents"):
        model(tokens, documents=documents.ids)
    with pytest.raises(ShapeError, match="cu_seqlens must rise strictly"):
        from_cu_seqlens([0, 3, 3, 5])
    for values, words in [([0, 2 ** 62], "past the longest sequence attnspec takes"),  # was an allocator error
                          ([0, 2 ** 70], "lengths up to"), ([0, 2.7, 8], "list of integers"),  # 2.7 was cut to 2
                          (torch.tensor([0.0, 3.0]), "must hold integers"), ([0, True, 3], "list of integers")]:
        with pytest.raises(ShapeError, match=words):
            from_cu_seqlens(values)
    assert from_cu_seqlens(torch.tensor([0, 3, 8])).ids.tolist() == from_cu_seqlens([0, 3, 8]).ids.tolist()
    model.blocks[0].mixer.takes_documents = False  # as a plugin family that has not said it takes them
    with pytest.raises(ShapeError, match="do not take packed documents"):
        model(tokens, documents=documents)
    assert isinstance(documents, Documents)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hybrid", "mlstm"])
def test_packed_documents_compile_in_one_graph_for_every_length(name):
    """fullgraph, one compilation serving two lengths and two packings, equal to eager."""
    if name in FAMILIES:
        model = _family_model(FAMILIES[name])
    else:
        model = _spec_model(next(path for path in SPECS if path.stem == name))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    tokens, documents, _ = _packing()
    shorter = from_ids(torch.tensor([[0] * 4 + [1] * 13, [0] * 17]))
    with torch.no_grad():
        for call, (inputs, packing) in enumerate(((tokens, documents), (tokens[:, :17].contiguous(), shorter))):
            with torch._dynamo.config.patch(error_on_recompile=call > 0):
                assert (compiled(inputs, documents=packing) - model(inputs, documents=packing)).abs().max() < 1e-10


def test_packed_documents_run_on_the_cpu_kernel_as_each_alone():
    """The C++ chunk kernel (float32 inference) takes the resets as decays: a decay-free linear mixer
    planned on it runs packed rows on it too, equal to each document alone to float32 rounding (1e-5 of
    outputs of size ~2; measured 5e-7)."""
    path = next(path for path in SPECS if path.stem == "linear-elu")
    model = attnspec.build(path, *small_overrides(path), "max_len=64").eval()
    for block in model.blocks:  # the mode the kernel runs (at max_len 64 the plan picks quadratic)
        block.mixer.mode = "chunk"
    mixer = model.blocks[0].mixer
    tokens, documents, spans = _packing()
    with torch.no_grad():
        q = torch.zeros(1, 1, 8, mixer.d_qk)
        assert mixer.kernel_for("chunk", q, q, q) == "native"
        packed = model(tokens, documents=documents)
        for r, start, n in spans:
            alone = model(tokens[r:r + 1, start:start + n])[0]
            assert (packed[r, start:start + n] - alone).abs().max() < 1e-5 * max(1.0, float(alone.abs().max()))
