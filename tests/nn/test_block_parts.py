"""The model-level parts released configs use (issue 36): an embedding multiplier (Gemma's sqrt(d),
Granite's `embedding_multiplier`), a residual multiplier on every sub-layer (Granite's
`residual_multiplier`), a logit soft-cap (Gemma 2's `final_logit_softcapping`), norm placements and skip
scales (Gemma 3's sandwich, MiniMax's normalised skip, DeepNorm) and MiniMax's lightning attention, each held
to the same model written another way, in float64, and through decoding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnspec.errors import SpecError
from attnspec.nn.model import build_model_from_spec
from attnspec.spec import load_spec

BASE = {
    "name": "parts", "dtype": "float64", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 32,
    "layers": [{"repeat": 2, "layers": [{"mixer": {"kind": "softmax", "heads": 2, "out_bias": True},
                                         "mlp": {"kind": "glu", "expansion": 2}, "norm": {"kind": "rmsnorm"}}]}],
    "head": {"kind": "lm", "tied": False, "scale": 1.0},
}
TOKENS = torch.randint(0, 32, (2, 11), generator=torch.Generator().manual_seed(0))


def _model(*overrides: str):
    torch.manual_seed(0)
    return build_model_from_spec(load_spec(BASE, list(overrides))).eval()


def _decodes_as_it_computes(model, prompt: int = 4) -> None:
    """A prefill of ``prompt`` tokens then one step per token gives the full forward's logits."""
    full = model(TOKENS)
    logits, *state = model.prefill(TOKENS[:, :prompt])
    for t in range(prompt, TOKENS.shape[1]):
        logits, *state = model.step(TOKENS[:, t], *state)
        assert torch.allclose(logits, full[:, t], rtol=1e-10, atol=1e-10)


def test_an_embedding_multiplier_is_a_scaled_embedding_table():
    scaled, plain = _model("input.scale=4.0"), _model()
    with torch.no_grad():
        plain.embed.weight.mul_(4.0)
        assert torch.allclose(scaled(TOKENS), plain(TOKENS), rtol=1e-12, atol=1e-12)


def test_a_residual_multiplier_is_scaled_output_projections():
    scaled, plain = _model("blocks[*].residual_scale=0.25"), _model()
    with torch.no_grad():
        for block in plain.blocks:  # s f(x): the last linear map of each sub-layer times s
            for layer in (block.mixer.out_proj, block.mlp.down):
                layer.weight.mul_(0.25)
                if layer.bias is not None:
                    layer.bias.mul_(0.25)
        assert torch.allclose(scaled(TOKENS), plain(TOKENS), rtol=1e-12, atol=1e-12)


def test_a_soft_cap_bounds_the_logits_smoothly_and_decoding_sees_it():
    capped, plain = _model("head.softcap=0.5", "input.scale=4.0", "blocks[*].residual_scale=0.5"), \
        _model("input.scale=4.0", "blocks[*].residual_scale=0.5")
    with torch.no_grad():
        logits, reference = capped(TOKENS), plain(TOKENS)
        assert torch.allclose(logits, 0.5 * torch.tanh(reference / 0.5), rtol=1e-12, atol=1e-12)
        assert logits.abs().max() < 0.5 < reference.abs().max()  # the cap acts here
        generated = capped.generate(TOKENS[:, :4], 5, temperature=0.0)
        stepped, *state = capped.prefill(TOKENS[:, :4])
        for t in range(5):
            assert torch.allclose(stepped[:, -1] if stepped.dim() == 3 else stepped,
                                  capped(generated[:, :4 + t])[:, -1], rtol=1e-9, atol=1e-9)
            stepped, *state = capped.step(generated[:, 4 + t], *state)
    assert math.isfinite(float(logits.sum()))


def test_a_block_without_a_mixer_is_its_mlp_alone_and_decodes():
    """`mixer: none` (Nemotron-H's MLP layers): x + mlp(norm(x)), no norm or weights of a mixer, an empty
    decoding state; the model equals its first block's attention then the MLP written out by hand."""
    mlp_only = {"mixer": "none", "mlp": {"kind": "mlp", "activation": "relu2", "bias": True}, "norm": "rmsnorm"}
    torch.manual_seed(0)
    model = build_model_from_spec(load_spec({**BASE, "layers": [BASE["layers"][0]["layers"][0], mlp_only]})).eval()
    block = model.blocks[1]
    assert block.norm1 is None
    assert not [name for name, _ in block.named_parameters() if name.startswith("mixer.")]
    assert model.state_layout()[1] == 0
    with torch.no_grad():
        h = model.blocks[0](model.embed(TOKENS))
        mlp = block.mlp
        by_hand = h + mlp.down(torch.relu(mlp.up(block.norm2(h))) ** 2)
        assert torch.allclose(model.blocks[1](h), by_hand, rtol=1e-12, atol=1e-12)
        _decodes_as_it_computes(model, 5)


def test_a_block_with_neither_a_mixer_nor_an_mlp_and_fields_on_no_mixer_are_located_errors():
    for override, words in (("layers[0].layers[0].mixer=none", "neither a mixer nor an MLP"),
                            ("layers[0].layers[0].mixer={kind: none, heads: 2}", "has no `heads`")):
        with pytest.raises(SpecError, match=words):
            load_spec({**BASE, "layers": [{"repeat": 1, "layers": [{"mixer": {"kind": "softmax"}, "mlp": "none"}]}]},
                      [override])


def test_sandwich_norms_normalise_each_sub_layer_before_and_after_it():
    """`norm_placement: sandwich` (Gemma 2 and 3): x + post_norm(f(norm(x))) for the mixer and the MLP,
    each post norm its own weights; held to the block written out by hand, and through decoding."""
    model = _model("blocks[*].norm_placement=sandwich")
    block = model.blocks[0]
    with torch.no_grad():
        for norm in (block.post_norm1, block.post_norm2):
            norm.weight.copy_(torch.linspace(0.5, 2.0, norm.weight.shape[0]))
        x = model.embed(TOKENS)
        h = x + block.post_norm1(block.mixer(block.norm1(x)))
        by_hand = h + block.post_norm2(block.mlp(block.norm2(h)))
        assert torch.allclose(block(x), by_hand, rtol=1e-12, atol=1e-12)
        _decodes_as_it_computes(model)


def test_a_normed_residual_with_skip_and_output_scales_is_minimax_s_block():
    """`norm_placement: normed_residual` with α and β of each sub-layer (MiniMax's factors):
    h = α norm(x) + β f(norm(x)), the skip carrying the normalised input; held to the block by hand."""
    model = _model("blocks[*].norm_placement=normed_residual", "blocks[*].skip_scale={mixer: 0.5, mlp: 1.5}",
                   "blocks[*].residual_scale={mixer: 2.0, mlp: 0.25}")
    block = model.blocks[0]
    with torch.no_grad():
        x = model.embed(TOKENS)
        n = block.norm1(x)
        h = 0.5 * n + 2.0 * block.mixer(n)
        n = block.norm2(h)
        by_hand = 1.5 * n + 0.25 * block.mlp(n)
        assert torch.allclose(block(x), by_hand, rtol=1e-12, atol=1e-12)
        _decodes_as_it_computes(model)


def test_a_skip_scale_after_a_post_norm_is_deepnorm():
    """`norm_placement: post` with `skip_scale: α` is DeepNorm's norm(α x + f(x))."""
    model = _model("blocks[*].norm_placement=post", "blocks[*].skip_scale=3.0")
    block = model.blocks[0]
    with torch.no_grad():
        x = model.embed(TOKENS)
        h = block.norm1(3.0 * x + block.mixer(x))
        by_hand = block.norm2(3.0 * h + block.mlp(h))
        assert torch.allclose(block(x), by_hand, rtol=1e-12, atol=1e-12)
        _decodes_as_it_computes(model)


def test_lightning_attention_is_silu_linear_attention_with_alibi_decays_and_a_full_width_norm():
    """MiniMax's lightning attention in the linear family: SiLU on q, k and v, a fixed decay per head
    exp(-m_h) with ALiBi's slopes m_h = 2^(-8 (h + 1) / H) kept as a buffer, no normaliser, an RMSNorm over
    the whole output width, a sigmoid gate; held to its recurrence written out in float64, in every mode."""
    mixer = ("blocks[*].mixer={kind: linear, heads: 4, feature_map: silu, value_activation: silu, normalize: false, "
             "transition: {kind: fixed, init: alibi, learnable: false}, group_norm: true, norm_span: full, "
             "output_gate: sigmoid}")
    model = _model(mixer)
    layer = model.blocks[0].mixer
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)], dtype=torch.float64)
    assert torch.allclose(torch.exp(layer.transition.nu.double()).view(4), slopes, rtol=1e-6)
    assert "transition.nu" not in dict(layer.named_parameters()) and "transition.nu" in layer.state_dict()
    with torch.no_grad():
        layer.norm_weight.copy_(torch.linspace(0.5, 2.0, layer.norm_weight.shape[0]))
        x = torch.randn(2, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        F = torch.nn.functional
        q, k, v = (F.silu(p(x)).view(2, 11, 4, 4) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        decay = torch.exp(-torch.exp(layer.transition.nu.double().view(4)))
        state, outputs = torch.zeros(2, 4, 4, 4, dtype=torch.float64), []
        for t in range(11):
            state = decay.view(1, 4, 1, 1) * state + k[:, t, :, :, None] * v[:, t, :, None, :]
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state).reshape(2, 16))
        o = torch.stack(outputs, 1)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * layer.norm_weight
        by_hand = layer.out_proj(o * torch.sigmoid(layer.gate(x)))
        for mode in layer.modes:
            assert torch.allclose(layer(x, mode), by_hand, rtol=1e-10, atol=1e-12), mode
        _decodes_as_it_computes(model)


def test_lightning_attention_s_parts_refuse_what_they_cannot_be():
    for override, words in (("blocks[*].mixer={kind: linear, heads: 2, norm_span: full}", "norm_span"),
                            ("blocks[*].mixer={kind: linear, heads: 2, feature_map: exp, value_activation: silu}",
                             "value_activation"),
                            ("blocks[*].mixer={kind: linear, heads: 2, transition: {kind: fixed, init: alibi, "
                             "per: channel}}", "alibi"),
                            ("blocks[*].mixer={kind: mamba, norm_span: full}", "norm_span")):
        with pytest.raises(SpecError, match=words):
            _model(override)


@pytest.mark.parametrize("parallel", ["shared_norm", "own_norms"])
def test_a_parallel_block_adds_its_mixer_and_mlp_of_the_same_input_and_decodes(parallel):
    """GPT-J's and Phi's block (one norm feeding both) and GPT-NeoX's (each its own): x + f(n(x)) + g(n'(x)),
    written out here from the block's own modules, and through decoding."""
    model = _model(f"blocks[*].parallel={parallel}")
    plain = _model()
    x = model.embed(TOKENS)
    with torch.no_grad():
        for block in model.blocks:
            h = block.norm1(x)
            x = x + block.mixer(h) + block.mlp(h if parallel == "shared_norm" else block.norm2(x))
        assert torch.allclose(model(TOKENS), model.head(model.final_norm(x)), rtol=1e-12, atol=1e-12)
        assert not torch.allclose(model(TOKENS), plain(TOKENS), atol=1e-3)  # not the sequential block
        _decodes_as_it_computes(model)
    norms = {name for name, _ in model.named_parameters() if name.startswith("blocks.0.norm")}
    assert norms == {"blocks.0.norm1.weight"} | ({"blocks.0.norm2.weight"} if parallel == "own_norms" else set())


@pytest.mark.parametrize("override, where", [
    ("blocks[0].norm_placement=post", "parallel"), ("blocks[0].residual=false", "parallel"),
    ("blocks[0].residual_scale=0.5", "parallel"), ("blocks[0].mlp={kind: none}", "parallel")])
def test_a_parallel_block_refuses_what_it_cannot_be(override, where):
    with pytest.raises(SpecError, match=where):
        _model("blocks[0].parallel=shared_norm", override)


def _xielu(x, alpha_p, alpha_n, beta, eps):
    """xIELU by its definition (Huang 2024, eq. 4), float64."""
    a_p, a_n = math.log1p(math.exp(alpha_p)), beta + math.log1p(math.exp(alpha_n))
    positive = a_p * x * x + beta * x
    negative = a_n * (torch.expm1(torch.clamp(x, max=eps)) - x) + beta * x
    return torch.where(x > 0, positive, negative)


def test_an_xielu_mlp_is_its_definition_forward_and_backward():
    """`activation: xielu`: W2 xIELU(W1 x + b1) + b2 with its learnt α_p, α_n and its β, ε as the weights hold them,
    across zero and the ε clamp (values to 1e-12; gradients of the input and α_p, α_n to 1e-10), and the model's
    decoding sees it."""
    model = _model("blocks[*].mlp={kind: mlp, hidden: 12, activation: xielu}")
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        mlp.activation.alpha_p.fill_(0.3)
        mlp.activation.alpha_n.fill_(-0.7)
        mlp.activation.beta.fill_(0.4)
        mlp.activation.eps.fill_(-1e-3)
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 2
    x[0, 0, :4] = torch.tensor([0.0, -5e-4, 5e-4, -2e-3])  # at zero and either side of ε
    x.requires_grad_(True)
    hidden = mlp.up(x)
    ours = mlp(x)
    reference = mlp.down(_xielu(hidden, 0.3, -0.7, 0.4, -1e-3))
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    mine = torch.autograd.grad(ours, [x, mlp.activation.alpha_p, mlp.activation.alpha_n], cotangent)
    a_p, a_n = mlp.activation.alpha_p, mlp.activation.alpha_n  # the reference's as tensors, to differentiate
    theirs_out = mlp.down(torch.where(hidden > 0, F.softplus(a_p) * hidden ** 2 + 0.4 * hidden,
                                      (0.4 + F.softplus(a_n)) * (torch.expm1(torch.clamp(hidden, max=-1e-3)) - hidden)
                                      + 0.4 * hidden))
    theirs = torch.autograd.grad(theirs_out, [x, a_p, a_n], cotangent)
    assert all(torch.allclose(m, t, rtol=0, atol=1e-10) for m, t in zip(mine, theirs))
    assert float(mine[1].abs()) > 0 and float(mine[2].abs()) > 0  # both learnt numbers receive gradient
    with torch.no_grad():
        _decodes_as_it_computes(model)
    assert {"activation.beta", "activation.eps"} <= {n.split("mlp.", 1)[1] for n in model.state_dict() if "mlp." in n}


def test_xielu_is_a_dense_mlp_s_alone():
    with pytest.raises(SpecError, match="activation"):
        _model("blocks[*].mlp={kind: moe, experts: 2, top_k: 1, hidden: 8, activation: xielu}")


def test_a_tied_head_with_a_bias_adds_its_own_vector_to_the_embedding_s_logits():
    """`head: {tied: true, bias: true}` (CTRL's): logits = h E^T + b, b a parameter of its own (the embedding table
    has no bias), trained, and seen by decoding."""
    biased = _model("head.tied=true", "head.bias=true")
    plain = _model("head.tied=true")
    with torch.no_grad():
        biased.head_bias.copy_(torch.randn_like(biased.head_bias))
        hidden = plain(TOKENS)  # the same weights: only the bias differs (the seed draws them alike)
        assert torch.allclose(biased(TOKENS), hidden + biased.head_bias, rtol=1e-12, atol=1e-12)
        _decodes_as_it_computes(biased)
    biased(TOKENS).sum().backward()
    assert biased.head_bias.grad is not None and biased.head is None


def test_an_rmsnorm_without_a_weight_is_the_normalisation_alone():
    """`rmsnorm` with `affine: false` (nanochat's, everywhere): x / rms(x), no parameter; the same model as one whose
    norms hold weights of 1, through decoding."""
    plain = _model("blocks[*].norm={kind: rmsnorm, affine: false}", "final_norm={kind: rmsnorm, affine: false}")
    weighted = _model("blocks[*].norm={kind: rmsnorm}", "final_norm={kind: rmsnorm}")
    assert not any("norm" in name and "mixer" not in name for name, _ in plain.named_parameters())
    with torch.no_grad():
        assert torch.allclose(plain(TOKENS), weighted(TOKENS), rtol=1e-12, atol=1e-12)
        x = torch.randn(3, 16, dtype=torch.float64)
        assert torch.allclose(plain.final_norm(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt(), atol=1e-14)
        _decodes_as_it_computes(plain)


@pytest.mark.parametrize("norm", ["{kind: rmsnorm, eps: 1.0e-5}", "{kind: layernorm}"])
def test_an_mlp_s_inner_norm_normalises_its_hidden_before_the_down_projection(norm):
    """`inner_norm` (BitNet's `ffn_sub_norm`): W2 norm(act(W1 x) * W3 x) with the norm's own weight over the hidden
    width, written out in float64 (values to 1e-12, gradients of the input and the norm's weight to 1e-10), and the
    model's decoding sees it."""
    model = _model(f"blocks[*].mlp={{kind: glu, hidden: 12, activation: relu2, bias: false, inner_norm: {norm}}}")
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        mlp.inner_norm.weight.copy_(torch.rand(12, dtype=torch.float64) + 0.5)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    hidden = F.relu(mlp.up(x)).square() * mlp.gate(x)
    if "rmsnorm" in norm:
        normed = hidden / hidden.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * mlp.inner_norm.weight
    else:
        centred = hidden - hidden.mean(-1, keepdim=True)
        normed = centred / centred.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * mlp.inner_norm.weight \
            + mlp.inner_norm.bias
    ours, reference = mlp(x), mlp.down(normed)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    inputs = [x, mlp.inner_norm.weight]
    mine, theirs = torch.autograd.grad(ours, inputs, cotangent), torch.autograd.grad(reference, inputs, cotangent)
    assert all(torch.allclose(m, t, rtol=0, atol=1e-10) for m, t in zip(mine, theirs))
    with torch.no_grad():
        _decodes_as_it_computes(model)
