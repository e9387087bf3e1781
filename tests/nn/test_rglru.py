"""Griffin's RG-LRU block (``kind: rglru``) against its definition written out here in float64: the
block-diagonal gates, a_t = exp(-c r_t softplus(Λ)), h_t = a_t h_(t-1) + sqrt(1 - a_t²) (i_t x_t) with the
sqrt taken as 1 at position 0, out = W_out (h ⊙ act(W_y u)). Every mode, gradients, gates near 0 and 1,
and decoding after a prefill. transformers' RecurrentGemma is the outside oracle in tests/hf/test_interop.py.
Tolerance 1e-10: float64, sums of a few dozen terms in other orders."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnspec

D_MODEL, WIDTH, HEADS, LENGTH = 8, 12, 3, 29


def _model():
    mixer = {"kind": "rglru", "heads": HEADS, "width": WIDTH, "chunk_size": 8, "qkv_bias": True, "out_bias": True}
    spec = {"name": "rglru", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": D_MODEL, "max_len": 64,
            "dtype": "float64", "layers": [{"mixer": mixer, "mlp": "none", "norm": "rmsnorm"}]}
    torch.manual_seed(0)
    model = attnspec.build(spec)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def _reference(m, u):
    y = F.gelu(m.linear_y(u), approximate="tanh")
    x = m.linear_x(u)
    w = m.conv.filters["v"]
    padded = F.pad(x, (0, 0, w.shape[1] - 1, 0))
    x = sum(padded[:, j:j + u.shape[1]] * w[:, j] for j in range(w.shape[1])) + m.conv.biases["v"]
    h, out = torch.zeros(u.shape[0], WIDTH, dtype=u.dtype), []
    block = WIDTH // HEADS
    for t in range(u.shape[1]):
        xt = x[:, t].view(-1, HEADS, block)
        i = torch.sigmoid(torch.einsum("bhi,hio->bho", xt, m.input_gate_weight) + m.input_gate_bias).flatten(1)
        r = torch.sigmoid(torch.einsum("bhi,hio->bho", xt, m.recurrent_gate_weight) + m.recurrent_gate_bias).flatten(1)
        log_a = -m.gate_scale * r * F.softplus(m.recurrent_param)
        a = torch.exp(log_a)  # 1 - a² written as -expm1(2 log a): exact where a is within 1e-12 of 1
        scale = torch.ones_like(a) if t == 0 else torch.sqrt(-torch.expm1(2 * log_a))
        h = a * h + scale * i * x[:, t]
        out.append(h * y[:, t])
    return m.linear_out(torch.stack(out, 1))


def test_every_mode_is_the_rg_lru_with_its_gradients():
    mixer = _model().blocks[0].mixer
    u = torch.randn(2, LENGTH, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = _reference(mixer, u)
    wanted = torch.autograd.grad(expected.pow(2).sum(), list(mixer.parameters()))
    for mode in mixer.modes:
        out = mixer(u, mode)
        assert (out - expected).abs().max() < 1e-10, mode
        for grad, want in zip(torch.autograd.grad(out.pow(2).sum(), list(mixer.parameters())), wanted):
            assert (grad - want).abs().max() < 1e-9 * max(1.0, float(want.abs().max())), mode


@pytest.mark.parametrize("bias", [-30.0, 30.0])
def test_gates_near_zero_and_one_stay_exact(bias):
    """r ~ 0 (a ~ 1: the state keeps everything, sqrt(1 - a²) ~ 0) and r ~ 1 (a ~ e^-8c softplus(Λ))."""
    mixer = _model().blocks[0].mixer
    with torch.no_grad():
        mixer.recurrent_gate_bias.fill_(bias)
        mixer.recurrent_gate_weight.zero_()
    u = torch.randn(2, LENGTH, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected = _reference(mixer, u)
    for mode in mixer.modes:
        out = mixer(u, mode)
        assert torch.isfinite(out).all() and (out - expected).abs().max() < 1e-10, mode


def test_decoding_continues_the_prefill():
    model = _model()
    tokens = torch.randint(0, 16, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :9])
        for t in range(9, LENGTH):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10


@pytest.mark.parametrize("width, heads, words", [
    (None, 3, "d_model = 16 is not divisible by heads = 3, so the gate blocks cannot split its channels equally"),
    (None, 17, "d_model = 16 is not divisible by heads = 17"),
    (30, 4, "4 gate blocks cannot divide width 30 equally"),
])
def test_gate_blocks_that_do_not_divide_the_channels_are_refused_at_heads(width, heads, words):
    """Before, heads 3 at d_model 16 passed `check` and failed in `build` with a matmul's shapes."""
    from attnspec.errors import SpecError
    from attnspec.spec import load_spec

    mixer = {"kind": "rglru", "heads": heads, **({"width": width} if width else {})}
    with pytest.raises(SpecError) as caught:
        load_spec({"name": "t", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 16,
                   "layers": [{"mixer": mixer}]})
    assert [(p.path, words in p.message) for p in caught.value.problems] == [("layers[0].mixer.heads", True)]
