"""Cross-layer key/value sharing (`lends_kv` / `kv_from`; Gemma 3n and 4's `num_kv_shared_layers`, Brandon et al.
2024's cross-layer attention): an attention with `kv_from: NAME` has no key or value projection and attends with its
own queries over the keys and values of the latest earlier block that `lends_kv: NAME`. Held to the definition
written out in float64 (full and windowed lenders, grouped keys, forward and every parameter's gradient), to its
decoding (the borrower keeps no cache and reads its lender's, eager and compiled without recompiles), to causality,
to packed documents, to the regional compile and the mode verification, and its located errors."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.compiler.compile import check_compiled
from attnspec.compiler.verify import verify_model
from attnspec.errors import SpecError
from attnspec.spec.walk import iter_blocks
from tests.nn.decoding import assert_compiled_step_equals_full_pass, assert_decodes_as_full_pass
from tests.nn.test_documents import _assert_packed_equals_alone

D, VOCAB = 24, 53


def _attention(**mixer) -> dict:
    return {"mixer": {"kind": "softmax", "heads": 4, "kv_heads": 2, "d_qk": 6, "d_v": 5, "qk_norm": "rmsnorm",
                      "position": {"kind": "rope", "base": 100.0}, **mixer},
            "mlp": {"kind": "glu", "expansion": 2}, "norm": "rmsnorm"}


# Gemma 4's pattern, small: a global lender, a windowed one, then blocks reading each, one of them lending again
LAYERS = [_attention(lends_kv="full"), _attention(window=4, lends_kv="local"), _attention(kv_from="full"),
          _attention(window=4, kv_from="local"), _attention(lends_kv="full"), _attention(kv_from="full")]


def _spec(layers=None) -> dict:
    return {"name": "kv-sharing", "input": {"kind": "tokens", "vocab_size": VOCAB}, "d_model": D, "max_len": 48,
            "dtype": "float64", "layers": LAYERS if layers is None else layers}


def _model(layers=None):
    torch.manual_seed(0)
    model = attnspec.build(_spec(layers)).eval()
    with torch.no_grad():  # norms away from 1, so that a weight read in the wrong place shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """x (B, H, L, d) rotated at positions 0..L-1: channel i < d/2 turns with channel i + d/2 by t / base^(2i/d)."""
    L, d = x.shape[2], x.shape[3]
    angles = torch.arange(L, dtype=torch.float64)[:, None] * base ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], -1)


def _reference(model, tokens: torch.Tensor) -> torch.Tensor:
    """The definition in float64, from the model's weights by name: pre-norm blocks of RMSNorm, attention (q and k
    RMS-normalised per head, then rotated; grouped keys; causal, within a window where set) and a GLU; a block that
    reads lent keys and values uses the lender's, computed from the lender's own input, with its own queries."""
    B, L = tokens.shape
    x = model.embed.weight[tokens]
    lent = {}
    for (_, node), block in zip(iter_blocks(model.spec, expand=True), model.blocks):
        mixer, spec = block.mixer, node.mixer
        h = _rms(x, block.norm1.weight, block.norm1.eps)

        def heads(y, n, width):
            return y.view(B, L, n, width).transpose(1, 2)

        eps = mixer.norm_eps
        q = _rope(_rms(heads(h @ mixer.q_proj.weight.T, 4, 6), mixer.qk_norm["q"], eps), 100.0)
        if spec.kv_from is None:
            k = _rope(_rms(heads(h @ mixer.k_proj.weight.T, 2, 6), mixer.qk_norm["k"], eps), 100.0)
            v = heads(h @ mixer.v_proj.weight.T, 2, 5)
        else:
            k, v = lent[spec.kv_from]
        if spec.lends_kv is not None:
            lent[spec.lends_kv] = (k, v)
        t = torch.arange(L)
        allowed = (t[None, :] <= t[:, None]) & (t[:, None] - t[None, :] < (spec.window or L))
        outputs = []
        for head in range(4):  # query head h reads key/value head h // 2
            scores = q[:, head] @ k[:, head // 2].transpose(-1, -2) / 6 ** 0.5
            outputs.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, head // 2])
        x = x + torch.cat(outputs, -1) @ mixer.out_proj.weight.T
        x = x + block.mlp(block.norm2(x))
    return model._head(model.final_norm(x))


def test_a_block_reads_its_lenders_keys_and_values_as_defined_forward_and_backward():
    model = _model()
    assert [block.mixer.k_proj is None for block in model.blocks] == [False, False, True, True, False, True]
    assert model.kv_sources == [None, None, 0, 1, None, 4]  # the latest lender of the name: block 4 lends anew
    tokens = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    ours, reference = model(tokens), _reference(model, tokens)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(ours)
    parameters = list(model.parameters())
    for parameter, a, b in zip(model.named_parameters(), torch.autograd.grad(ours, parameters, cotangent),
                               torch.autograd.grad(reference, parameters, cotangent, allow_unused=True)):
        assert b is not None and torch.allclose(a, b, rtol=0, atol=1e-10), parameter[0]
    assert not any("k_proj" in name or "v_proj" in name for name, _ in model.blocks[2].named_parameters())


def test_decoding_reads_the_lenders_cache_and_keeps_none_of_its_own():
    model = _model()
    tokens = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(2))
    assert_decodes_as_full_pass(model, tokens, prompt=6)  # past the window: the ring has wrapped
    assert model.state_layout() == [3, 3, 0, 0, 3, 0]  # keys, values, bias of each lender; nothing for the readers
    assert model.state_size(16) == 2 * 16 * 2 * (6 + 5) + 4 * 2 * (6 + 5)  # two full caches and one window's
    assert_compiled_step_equals_full_pass(model, tokens[:, :8])


@pytest.mark.parametrize("decay", [{"position": "alibi"}, {"position": "none",
                                   "transition": {"kind": "data", "phase": "none", "per": "head"}}])
def test_a_reader_with_its_own_decay_keeps_its_bias_and_decodes_as_the_full_pass(tmp_path, decay):
    """The audit's case: a reader with ALiBi (or a data-dependent decay) over a lender's keys decoded with a
    ShapeError (its decay bias had no place in the lender's cache). Its decay is its own: the full pass adds
    -m_h (i - j) of its own slopes to the lender's keys' scores (checked against the definition), and decoding
    keeps that bias in the reader's state alone (B, H, C), eager, at rows of different positions, compiled,
    and through exported prefill and step programs."""
    from attnspec.compiler.export import export_prefill, export_step

    plain = {"kind": "softmax", "heads": 4, "kv_heads": 2, "d_qk": 6, "d_v": 5}
    layers = [{"mixer": {**plain, "lends_kv": "a", "position": "alibi"}, "mlp": "none", "norm": "rmsnorm"},
              {"mixer": {**plain, "kv_from": "a", **decay}, "mlp": "none", "norm": "rmsnorm"},
              {"mixer": {**plain, "window": 5, "lends_kv": "w"}, "mlp": "none", "norm": "rmsnorm"},
              {"mixer": {**plain, "window": 5, "kv_from": "w", **decay}, "mlp": "none", "norm": "rmsnorm"}]
    model = _model(layers)
    assert model.state_layout() == [3, 1, 3, 1]  # each reader: its own bias, nothing of the keys'
    tokens = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(5))
    if decay["position"] == "alibi":  # the reader's scores: its own queries, the lender's keys, its own slopes
        with torch.no_grad():
            h = model.blocks[0].norm1(model.embed.weight[tokens])
            lender, reader = model.blocks[0].mixer, model.blocks[1].mixer
            _, k, v, _ = lender._project(h, expand=False)
            out0 = lender(h)
            x = model.embed.weight[tokens] + out0
            q = reader._project(model.blocks[1].norm1(x), expand=False)[0]
            t = torch.arange(13)
            slopes = 2.0 ** (-8.0 * torch.arange(1, 5, dtype=torch.float64) / 4)
            scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 6 ** 0.5 \
                - slopes.view(4, 1, 1) * (t[:, None] - t[None, :])
            o = scores.masked_fill(t[None, :] > t[:, None], float("-inf")).softmax(-1) @ v.repeat_interleave(2, 1)
            expected = reader._output(o, model.blocks[1].norm1(x))
            assert torch.allclose(reader(model.blocks[1].norm1(x), kv=(k, v)), expected, rtol=0, atol=1e-12)
    assert_decodes_as_full_pass(model, tokens, prompt=6)  # past the window: the rings have wrapped
    assert_compiled_step_equals_full_pass(model, tokens[:, :8])
    prompts, mask = tokens[:2, :7].clone(), torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0  # the second row three positions behind the first
    assert torch.equal(model.generate(prompts, 4, attention_mask=mask)[1, 7:],
                       model.generate(prompts[1:, 3:], 4)[0, 4:])
    prefill = export_prefill(model, tmp_path / "prefill.pt2").module()
    step = export_step(model, tmp_path / "step.pt2").module()
    with torch.no_grad():
        given = model.init_state(2, 16)
        got, *state = prefill(tokens[:2, :7], *given)
        expected, *eager = model.prefill(tokens[:2, :7], last_only=True, capacity=16)
        assert (got - expected).abs().max() < 1e-12
        for position in range(7, 13):
            expected, *eager = model.step(tokens[:2, position], *eager)
            got, *state = step(tokens[:2, position], *state)
            assert (got - expected).abs().max() < 1e-12, position


def test_rows_at_different_positions_read_only_what_their_lender_wrote():
    model = _model()
    prompts = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompts)
    mask[1, :3] = 0  # the second row is left-padded: it is three positions behind the first
    together = model.generate(prompts, 5, attention_mask=mask)
    alone = model.generate(prompts[1:, 3:], 5)
    assert torch.equal(together[1, 7:], alone[0, 4:])


def test_the_output_at_a_position_reads_no_later_token():
    model = _model()
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(4))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % VOCAB
    with torch.no_grad():
        assert torch.equal(model(tokens)[:, :8], model(changed)[:, :8])


def test_packed_documents_compute_as_each_alone():
    _assert_packed_equals_alone(_model())


def test_the_model_compiles_in_one_graph_per_block_kind_at_every_length_and_verifies():
    model = _model()
    inputs = [torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(n)) for n in (9, 14)]
    report = check_compiled(model, inputs, atol=1e-10, rtol=1e-10, backend="aot_eager")  # raises on a recompile
    assert report["max_abs_diff"] <= 1e-10
    assert verify_model(model).ok


def test_explain_names_the_lender_and_the_reader():
    nodes = [node.mixer for _, node in iter_blocks(_model().spec, expand=True)]
    assert "lends kv as 'full'" in nodes[0].describe() and "kv from 'local'" in nodes[3].describe()
    assert ("kv_from", "local") in nodes[3].parts()


def _refusal(layers: list, path: str, words: str) -> None:
    with pytest.raises(SpecError) as error:
        attnspec.build(_spec(layers))
    problem = next((p for p in error.value.problems if p.path == path), None)
    assert problem is not None and words in problem.message, [(p.path, p.message) for p in error.value.problems]


@pytest.mark.parametrize("layers, path, words", [
    ([_attention(kv_from="full")], "layers[0].mixer.kv_from", "no earlier block lends keys and values as 'full'"),
    ([_attention(kv_from="full"), _attention(lends_kv="full")], "layers[0].mixer.kv_from", "no earlier block"),
    ([_attention(lends_kv="full"), _attention(kv_from="ful")], "layers[1].mixer.kv_from", "no earlier block"),
    ([_attention(lends_kv="full"), _attention(kv_from="full", kv_heads=4)], "layers[1].mixer.kv_from",
     "key_heads = 2"),
    ([_attention(lends_kv="full"), _attention(kv_from="full", d_qk=8)], "layers[1].mixer.kv_from", "d_qk = 6"),
    ([_attention(lends_kv="full"), _attention(kv_from="full", window=4)], "layers[1].mixer.kv_from",
     "window = None"),
    ([_attention(lends_kv="full"), _attention(kv_from="full", lends_kv="again")], "layers[1].mixer.lends_kv",
     "none of its own to lend"),
    ([_attention(lends_kv="full"), _attention(kv_from="full", conv={"kind": "short", "width": 3,
                                                                    "projections": ["k"]})],
     "layers[1].mixer.conv", "convolve `x` or `q` only"),
    ([_attention(lends_kv="full", differential=True, kv_heads=2)], "layers[0].mixer.lends_kv", "differential"),
    # in a repeat group, each copy must find its lender before it: the first copy finds none
    ([{"repeat": 2, "layers": [_attention(kv_from="full"), _attention(lends_kv="full")]}],
     "layers[0].layers[0].mixer.kv_from", "no earlier block"),
])
def test_impossible_sharing_is_a_located_error(layers, path, words):
    _refusal(layers, path, words)


def test_a_block_reading_keys_and_values_in_a_repeat_group_reads_the_latest_lender():
    layers = [{"repeat": 2, "layers": [_attention(lends_kv="full"), _attention(kv_from="full")]}]
    model = _model(layers)
    assert model.kv_sources == [None, 0, None, 2]
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(6))
    assert torch.allclose(model(tokens), _reference(model, tokens), rtol=0, atol=1e-12)


def test_a_mixer_reading_lent_keys_and_values_refuses_a_call_without_them():
    mixer = _model().blocks[2].mixer
    with pytest.raises(Exception, match="run it through the model"):
        mixer(torch.randn(1, 5, D, dtype=torch.float64))


def test_recomputed_blocks_give_the_same_gradients_to_lenders_and_readers():
    from attnspec.training.recompute import recompute_blocks

    tokens = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    plain, recomputed = _model().train(), _model().train()
    recompute_blocks(recomputed, list(range(len(LAYERS))))
    for model in (plain, recomputed):
        model(tokens).pow(2).mean().backward()
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-12), name
