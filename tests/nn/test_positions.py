"""Positions and short convolutions: every mode, the decoding step, and the exact definitions.

Each scheme is checked against the formula it names (float64, odd sizes), not only against the
other modes: RoPE scores depend only on offsets, ALiBi is softmax plus -m_h (t - s), a short
convolution is the explicit causal sum, and the decoding step equals the full sequence.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnspec.errors import SpecError
from attnspec.nn.model import build_model_from_spec
from attnspec.spec import loads_spec

from tests.nn.test_components import _mixer, check_causal_by_autograd, check_modes_agree_and_step_equals_forward

TOL = 1e-10  # float64 end to end: differences are rounding of O(L) sums


def _close(got, expected):
    return ((got - expected).abs().max() / expected.abs().max()).item() <= TOL


MIXERS = [
    "linear(heads=3, feature_map=elu1, position=rope)",
    "linear(heads=3, feature_map=identity, normalize=false, position=alibi)",
    "linear(heads=3, feature_map=identity, normalize=false, position=alibi, transition=data(per=channel))",
    "linear(heads=3, feature_map=relu, reweighting=cos(M=64), position=rope(base=100), conv=short(width=3))",
    "linear(heads=3, feature_map=elu1, conv=short(width=4, projections=[k, v]))",
    "linear(heads=3, feature_map=identity, normalize=false, conv=shift, "
    "transition=fixed(init=retnet, complex=true))",
    "linear(heads=24, d_qk=1, d_v=1, feature_map=identity, normalize=false, transition=data, conv=short(width=2))",
]


@pytest.mark.parametrize("text", MIXERS)
def test_modes_agree_and_step_equals_forward(text):
    check_modes_agree_and_step_equals_forward(text)


@pytest.mark.parametrize("text", MIXERS + ["softmax(heads=2, position=rope, conv=short(width=3))",
                                           "softmax(heads=2, position=alibi, conv=shift)",
                                           "scatterbrain(sparse(local(window=5)), heads=2, position=rope, conv=short)"])
def test_causal_by_autograd(text):
    check_causal_by_autograd(text)


def _reference_rope(x, base, direction: int = 1):
    """Rotate pairs (i, i + d/2) by t / base^(2i/d) (``direction`` -1: the other way), written as a complex product
    (float64)."""
    L, d = x.shape[-2], x.shape[-1]
    half = d // 2
    t = torch.arange(L, dtype=torch.float64).view(-1, 1)
    angle = t * base ** (-torch.arange(half, dtype=torch.float64) / half)
    z = torch.complex(x[..., :half], x[..., half:]) * torch.exp(1j * direction * angle)
    return torch.cat([z.real, z.imag], dim=-1)


def test_rope_softmax_equals_the_definition_and_depends_only_on_offsets():
    mixer = _mixer("softmax(heads=2, position=rope)")
    x = torch.randn(2, 63, 24, dtype=torch.float64)
    q = mixer._heads(mixer.q_proj(x), 12)
    k = mixer._heads(mixer.k_proj(x), 12)
    v = mixer._heads(mixer.v_proj(x), 12)
    qr, kr = _reference_rope(q, 10000.0), _reference_rope(k, 10000.0)
    scores = (qr @ kr.transpose(-1, -2)) / math.sqrt(12)
    scores = scores.masked_fill(torch.ones(63, 63, dtype=torch.bool).triu(1), float("-inf"))
    expected = mixer._output(torch.softmax(scores, -1) @ v, x)
    assert _close(mixer(x), expected)
    # a score q_t . k_s after rotation depends on t - s only: shifting both positions changes nothing
    a_q, a_k = mixer.position.rotate(q, k, 0)
    b_q, b_k = mixer.position.rotate(q, k, 1000)
    assert torch.allclose(a_q @ a_k.transpose(-1, -2), b_q @ b_k.transpose(-1, -2), atol=1e-9)


def test_rope_turning_the_other_way_is_the_conjugate_rotation_in_every_mode_and_depends_only_on_offsets():
    """`reverse: true` (nanochat's rotate_half [x2, -x1]): each pair turned by -t / base^(2i/d), against the complex
    product by exp(-i angle); scores still depend only on t - s; modes, decoding and causality as any RoPE."""
    mixer = _mixer("softmax(heads=2, position=rope(reverse=true))")
    x = torch.randn(2, 29, 24, dtype=torch.float64)
    q, k, v = (mixer._heads(projection(x), 12) for projection in (mixer.q_proj, mixer.k_proj, mixer.v_proj))
    scores = (_reference_rope(q, 10000.0, -1) @ _reference_rope(k, 10000.0, -1).transpose(-1, -2)) / math.sqrt(12)
    scores = scores.masked_fill(torch.ones(29, 29, dtype=torch.bool).triu(1), float("-inf"))
    assert _close(mixer(x), mixer._output(torch.softmax(scores, -1) @ v, x))
    assert not _close(mixer(x), _mixer("softmax(heads=2, position=rope)")(x))  # the direction changes the function
    a_q, a_k = mixer.position.rotate(q, k, 0)
    b_q, b_k = mixer.position.rotate(q, k, 1000)
    assert torch.allclose(a_q @ a_k.transpose(-1, -2), b_q @ b_k.transpose(-1, -2), atol=1e-9)
    check_modes_agree_and_step_equals_forward("linear(heads=3, feature_map=elu1, position=rope(reverse=true))")
    check_causal_by_autograd("softmax(heads=2, position=rope(reverse=true))")


def test_a_query_scale_is_the_definition_in_every_mode_through_decoding_and_packed_documents():
    """`query_scale_beta`/`query_scale_period`/`query_scale_offset`: queries times 1 + β ln(1 + floor((t + o) / P))
    after RoPE (Ministral 3's) or without positions (Llama 4's NoPE layers, from t + 1), against the definition
    (softmax), in every mode of a linear mixer reading the same queries, with gradients, through the decoding step,
    and restarting with each packed document's positions."""
    mixer = _mixer("softmax(heads=2, position=rope, query_scale_beta=0.7, query_scale_period=5)")
    x = torch.randn(2, 23, 24, dtype=torch.float64, requires_grad=True)
    q, k, v = (mixer._heads(projection(x), 12) for projection in (mixer.q_proj, mixer.k_proj, mixer.v_proj))
    t = torch.arange(23, dtype=torch.float64).view(-1, 1)
    qr = _reference_rope(q, 10000.0) * (1 + 0.7 * torch.log(1 + torch.floor(t / 5)))
    scores = (qr @ _reference_rope(k, 10000.0).transpose(-1, -2)) / math.sqrt(12)
    scores = scores.masked_fill(torch.ones(23, 23, dtype=torch.bool).triu(1), float("-inf"))
    expected = mixer._output(torch.softmax(scores, -1) @ v, x)
    ours = mixer(x)
    assert _close(ours, expected)
    cotangent = torch.randn_like(ours)
    assert torch.allclose(torch.autograd.grad(ours, x, cotangent)[0], torch.autograd.grad(expected, x, cotangent)[0],
                          rtol=0, atol=1e-10)
    assert not _close(ours, _mixer("softmax(heads=2, position=rope)")(x))  # the scale changes the function
    check_modes_agree_and_step_equals_forward(
        "linear(heads=3, feature_map=elu1, position=rope, query_scale_beta=0.5, query_scale_period=4)")
    nope = _mixer("softmax(heads=2, position=none, query_scale_beta=0.4, query_scale_period=3, query_scale_offset=1)")
    q, k, v = (nope._heads(projection(x), 12) for projection in (nope.q_proj, nope.k_proj, nope.v_proj))
    scores = (q * (1 + 0.4 * torch.log(1 + torch.floor((t + 1) / 3)))) @ k.transpose(-1, -2) / math.sqrt(12)
    scores = scores.masked_fill(torch.ones(23, 23, dtype=torch.bool).triu(1), float("-inf"))
    assert _close(nope(x), nope._output(torch.softmax(scores, -1) @ v, x))
    # packed documents: positions restart at each document, and so does the scale
    from attnspec.ops.documents import from_ids

    with torch.no_grad():
        packed = mixer(x.detach(), documents=from_ids(torch.tensor([[0] * 9 + [1] * 14] * 2)))
        assert _close(packed[:, 9:], mixer(x.detach()[:, 9:]))


def test_alibi_softmax_is_softmax_with_linear_biases():
    mixer = _mixer("softmax(heads=4, position=alibi)")
    x = torch.randn(2, 45, 24, dtype=torch.float64)
    q, k, v, _ = mixer._project(x)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)], dtype=torch.float64).view(1, 4, 1, 1)
    t = torch.arange(45, dtype=torch.float64)
    bias = -slopes * (t.view(-1, 1) - t.view(1, -1))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(6) + bias
    scores = scores.masked_fill(torch.ones(45, 45, dtype=torch.bool).triu(1), float("-inf"))
    assert _close(mixer(x), mixer._output(torch.softmax(scores, -1) @ v, x))


def test_short_convolution_is_the_explicit_causal_sum():
    mixer = _mixer("linear(heads=3, feature_map=elu1, conv=short(width=3, projections=[q]))")
    x = torch.randn(2, 20, 24, dtype=torch.float64)
    w = mixer.conv.filters["q"]  # (C, width), tap width-1 is the current position
    projected = mixer.q_proj(x)
    expected = sum(w[:, j] * F.pad(projected, (0, 0, 2 - j, 0))[:, :20] for j in range(3))
    got, state = mixer.conv("q", projected)
    assert torch.allclose(got, expected, atol=1e-12)
    assert torch.equal(state, projected[:, -2:])


def test_token_shift_starts_as_the_mean_of_neighbours():
    mixer = _mixer("linear(heads=3, feature_map=elu1, conv=shift)")
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    shifted, _ = mixer.conv("x", x)
    previous = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    assert torch.allclose(shifted, (x + previous) / 2, atol=1e-15)


def _model(position: str, mixer: str = "linear(heads=2, feature_map=elu1)"):
    spec = loads_spec(f'name = "t"\ninput = tokens(vocab_size=11)\nd_model = 16\nmax_len = 40\ndtype = "float64"\n'
                      f"position = {position}\nlayers {{ block {{ mixer = {mixer} }} }}", "attn")
    return build_model_from_spec(spec)


@pytest.mark.parametrize("position", ["learned", "sinusoidal", 'sinusoidal(spacing="half_minus_one", offset=2)',
                                      "rope", "alibi"])
def test_model_level_positions_decode_like_the_full_sequence(position):
    model = _model(position, "linear(heads=2, feature_map=elu1, conv=short)")
    tokens = torch.randint(0, 11, (3, 31))
    full = model(tokens)
    state = model.init_state(3)
    for t in range(31):
        logits, *state = model.step(tokens[:, t], *state)
        assert torch.allclose(logits, full[:, t], atol=1e-10, rtol=1e-10), t
    # the positions change the function: the same tokens shifted by one position give other logits
    if position.startswith(("learned", "sinusoidal")):
        assert not torch.allclose(model.position.embed(torch.zeros(1, 3, 16, dtype=torch.float64), 1),
                                  model.position.embed(torch.zeros(1, 3, 16, dtype=torch.float64), 0))


def test_model_level_rope_reaches_every_mixer_unless_it_names_its_own():
    spec = loads_spec('name = "t"\ninput = tokens(vocab_size=11)\nd_model = 16\nmax_len = 40\nposition = rope\n'
                      "layers { block { mixer = softmax(heads=2) }\n block { mixer = softmax(heads=2, position=none) } }",
                      "attn")
    first, second = (block.mixer for block in spec.layers)
    assert first.position.kind == "rope" and second.position.kind == "none"


@pytest.mark.parametrize("text, message", [
    ("softmax(heads=2, position=learned)", "at the model level"),
    ("softmax(heads=2, position=alibi, causal=false)", "needs `causal: true`"),
    ("linear(heads=2, d_qk=5, position=rope)", "d_qk must be even"),
    ("linear(heads=2, conv=short(projections=[q, q]))", "named once"),
    ("linear(heads=2, conv=short(width=1))", "width"),
    ("linear(heads=2, feature_map=identity, normalize=false, transition=data(magnitude_init=[0.99, 0.5]))",
     "lo <= hi"),
    ("linear(heads=2, feature_map=identity, normalize=false, transition=fixed(phase_init=[0, 1]))",
     "complex"),
])
def test_impossible_positions_and_inits_are_located_errors(text, message):
    with pytest.raises(SpecError) as error:
        _mixer(text)
    assert message in str(error.value)


def test_gate_initialisation_follows_the_spec():
    mixer = _mixer("linear(heads=24, d_qk=1, d_v=1, feature_map=identity, normalize=false, "
                   "transition=data(magnitude_init=[0.9, 0.99], phase_init=[0, 0.2]))")
    decay = mixer.transition(torch.zeros(1, 1, 24, dtype=torch.float64))
    magnitude = decay.log_mag.exp().flatten()
    assert torch.allclose(magnitude, torch.linspace(0.9, 0.99, 24, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(decay.phase.flatten(), torch.linspace(0, 0.2, 24, dtype=torch.float64), atol=1e-6)
    fixed = _mixer("linear(heads=3, feature_map=identity, normalize=false, "
                   "transition=fixed(complex=true, magnitude_init=[0.5, 0.7], phase_init=[0.1, 0.3]))")
    decay = fixed.transition(torch.zeros(1, 1, 24, dtype=torch.float64))
    assert torch.allclose(decay.log_mag.exp().flatten(), torch.tensor([0.5, 0.6, 0.7], dtype=torch.float64), atol=1e-6)


def test_init_scale_multiplies_the_projections():
    torch.manual_seed(0)
    one = _mixer("linear(heads=3, feature_map=elu1)")
    three = _mixer("linear(heads=3, feature_map=elu1, init_scale=3)")
    assert torch.allclose(three.q_proj.weight, 3 * one.q_proj.weight)


@pytest.mark.parametrize("d_model", [16, 15])
@pytest.mark.parametrize("spacing, offset", [("half", 0), ("half_minus_one", 2)])
def test_sinusoids_are_the_published_tables(d_model, spacing, offset):
    """Vaswani et al.'s (sin(t / 10000^(2i/d)) in the first half, cos in the second) and tensor2tensor's as
    fairseq and XGLM build theirs (frequencies exp(-i ln(10000) / (d/2 - 1)), rows from position 2), written
    here from those definitions in float64; an odd width's last channel holds no position; a decoding
    step's offset continues the table."""
    spec = loads_spec(f'name = "t"\ninput = tokens(vocab_size=11)\nd_model = {d_model}\nmax_len = 40\n'
                      f'dtype = "float64"\nposition = sinusoidal(spacing="{spacing}", offset={offset})\n'
                      "layers { block { mixer = softmax(heads=1) } }", "attn")
    position = build_model_from_spec(spec).position
    half = d_model // 2
    span = half - 1 if spacing == "half_minus_one" else half
    t = torch.arange(offset, offset + 9, dtype=torch.float64)[:, None]
    angle = t * torch.exp(-torch.arange(half, dtype=torch.float64) * math.log(10000.0) / span)[None]
    expected = torch.cat([angle.sin(), angle.cos(), torch.zeros(9, d_model - 2 * half, dtype=torch.float64)], -1)
    zeros = torch.zeros(1, 9, d_model, dtype=torch.float64)
    assert torch.allclose(position.embed(zeros)[0], expected, atol=1e-12, rtol=0)
    assert torch.allclose(position.embed(zeros[:, :1], 5)[0, 0], expected[5], atol=1e-12, rtol=0)
