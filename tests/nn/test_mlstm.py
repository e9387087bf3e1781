"""xLSTM's mLSTM cell (``kind: mlstm``) against the paper's stabilised recurrence written out here in
float64, as xLSTM's own step computes it: m_t = max(log σ(f_t) + m_(t-1), i_t), C_t = e^(log σ(f_t) +
m_(t-1) - m_t) C_(t-1) + e^(i_t - m_t) k_t v_tᵀ (n_t alike), h_t = s q_t C_t / (max(|s q_t n_t|, e^(-m_t)) +
eps), then the LayerNorm per head, the sigmoid gate and the output projection. Every mode, gradients,
input gates at their cap and forget gates near 0 and 1, causality, decoding after a prefill, and float32
against the reference. transformers' xLSTM is the outside oracle in tests/hf/test_interop.py.
Tolerances: 1e-10 in float64 (sums of a few dozen terms in other orders; the un-stabilised sums reach
e^15 times the stabilised ones, so 1e-10 relative to the output's scale); 2e-5 for float32 (about 100 ulp
of outputs of order 1, after sums of e^15-scaled terms)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnspec

D_MODEL, HEADS, D_QK, D_V, LENGTH = 12, 3, 5, 4, 29


def _model(dtype: str = "float64", conv: bool = False):
    mixer = {"kind": "mlstm", "heads": HEADS, "d_qk": D_QK, "d_v": D_V, "chunk_size": 8, "gate_softcap": 15.0,
             **({"conv": {"kind": "short", "projections": ["q", "k", "v"]}} if conv else {})}
    spec = {"name": "mlstm", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": D_MODEL, "max_len": 64,
            "dtype": dtype, "layers": [{"mixer": mixer, "mlp": "none", "norm": "rmsnorm"}]}
    torch.manual_seed(0)
    model = attnspec.build(spec)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
        mixer = model.blocks[0].mixer
        mixer.igate.weight.mul_(20.0)  # input gates over the whole capped range, up to e^15
    return model


def _reference(m, x):
    """The stabilised recurrence, step by step, in float64."""
    B, L = x.shape[:2]
    q = m.q_proj(x).view(B, L, HEADS, D_QK) * D_QK ** -0.5
    k = m.k_proj(x).view(B, L, HEADS, D_QK)
    v = m.v_proj(x).view(B, L, HEADS, D_V)
    i = 15.0 * torch.tanh(m.igate(x) / 15.0)
    log_f = F.logsigmoid(15.0 * torch.tanh(m.fgate(x) / 15.0))
    C = torch.zeros(B, HEADS, D_QK, D_V, dtype=x.dtype)
    n = torch.zeros(B, HEADS, D_QK, dtype=x.dtype)
    m_state = torch.zeros(B, HEADS, dtype=x.dtype)
    out = []
    for t in range(L):
        m_new = torch.maximum(log_f[:, t] + m_state, i[:, t])
        forget, write = torch.exp(log_f[:, t] + m_state - m_new), torch.exp(i[:, t] - m_new)
        C = forget[..., None, None] * C + write[..., None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        n = forget[..., None] * n + write[..., None] * k[:, t]
        m_state = m_new
        numerator = torch.einsum("bhk,bhkv->bhv", q[:, t], C)
        denominator = torch.maximum(torch.einsum("bhk,bhk->bh", q[:, t], n).abs(), torch.exp(-m_state)) + 1e-6
        h = numerator / denominator[..., None]
        h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-6)
        out.append(h.reshape(B, -1) * m.norm_weight * torch.sigmoid(m.gate(x[:, t])))
    return m.out_proj(torch.stack(out, 1))


def _input(seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(2, LENGTH, D_MODEL, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def test_every_mode_is_the_stabilised_mlstm_with_its_gradients():
    mixer = _model().blocks[0].mixer
    x = _input(1)
    expected = _reference(mixer, x)
    wanted = torch.autograd.grad(expected.pow(2).sum(), list(mixer.parameters()))
    for mode in mixer.modes:
        out = mixer(x, mode)
        assert (out - expected).abs().max() < 1e-10 * float(expected.detach().abs().max()), mode
        for grad, want in zip(torch.autograd.grad(out.pow(2).sum(), list(mixer.parameters())), wanted):
            assert (grad - want).abs().max() < 1e-9 * max(1.0, float(want.abs().max())), mode


@pytest.mark.parametrize("forget_bias", [-40.0, 40.0])
def test_input_gates_at_their_cap_and_forget_gates_near_zero_and_one_stay_exact(forget_bias):
    """σ(f) ~ 0 (each step forgets all before it: m_t = i_t) and σ(f) ~ 1 (nothing forgotten: the sums
    grow with every e^(i_t) and m_t with the largest), with every input gate near its cap of 15."""
    mixer = _model().blocks[0].mixer
    with torch.no_grad():
        mixer.fgate.weight.zero_()
        mixer.fgate.bias.fill_(forget_bias)
        mixer.igate.bias.fill_(40.0)
    x = _input(2)
    expected = _reference(mixer, x)
    for mode in mixer.modes:
        out = mixer(x, mode)
        assert torch.isfinite(out).all() and (out - expected).abs().max() < 1e-10 * float(expected.abs().max()), mode


def test_a_position_sees_only_its_past():
    mixer = _model().blocks[0].mixer
    x = _input(3)
    changed = x.clone()
    changed[:, 17:] += 5.0
    for mode in mixer.modes:
        assert torch.equal(mixer(x, mode)[:, :17], mixer(changed, mode)[:, :17]), mode


def test_float32_modes_hold_to_the_float64_recurrence():
    model = _model("float32")
    mixer = model.blocks[0].mixer
    x = _input(4, torch.float32)
    expected = _reference(mixer.double(), x.double())
    mixer.float()
    for mode in mixer.modes:
        assert (mixer(x, mode).double() - expected).abs().max() < 2e-5 * float(expected.abs().max()), mode


@pytest.mark.parametrize("conv", [False, True])
def test_decoding_continues_the_prefill(conv):
    model = _model(conv=conv)
    tokens = torch.randint(0, 16, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for mode in model.blocks[0].mixer.modes:
            model.set_modes([mode])
            full = model(tokens)
            logits, *state = model.prefill(tokens[:, :9])
            for t in range(9, LENGTH):
                logits, *state = model.step(tokens[:, t], *state)
                assert (logits - full[:, t]).abs().max() < 1e-10, mode


def test_a_non_causal_mlstm_is_a_located_error():
    from attnspec.errors import SpecError

    spec = {"name": "m", "input": {"kind": "tokens", "vocab_size": 16}, "d_model": 8, "max_len": 16,
            "layers": [{"mixer": {"kind": "mlstm", "heads": 2, "causal": False}}]}
    with pytest.raises(SpecError, match=r"layers\[0\]\.mixer\.causal"):
        attnspec.build(spec)
