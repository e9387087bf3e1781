"""Softmax attention (with decay bias) and Scatterbrain against explicit references."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnspec.ops import (
    Support, block_support, linear_attention, local_support, lsh_support, performer_features, random_projection,
    scatterbrain_attention, softmax_attention,
)
from attnspec.errors import ShapeError
from attnspec.ops.softmax.naive import softmax_reference


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("causal, decay", [(True, False), (False, False), (True, True)])
def test_softmax_matches_reference_forward_and_backward(causal, decay):
    q, k, v = (torch.randn(2, 3, 33, 6, dtype=torch.float64, requires_grad=True) for _ in range(3))
    log_a = torch.log(torch.rand(2, 3, 33, dtype=torch.float64) * 0.5 + 0.5).requires_grad_() if decay else None
    out = softmax_attention(q, k, v, log_a, causal=causal)
    expected = softmax_reference(q, k, v, log_a, causal=causal)
    assert rel(out, expected) <= 1e-10
    inputs = [q, k, v] + ([log_a] if decay else [])
    for got, want in zip(torch.autograd.grad(out.sum(), inputs), torch.autograd.grad(expected.sum(), inputs)):
        assert rel(got, want) <= 1e-10


def test_softmax_decay_needs_causal():
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ShapeError, match="causal"):
        softmax_attention(q, q, q, torch.zeros(1, 1, 4), causal=False)


def _performer(q, k, m=32, seed=0, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    W = random_projection(m, q.shape[-1], orthogonal=True, seed=seed, dtype=q.dtype)
    qf, log_scale = performer_features(q * math.sqrt(scale), W, query=True)
    kf, _ = performer_features(k * math.sqrt(scale), W, query=False)
    return qf, kf, log_scale, scale


@pytest.mark.parametrize("causal", [True, False])
def test_scatterbrain_with_all_pairs_is_softmax(causal):
    q, k, v = (torch.randn(1, 2, 45, 8, dtype=torch.float64) for _ in range(3))
    qf, kf, ls, scale = _performer(q, k)
    everything = local_support(45, 45 if causal else 90, causal=causal, batch=1, heads=2)
    out = scatterbrain_attention(q, k, v, qf, kf, everything, q_log_scale=ls, causal=causal, scale=scale)
    assert rel(out, softmax_reference(q, k, v, causal=causal, scale=scale)) <= 1e-12


@pytest.mark.parametrize("causal", [True, False])
def test_scatterbrain_with_empty_support_is_performer(causal):
    q, k, v = (torch.randn(1, 2, 45, 8, dtype=torch.float64) for _ in range(3))
    qf, kf, ls, scale = _performer(q, k)
    index = torch.zeros(1, 2, 45, 0, dtype=torch.long)
    out = scatterbrain_attention(q, k, v, qf, kf, Support(index, index.bool()), q_log_scale=ls, causal=causal,
                                 scale=scale, eps=1e-300)
    performer = linear_attention(qf, kf, v, causal=causal, normalize=True, eps=1e-300)
    assert rel(out, performer) <= 1e-12


@pytest.mark.parametrize("support_kind", ["local", "block", "lsh"])
@pytest.mark.parametrize("causal", [True, False])
def test_scatterbrain_is_exact_on_the_support_and_lowrank_elsewhere(support_kind, causal):
    L = 40
    q, k = (torch.randn(1, 1, L, 6, dtype=torch.float64) for _ in range(2))
    qf, kf, ls, scale = _performer(q, k, m=16)
    if support_kind == "local":
        support = local_support(L, 7, causal=causal)
    elif support_kind == "block":
        support = block_support(L, 8, causal=causal)
    else:
        support = lsh_support(q, k, torch.randn(2, 6, 3, dtype=torch.float64), 6, causal=causal)
    # with V = identity each output row is the row of implied (normalised) weights
    weights = scatterbrain_attention(q, k, torch.eye(L, dtype=torch.float64).expand(1, 1, L, L), qf, kf, support,
                                     q_log_scale=ls, causal=causal, scale=scale)[0, 0]
    exact = torch.exp(scale * q[0, 0] @ k[0, 0].T)
    lowrank = torch.exp(ls[0, 0]).unsqueeze(-1) * (qf[0, 0] @ kf[0, 0].T)
    on_support = torch.zeros(L, L, dtype=torch.bool)
    idx, valid = support.index[0, 0], support.valid[0, 0]
    for i in range(L):
        on_support[i, idx[i][valid[i]]] = True
    implied = torch.where(on_support, exact, lowrank)
    if causal:
        implied = implied.tril()
    expected = implied / implied.sum(-1, keepdim=True)
    assert rel(weights, expected) <= 1e-12
    assert torch.allclose(weights.sum(-1), torch.ones(L, dtype=torch.float64), atol=1e-12)


def test_lsh_pairs_found_in_several_rounds_count_once():
    q, k, v = (torch.randn(1, 2, 60, 8, dtype=torch.float64) for _ in range(3))
    qf, kf, ls, scale = _performer(q, k)
    rotation = torch.randn(1, 8, 4, dtype=torch.float64)
    once = lsh_support(q, k, rotation, 10, causal=True)
    twice = lsh_support(q, k, torch.cat([rotation, rotation]), 10, causal=True)
    assert once.valid.sum() == twice.valid.sum()
    a = scatterbrain_attention(q, k, v, qf, kf, once, q_log_scale=ls, scale=scale)
    b = scatterbrain_attention(q, k, v, qf, kf, twice, q_log_scale=ls, scale=scale)
    assert rel(a, b) <= 1e-12


def test_scatterbrain_causality_by_autograd():
    L = 50
    q, k, v = (torch.randn(1, 2, L, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    W = random_projection(16, 8, orthogonal=True, seed=0, dtype=torch.float64)
    qf, ls = performer_features(q * 8 ** -0.25, W, query=True)
    kf, _ = performer_features(k * 8 ** -0.25, W, query=False)
    support = lsh_support(q, k, torch.randn(2, 8, 4, dtype=torch.float64), 8, causal=True)
    out = scatterbrain_attention(q, k, v, qf, kf, support, q_log_scale=ls, scale=8 ** -0.5)
    t = 29
    for g in torch.autograd.grad(out[:, :, t].sum(), [q, k, v]):
        assert torch.all(g[:, :, t + 1:] == 0)


def test_performer_estimate_is_unbiased():
    """Mean of phi(q).phi(k) over 4000 independent draws (m = 8) is within 4 standard errors of exp(q.k)."""
    torch.manual_seed(0)
    d, m, draws = 4, 8, 4000
    q = torch.randn(3, d, dtype=torch.float64) * 0.4
    k = torch.randn(3, d, dtype=torch.float64) * 0.4
    estimates = []
    for seed in range(draws):
        W = random_projection(m, d, orthogonal=False, seed=seed, dtype=torch.float64)
        qf, ls = performer_features(q.view(1, 1, 3, d), W, query=True)
        kf, _ = performer_features(k.view(1, 1, 3, d), W, query=False)
        estimates.append(torch.exp(ls[0, 0]).unsqueeze(-1) * (qf[0, 0] @ kf[0, 0].T))
    estimates = torch.stack(estimates)
    exact = torch.exp(q @ k.T)
    standard_error = estimates.std(0) / math.sqrt(draws)
    assert torch.all((estimates.mean(0) - exact).abs() <= 4 * standard_error)
    # the per-entry variance matches (1/m) e^{2 q.k} (e^{|q+k|^2} - 1) within 4 standard errors of the sample
    # variance, estimated from the fourth central moment (the estimator is heavy-tailed)
    theory = (torch.exp(2 * q @ k.T) * (torch.exp(((q.unsqueeze(1) + k.unsqueeze(0)) ** 2).sum(-1)) - 1)) / m
    centred = estimates - estimates.mean(0)
    variance = centred.pow(2).mean(0)
    variance_error = ((centred.pow(4).mean(0) - variance ** 2) / draws).sqrt()
    assert torch.all((variance - theory).abs() <= 4 * variance_error)


def test_performer_features_are_bounded_and_streaming():
    x = torch.randn(1, 1, 20, 6) * 10  # large inputs: features stay in (0, 1], no overflow
    W = random_projection(12, 6, orthogonal=True, seed=1)
    kf, none = performer_features(x, W, query=False)
    qf, ls = performer_features(x, W, query=True)
    assert none is None and torch.isfinite(qf).all() and torch.isfinite(kf).all()
    assert (kf <= 1).all() and (qf <= 1).all() and torch.isfinite(ls).all()
    # per-row: features of a prefix do not change when more tokens arrive
    kf_prefix, _ = performer_features(x[:, :, :7], W, query=False)
    assert torch.equal(kf_prefix, kf[:, :, :7])


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("support_kind", ["lsh", "local"])
def test_scatterbrain_memory_is_subquadratic_at_16384(support_kind):
    L = 16384
    q, k, v = (torch.randn(1, 1, L, 8) for _ in range(3))
    W = random_projection(8, 8, orthogonal=True, seed=0)
    with _LargestTensor() as tracker:
        qf, ls = performer_features(q * 8 ** -0.25, W, query=True)
        kf, _ = performer_features(k * 8 ** -0.25, W, query=False)
        support = (lsh_support(q, k, torch.randn(2, 8, 4), 16, causal=True) if support_kind == "lsh"
                   else local_support(L, 32, causal=True))
        out = scatterbrain_attention(q, k, v, qf, kf, support, q_log_scale=ls, scale=8 ** -0.5, max_length=L)
    assert torch.isfinite(out).all()
    # The largest legitimate tensor is the gathered values, O(L * S * D) = 4.7M elements here; any L x L
    # tensor (268M elements) or a sizeable fraction of one fails.
    assert tracker.largest < L * L // 16, f"a tensor of {tracker.largest} elements (L^2 = {L * L})"


def _scatterbrain_arguments(**changes):
    B, H, L, D, m, S = 1, 2, 8, 4, 6, 3
    generator = torch.Generator().manual_seed(0)
    arguments = {"q": torch.randn(B, H, L, D, generator=generator), "k": torch.randn(B, H, L, D, generator=generator),
                 "v": torch.randn(B, H, L, D, generator=generator), "qf": torch.rand(B, H, L, m, generator=generator),
                 "kf": torch.rand(B, H, L, m, generator=generator),
                 "index": torch.randint(0, L, (B, H, L, S), generator=generator),
                 "valid": torch.ones(B, H, L, S, dtype=torch.bool), "log_scale": None}
    return {**arguments, **changes}


@pytest.mark.parametrize("changes", [
    {"q": torch.randn(2, 8, 4)}, {"k": torch.randn(1, 2, 9, 4)}, {"v": torch.randn(1, 2, 7, 4)},
    {"k": torch.randn(1, 2, 8, 5)}, {"index": torch.full((1, 2, 8, 3), 8)}, {"index": torch.full((1, 2, 8, 3), -1)},
    {"index": torch.zeros(1, 2, 8, 3)}, {"valid": torch.ones(1, 2, 8, 3, dtype=torch.long)},
    {"qf": torch.rand(1, 2, 8)}, {"q": torch.ones(1, 2, 8, 4, dtype=torch.long)}, {"log_scale": torch.zeros(1, 2)},
], ids=["q-3d", "k-length", "v-length", "k-width", "index-past-end", "index-negative", "index-float", "valid-long",
        "features-3d", "q-integer", "log-scale-shape"])
def test_scatterbrain_refuses_bad_arguments_with_shape_errors(changes):
    """Trust II, finding 18: these raised IndexError, RuntimeError or ValueError (or passed silently)."""
    from attnspec.ops.support import Support

    a = _scatterbrain_arguments(**changes)
    with pytest.raises(ShapeError):
        scatterbrain_attention(a["q"], a["k"], a["v"], a["qf"], a["kf"], Support(a["index"], a["valid"]),
                               q_log_scale=a["log_scale"])
