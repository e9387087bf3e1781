"""The projection stage's parts: QK-norm's kinds and placement (`qk_norm: layernorm`, Persimmon's;
`qk_norm_after_rope`, Hunyuan V1's) and clamped projections (`qkv_clip`, DBRX's), held to softmax attention written
out from its definition in float64, forward and backward, through decoding, and in every mode of a linear-attention
mixer that reads the same queries and keys."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.errors import SpecError

D_MODEL, HEADS, KV_HEADS, D_QK, BASE = 24, 4, 2, 6, 50.0
SPEC = {"name": "qk", "input": {"kind": "tokens", "vocab_size": 64}, "d_model": D_MODEL, "max_len": 64,
        "dtype": "float64"}


def _mixer(kind: str = "softmax", **fields):
    torch.manual_seed(0)
    mixer = {"kind": kind, "heads": HEADS, "kv_heads": KV_HEADS, "d_qk": D_QK, "d_v": D_QK, "qkv_bias": True,
             "position": {"kind": "rope", "base": BASE}, "norm_eps": 1e-5, **fields}
    model = attnspec.build({**SPEC, "layers": [{"mixer": mixer}]})
    with torch.no_grad():  # norm weights and biases away from 1 and 0, so a misplaced or missing one shows
        for name, parameter in model.named_parameters():
            if "qk_norm" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5 + (1.0 if "bias" not in name else 0.0))
    return model


def _rope(t: torch.Tensor) -> torch.Tensor:
    """Rotary positions by their definition (Llama's rotate-half layout): position p turns channel pair
    (i, i + d/2) by p * BASE^(-2i/d). t (B, H, L, d)."""
    L, d = t.shape[-2], t.shape[-1]
    angle = torch.arange(L, dtype=t.dtype)[:, None] * BASE ** (-torch.arange(0, d, 2, dtype=t.dtype) / d)
    cos, sin = torch.cat([angle.cos(), angle.cos()], -1), torch.cat([angle.sin(), angle.sin()], -1)
    rotated = torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1)
    return t * cos + rotated * sin


def _normalized(t: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """A LayerNorm (with ``bias``) or an RMSNorm (without; no ``weight``: unweighted) over each head's channels."""
    if bias is not None:
        t = t - t.mean(-1, keepdim=True)
    t = t / torch.sqrt((t * t).mean(-1, keepdim=True) + eps) * (1 if weight is None else weight)
    return t if bias is None else t + bias


def _queries_keys(mixer, x: torch.Tensor, after: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, L, d), k (B, H_kv, L, d) by the definition: project, split heads, normalise each head
    before RoPE or (``after``) after it."""
    B, L, _ = x.shape
    heads = lambda t, h: t.view(B, L, h, D_QK).transpose(1, 2)  # noqa: E731
    q, k = heads(mixer.q_proj(x), HEADS), heads(mixer.k_proj(x), KV_HEADS)
    bias, weight = mixer.qk_norm_bias, mixer.qk_norm

    def norm(t: torch.Tensor, stream: str) -> torch.Tensor:
        return _normalized(t, None if weight is None else weight[stream], None if bias is None else bias[stream], 1e-5)
    if after:
        return norm(_rope(q), "q"), norm(_rope(k), "k")
    return _rope(norm(q, "q")), _rope(norm(k, "k"))


def _attention(mixer, x: torch.Tensor, after: bool) -> torch.Tensor:
    """Causal softmax attention with grouped keys and values, from its definition: x (B, L, d_model) -> same."""
    B, L, _ = x.shape
    q, k = _queries_keys(mixer, x, after)
    v = mixer.v_proj(x).view(B, L, KV_HEADS, D_QK).transpose(1, 2)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = q @ k.transpose(-1, -2) / D_QK ** 0.5
    scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return mixer.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, HEADS * D_QK))


@pytest.mark.parametrize("kind, after", [("layernorm", False), ("layernorm", True), ("rmsnorm", True),
                                         ("rmsnorm_unweighted", True)])
def test_softmax_attention_with_each_qk_norm_is_its_definition_forward_and_backward(kind, after):
    """Outputs to 1e-12 (float64 rounding of the same sums) and gradients of the input and the norm's
    weights and biases to 1e-10."""
    mixer = _mixer(qk_norm=kind, qk_norm_after_rope=after).blocks[0].mixer
    x = torch.randn(2, 13, D_MODEL, dtype=torch.float64, requires_grad=True)
    ours, reference = mixer(x, "quadratic"), _attention(mixer, x, after)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12) and reference.abs().max() > 0.1
    weights = [p for n, p in mixer.named_parameters() if "qk_norm" in n]
    assert len(weights) == {"layernorm": 4, "rmsnorm": 2, "rmsnorm_unweighted": 0}[kind]
    cotangent = torch.randn_like(reference)
    for mine, theirs in zip(torch.autograd.grad(ours, [x, *weights], cotangent),
                            torch.autograd.grad(reference, [x, *weights], cotangent)):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-10)
    # the placement matters where the norm has a weight (not the same in every channel, it does not commute with the
    # rotation); an unweighted RMSNorm over the whole head does, so either placement computes the same
    other = (ours - _attention(mixer, x, not after)).abs().max()
    assert other > 1e-3 if kind != "rmsnorm_unweighted" else other < 1e-12


@pytest.mark.parametrize("kind, after", [("layernorm", True), ("rmsnorm", True)])
def test_decoding_through_the_key_value_cache_continues_the_full_pass(kind, after):
    model = _mixer(qk_norm=kind, qk_norm_after_rope=after).eval()
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        logits, *state = model.prefill(tokens[:, :5])
        for t in range(5, tokens.shape[1]):
            logits, *state = model.step(tokens[:, t], *state)
            assert torch.allclose(logits, full[:, t], rtol=0, atol=1e-10)


@pytest.mark.parametrize("after", [False, True])
def test_a_linear_mixer_reads_the_normalised_queries_and_keys_in_every_mode(after):
    """The linear family shares the projection: its q and k are the definition's, every mode agrees (to
    1e-10) and the step continues the full pass."""
    model = _mixer("linear", qk_norm="layernorm", qk_norm_after_rope=after, feature_map="elu1").eval()
    mixer = model.blocks[0].mixer
    x = torch.randn(2, 19, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        q, k, _, _ = mixer._project(x, expand=False)
        q_ref, k_ref = _queries_keys(mixer, x, after)
        assert torch.allclose(q, q_ref, rtol=0, atol=1e-12) and torch.allclose(k, k_ref, rtol=0, atol=1e-12)
        outputs = {mode: mixer(x, mode) for mode in mixer.modes}
        assert len(outputs) >= 3
        for mode, out in outputs.items():
            assert torch.allclose(out, outputs[mixer.modes[0]], rtol=0, atol=1e-10), mode
        tokens = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(2))
        full, state = model(tokens), model.init_state(2)
        for t in range(tokens.shape[1]):
            logits, *state = model.step(tokens[:, t], *state)
        assert torch.allclose(logits, full[:, -1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("fields, where", [
    ({"qk_norm_after_rope": True}, "qk_norm_after_rope"),
    ({"qk_norm": "rmsnorm_full", "qk_norm_after_rope": True}, "qk_norm_after_rope"),
])
def test_a_qk_norm_after_rope_needs_a_per_head_norm(fields, where):
    with pytest.raises(SpecError, match=f"layers\\[0\\].mixer.{where}.*qk_norm: rmsnorm"):
        _mixer(**fields)


def test_mixers_without_queries_and_keys_refuse_the_placement():
    with pytest.raises(SpecError, match="qk_norm_after_rope"):
        attnspec.build({**SPEC, "layers": [{"mixer": {"kind": "mamba", "qk_norm_after_rope": True}}]})


def test_clamped_projections_are_the_definition_in_every_mode_and_through_decoding():
    """`qkv_clip`: q, k and v clamped to [-c, c] right after their projections (before QK-norm and RoPE); against
    attention written with the clamp (1e-12; gradients 1e-10, zero where a projection is clamped), in every mode of a
    linear mixer, and through the key/value cache."""
    clip = 0.25
    mixer = _mixer(qkv_clip=clip).blocks[0].mixer
    x = torch.randn(2, 13, D_MODEL, dtype=torch.float64, requires_grad=True)
    assert (mixer.q_proj(x).abs() > clip).any() and (mixer.v_proj(x).abs() < clip).any()  # both sides of the clamp
    B, L, _ = x.shape
    heads = lambda t, h: t.clamp(-clip, clip).view(B, L, h, D_QK).transpose(1, 2)  # noqa: E731
    q, k = _rope(heads(mixer.q_proj(x), HEADS)), _rope(heads(mixer.k_proj(x), KV_HEADS))
    v = heads(mixer.v_proj(x), KV_HEADS)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = (q @ k.transpose(-1, -2) / D_QK ** 0.5).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1),
                                                                 float("-inf"))
    reference = mixer.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, HEADS * D_QK))
    ours = mixer(x, "quadratic")
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    assert torch.allclose(torch.autograd.grad(ours, x, cotangent)[0], torch.autograd.grad(reference, x, cotangent)[0],
                          rtol=0, atol=1e-10)
    model = _mixer("linear", qkv_clip=clip, feature_map="elu1").eval()
    linear = model.blocks[0].mixer
    with torch.no_grad():
        outputs = {mode: linear(x, mode) for mode in linear.modes}
        assert all(torch.allclose(out, outputs[linear.modes[0]], rtol=0, atol=1e-10) for out in outputs.values())
    decoded = _mixer(qkv_clip=clip).eval()
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, (logits, *state) = decoded(tokens), decoded.prefill(tokens[:, :4])
        for t in range(4, 12):
            logits, *state = decoded.step(tokens[:, t], *state)
            assert torch.allclose(logits, full[:, t], rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind, per_head", [("softplus", True), ("softplus", False), ("sigmoid", True)])
def test_an_output_gate_of_each_kind_and_width_is_its_definition_and_decodes(kind, per_head):
    """`output_gate: softplus` (Laguna's) and `gate_per_head` (one value per head): y_h * act(w_h . x) over each head's
    channels, or y * act(W_g x) per channel, against attention written out (1e-12), with gradients, and through the
    key/value cache."""
    model = _mixer(output_gate=kind, gate_per_head=per_head).eval()
    mixer = model.blocks[0].mixer
    assert mixer.gate.out_features == (HEADS if per_head else HEADS * D_QK)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64, requires_grad=True)
    B, L, _ = x.shape
    q, k = _rope(mixer.q_proj(x).view(B, L, HEADS, D_QK).transpose(1, 2)), \
        _rope(mixer.k_proj(x).view(B, L, KV_HEADS, D_QK).transpose(1, 2))
    v = mixer.v_proj(x).view(B, L, KV_HEADS, D_QK).transpose(1, 2)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = (q @ k.transpose(-1, -2) / D_QK ** 0.5).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1),
                                                                 float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2)  # (B, L, H, d)
    act = {"softplus": torch.nn.functional.softplus, "sigmoid": torch.sigmoid}[kind]
    g = act(mixer.gate(x))
    gated = y * g.unsqueeze(-1) if per_head else y * g.view(B, L, HEADS, D_QK)
    reference = mixer.out_proj(gated.reshape(B, L, HEADS * D_QK))
    ours = mixer(x, "quadratic")
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    assert torch.allclose(torch.autograd.grad(ours, x, cotangent)[0], torch.autograd.grad(reference, x, cotangent)[0],
                          rtol=0, atol=1e-10)
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full, (logits, *state) = model(tokens), model.prefill(tokens[:, :3])
        for t in range(3, 10):
            logits, *state = model.step(tokens[:, t], *state)
            assert torch.allclose(logits, full[:, t], rtol=0, atol=1e-10)


def test_a_per_head_gate_needs_an_output_gate():
    with pytest.raises(SpecError, match="gate_per_head"):
        _mixer(gate_per_head=True)
