"""Softmax attention's sliding window and grouped keys/values, and its decoding step over a key/value cache.

Against the float64 loop reference (ops/softmax/naive.py) at odd sizes, forward and backward (attention
sinks included: a logit per head in each softmax, as gpt-oss's eager attention appends it); the
cache step, run position by position, against the full pass (capacity max_len, and ring buffers of a
window: 1, 7, longer than the sequence); caches poisoned with NaN beyond the written positions; and
causality (and the window's reach) by autograd. Tolerances: float64 throughout; the modes differ
only in summation order, so 1e-12 relative to outputs of size ~1.
"""

from __future__ import annotations

import pytest
import torch

from attnspec.errors import ShapeError
from attnspec.ops.softmax import cache_of, empty_cache, softmax_attention, softmax_step
from attnspec.ops.softmax.naive import softmax_reference

B, H, DK, DV = 2, 4, 20, 12


def _inputs(L: int, kv_heads: int, decay: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, DK, dtype=torch.float64, generator=g)
    k = torch.randn(B, kv_heads, L, DK, dtype=torch.float64, generator=g)
    v = torch.randn(B, kv_heads, L, DV, dtype=torch.float64, generator=g)
    log_a = -torch.rand(B, H, L, dtype=torch.float64, generator=g) * 0.5 if decay else None
    return q, k, v, log_a


def _sinks() -> torch.Tensor:
    """A sink logit per head, around the scores' size (~4 here): each takes a real share of its softmax."""
    return torch.tensor([-1.0, 0.5, 2.0, 4.0], dtype=torch.float64)[:H]


def test_sinks_take_a_share_of_every_softmax():
    """A sink's weight is taken from the keys: a huge sink sends the output to 0, a very negative one gives
    plain attention."""
    q, k, v, _ = _inputs(9, H, False)
    plain = softmax_attention(q, k, v)
    assert (softmax_attention(q, k, v, sinks=torch.full((H,), -1e4, dtype=torch.float64)) - plain).abs().max() < 1e-12
    assert softmax_attention(q, k, v, sinks=torch.full((H,), 1e4, dtype=torch.float64)).abs().max() < 1e-12
    with pytest.raises(ShapeError, match="sinks"):
        softmax_attention(q, k, v, sinks=torch.zeros(H + 1, dtype=torch.float64))


@pytest.mark.parametrize("window", [None, 1, 7, 100])
@pytest.mark.parametrize("kv_heads", [1, 2, H])
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("softcap", [None, 1.5])  # scores here reach ~4: a cap of 1.5 bends most of them
@pytest.mark.parametrize("with_sinks", [False, True])
def test_window_and_grouped_keys_match_the_reference_with_gradients(window, kv_heads, decay, softcap, with_sinks):
    q, k, v, log_a = _inputs(63, kv_heads, decay)
    sinks = _sinks() if with_sinks else None
    leaves = [t.requires_grad_() for t in (q, k, v) + ((log_a,) if decay else ()) + ((sinks,) if with_sinks else ())]
    out = softmax_attention(q, k, v, log_a, window=window, softcap=softcap, sinks=sinks)
    expected = softmax_reference(q, k, v, log_a, window=window, softcap=softcap, sinks=sinks)
    assert (out - expected).abs().max() < 1e-12
    probe = torch.randn_like(out)
    grads = torch.autograd.grad((out * probe).sum(), leaves)
    expected_grads = torch.autograd.grad((expected * probe).sum(), leaves)
    for got, want in zip(grads, expected_grads):
        assert (got - want).abs().max() < 1e-11


@pytest.mark.parametrize("window", [None, 1, 7, 100])
@pytest.mark.parametrize("kv_heads", [1, 2, H])
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_the_cache_step_equals_the_full_pass_at_every_position(window, kv_heads, decay, softcap, with_sinks):
    L = 45
    q, k, v, log_a = _inputs(L, kv_heads, decay, seed=1)
    sinks = _sinks() if with_sinks else None
    full = softmax_attention(q, k, v, log_a, window=window, softcap=softcap, sinks=sinks)
    capacity = window if window is not None else 64  # a full cache: max_len >= L
    cache = empty_cache(B, H, kv_heads, kv_heads, capacity, DK, DV, torch.float64)
    cache = tuple(torch.full_like(t, float("nan")) for t in cache)  # unwritten slots must never leak
    for t in range(L):
        position = torch.full((B,), t, dtype=torch.long)
        o, cache = softmax_step(q[:, :, t], k[:, :, t], v[:, :, t], cache, position,
                                log_a=None if log_a is None else log_a[:, :, t], softcap=softcap, sinks=sinks)
        assert torch.isfinite(o).all()
        assert (o - full[:, :, t]).abs().max() < 1e-12, t
    assert all(t.shape[2] == capacity for t in cache)  # constant memory: the ring never grows


@pytest.mark.parametrize("length", [1, 5, 8, 13, 24])
def test_a_prefill_s_cache_holds_position_p_in_slot_p_mod_capacity_in_eager_and_exported_code(length):
    """cache_of against a loop: slot p % C holds position p for the last C positions, zeros in the slots
    no position reached; eager code (padding when L <= C) and an exported program with a dynamic length
    (one gather) agree at every length, the ring's wrap included (C = 8)."""
    capacity = 8
    t = torch.randn(2, 3, length, 4, dtype=torch.float64)
    expected = torch.zeros(2, 3, capacity, 4, dtype=torch.float64)
    for p in range(max(0, length - capacity), length):
        expected[:, :, p % capacity] = t[:, :, p]
    assert torch.equal(cache_of(t, capacity), expected)

    class _Cache(torch.nn.Module):
        def forward(self, t):
            return cache_of(t, capacity)

    example = torch.randn(2, 3, 17, 4, dtype=torch.float64)
    program = torch.export.export(_Cache(), (example,), dynamic_shapes=({2: torch.export.Dim("length", min=1, max=64)},),
                                  strict=False).module()
    assert torch.equal(program(t), expected)


class _Step(torch.nn.Module):
    def forward(self, q, k, v, keys, values, bias, position, log_a):
        o, _ = softmax_step(q, k, v, (keys, values, bias), position, log_a=log_a)
        return o


@pytest.mark.parametrize("window", [None, 7])
def test_the_step_reads_the_shortest_written_prefix_in_eager_exported_and_compiled_code(monkeypatch, window):
    """With reads from 4 slots up (4, 8, 16, 32, 64 for a full cache of 64), every read length the steps
    pass through equals the full pass, in eager code, in one exported program and in one compiled graph
    (``torch.cond`` picks the length by the position: no program per length, no recompile); rows at
    different positions read the longest's prefix, the other's unwritten slots (NaN) masked."""
    import attnspec.ops.softmax.cache as cache_module

    monkeypatch.setattr(cache_module, "MIN_READ", 4)
    capacity = window if window is not None else 64
    assert cache_module.read_lengths(64) == [4, 8, 16, 32, 64] and cache_module.read_lengths(4) == [4]
    L = 45
    q, k, v, log_a = _inputs(L, 2, True, seed=4)
    full = softmax_attention(q, k, v, log_a, window=window)
    lag = torch.tensor([0, 3])  # row 1 runs 3 positions ahead of row 0
    rows = torch.arange(B)
    eager = tuple(torch.full_like(t, float("nan")) for t in empty_cache(B, H, 2, 2, capacity, DK, DV, torch.float64))
    ahead = tuple(t[1:].clone() for t in eager)
    for t in range(3):  # row 1 decodes its first 3 positions alone
        softmax_step(q[1:, :, t], k[1:, :, t], v[1:, :, t], ahead, torch.tensor([t]), log_a=log_a[1:, :, t])
    for cache, row in zip(eager, ahead):
        cache[1:] = row
    traced, compiled_cache = tuple(t.clone() for t in eager), tuple(t.clone() for t in eager)
    args = (q[:, :, 0], k[:, :, 0], v[:, :, 0], *traced, lag, log_a[:, :, 0])
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(_Step(), args, dynamic_shapes=tuple({0: batch} for _ in args), strict=False).module()
    torch._dynamo.reset()
    compiled = torch.compile(_Step(), fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(L - 3):
            index = t + lag
            inputs = (q[rows, :, index], k[rows, :, index], v[rows, :, index])
            o, returned = softmax_step(*inputs, eager, index, log_a=log_a[rows, :, index])
            assert all(a is b for a, b in zip(returned, eager))  # written in place
            exported = program(*inputs, *traced, index, log_a[rows, :, index])
            from_graph = compiled(*inputs, *compiled_cache, index, log_a[rows, :, index])
            for row in range(B):
                assert (o[row] - full[row, :, int(index[row])]).abs().max() < 1e-12, (t, row)
            assert (exported - o).abs().max() < 1e-12, t
            assert (from_graph - o).abs().max() < 1e-12, t


def test_each_sequence_of_a_batch_decodes_at_its_own_position():
    L = 12
    q, k, v, _ = _inputs(L, 2, False, seed=2)
    full = softmax_attention(q, k, v, window=4)
    cache = empty_cache(B, H, 2, 2, 4, DK, DV, torch.float64)
    cache = tuple(torch.full_like(t, float("nan")) for t in cache)
    for t in range(L):
        position = torch.tensor([t, t])
        o, cache = softmax_step(q[:, :, t], k[:, :, t], v[:, :, t], cache, position)
        assert (o - full[:, :, t]).abs().max() < 1e-12
    lagging = empty_cache(B, H, 2, 2, 4, DK, DV, torch.float64)
    for t in range(L - 3):  # sequence 1 runs 3 positions ahead of sequence 0 in the same batch
        index = torch.tensor([t, t + 3])
        batch = torch.arange(B)
        o, lagging = softmax_step(q[batch, :, index], k[batch, :, index], v[batch, :, index], lagging, index)
        assert (o[0] - full[0, :, t]).abs().max() < 1e-12
        if t >= 3:  # sequence 1 wrote positions 3..t+3; from t = 3 on its window (4 positions) holds only those
            assert (o[1] - full[1, :, t + 3]).abs().max() < 1e-12


@pytest.mark.parametrize("window", [None, 5])
def test_causality_and_the_window_s_reach_by_autograd(window):
    L, i = 30, 17
    q, k, v, log_a = _inputs(L, 2, True, seed=3)
    for t in (q, k, v, log_a):
        t.requires_grad_()
    out = softmax_attention(q, k, v, log_a, window=window)
    grads = torch.autograd.grad(out[:, :, i].sum(), (k, v))
    for grad in grads:
        reach = grad.abs().sum(dim=(0, 1, 3))  # (L,)
        assert (reach[i + 1:] == 0).all()  # nothing from the future
        if window is not None:
            assert (reach[: i - window + 1] == 0).all() and (reach[i - window + 1: i + 1] > 0).all()


def test_bad_windows_and_head_counts_are_shape_errors():
    q, k, v, _ = _inputs(8, 3, False)
    with pytest.raises(ShapeError, match="H_kv dividing H"):
        softmax_attention(q, k, v)
    q, k, v, _ = _inputs(8, 2, False)
    for window in (0, -1, 2.5, True):
        with pytest.raises(ShapeError, match="window must be a positive int"):
            softmax_attention(q, k, v, window=window)
    with pytest.raises(ShapeError, match="window must be a positive int with causal=True"):
        softmax_attention(q, k, v, causal=False, window=4)
    cache = empty_cache(B, H, 2, 2, 4, DK, DV, torch.float64)
    with pytest.raises(ShapeError, match="must fit the cache"):
        softmax_step(q[:, :, 0], k[:, :1, 0], v[:, :, 0], cache, torch.zeros(B, dtype=torch.long))


def test_capped_scores_without_a_mask_and_in_half_precision_match_the_reference():
    """Non-causal capped attention against the float64 reference; in bfloat16 (inputs rounded first, scores and
    softmax in float32, the output rounded once) within 4 units of bfloat16's last place of the largest output."""
    q, k, v, _ = _inputs(37, 2, False, seed=3)
    expected = softmax_reference(q, k, v, causal=False, softcap=1.5)
    assert (softmax_attention(q, k, v, causal=False, softcap=1.5) - expected).abs().max() < 1e-12
    half = [t.to(torch.bfloat16) for t in (q, k, v)]
    rounded = softmax_reference(*(t.double() for t in half), causal=False, softcap=1.5)
    got = softmax_attention(*half, causal=False, softcap=1.5)
    assert got.dtype == torch.bfloat16
    assert (got.double() - rounded).abs().max() <= 4 * 2 ** -8 * rounded.abs().max()
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ShapeError, match="softcap"):
            softmax_attention(q, k, v, softcap=bad)
