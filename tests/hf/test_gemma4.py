"""Gemma 4 (`gemma4_text`, `gemma4_unified_text` and their multimodal releases' text models) held to transformers:
tiny random models from their own config classes, every weight and each layer's stored `layer_scalar` perturbed, with
windowed and global layers of different head widths and key/value heads, proportional RoPE on the global ones, the
last layers reading the keys and values of the last unshared layer of their type (with MLPs twice as wide), values
from the keys' projection where `attention_k_eq_v`, and a logit soft-cap. Logits within the suite's bound, greedy
generation token for token (transformers' cache, which shares its layers' key/value states), and `export-hf` loading
back as the type's own class with equal logits.

transformers 5.24's Gemma 4 text model fails on any prompt when it shares keys and values without per-layer inputs
(`_maybe_slice_kv_shared_inputs` slices the absent per-layer inputs): that optimisation, which only drops the prompt
positions whose logits are not asked for, is turned off here for both sides of the comparison."""

from __future__ import annotations

import json

import pytest
import torch

from attnspec.errors import InteropError
from attnspec.interop.convert import spec_from_checkpoint
from tests.hf.test_interop import VOCAB, _holds_to, _perturbed, _text_model_holds_to, spec_blocks

TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention",
         "sliding_attention", "full_attention"]
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=7, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, global_head_dim=16, max_position_embeddings=64, sliding_window=5,
            num_kv_shared_layers=3, use_double_wide_mlp=True, layer_types=TYPES, final_logit_softcapping=30.0)


@pytest.fixture(autouse=True)
def _whole_prompts(monkeypatch):
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    monkeypatch.setattr(Gemma4TextModel, "_maybe_slice_kv_shared_inputs",
                        lambda self, hidden, per_layer, positions, masks, *args, **kwargs:
                        (hidden, per_layer, positions, masks))


def _scalars_perturbed(model):
    """Each layer's `layer_scalar` (a stored buffer, ones at initialisation) away from 1."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(0.5 + torch.rand(1))
    return model


def _gemma4_text(**fields):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    return _scalars_perturbed(_perturbed(
        lambda: Gemma4ForCausalLM(Gemma4TextConfig(**{**TEXT, "hidden_size_per_layer_input": 0, **fields}))))


@pytest.mark.parametrize("fields", [{}, {"attention_k_eq_v": True, "num_global_key_value_heads": 1}],
                         ids=["own-values", "k-eq-v"])
def test_gemma4_text_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, fields):
    spec = _holds_to(_gemma4_text(**fields), tmp_path / "checkpoint", "gemma4_text")
    mixers = [block.mixer for block in spec_blocks(spec)]
    assert [m.kv_from or m.lends_kv for m in mixers] == [None, "full", None, "sliding", "full", "sliding", "full"]
    assert [m.kv_from is not None for m in mixers] == [False] * 4 + [True] * 3
    assert [m.d_qk for m in mixers] == [8, 16, 8, 8, 16, 8, 16]
    assert [block.mlp.hidden for block in spec_blocks(spec)] == [48] * 4 + [96] * 3
    assert [m.values_from_keys for m in mixers[:4]] == [False, bool(fields)] + [False] * 2
    assert mixers[1].position.proportional and mixers[1].position.rotary_width(16) == 4


def test_gemma4_unified_text_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedTextConfig
    from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedForCausalLM

    reference = _scalars_perturbed(_perturbed(lambda: Gemma4UnifiedForCausalLM(Gemma4UnifiedTextConfig(**{
        **TEXT, "num_kv_shared_layers": 2, "attention_k_eq_v": True, "use_double_wide_mlp": False}))))
    _holds_to(reference, tmp_path / "checkpoint", "gemma4_unified_text")


@pytest.mark.parametrize("release", ["gemma4", "gemma4_unified"])
def test_the_text_model_of_a_multimodal_gemma4_imports_logit_equal(tmp_path, release):
    import transformers

    config = getattr(transformers, "Gemma4Config" if release == "gemma4" else "Gemma4UnifiedConfig")
    model = getattr(transformers, "Gemma4ForConditionalGeneration" if release == "gemma4"
                    else "Gemma4UnifiedForConditionalGeneration")
    text = {**TEXT, "hidden_size_per_layer_input": 0} if release == "gemma4" else TEXT
    reference = _scalars_perturbed(_perturbed(
        lambda: model(config(text_config=text, vision_config=None, audio_config=None))))
    spec, _ = _text_model_holds_to(reference, tmp_path / "checkpoint", release, f"{release}_text")
    assert sum(block.mixer.kv_from is not None for block in spec_blocks(spec)) == 3


@pytest.mark.parametrize("fields, field, words", [
    ({}, "hidden_size_per_layer_input", "per-layer input embeddings"),  # gemma4_text's default: 256
    ({"hidden_size_per_layer_input": 0, "enable_moe_block": True}, "enable_moe_block", "mixture of experts"),
    ({"hidden_size_per_layer_input": 0, "use_bidirectional_attention": "all"}, "use_bidirectional_attention",
     "causal"),
    ({"hidden_size_per_layer_input": 0, "num_kv_shared_layers": 7}, "num_kv_shared_layers", "another model's"),
    ({"hidden_size_per_layer_input": 0, "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                                            "sliding_attention": {"rope_type": "default"}}},
     "rope_parameters.full_attention.rope_type", "default or proportional"),
    ({"hidden_size_per_layer_input": 0, "rope_parameters": {  # 1e308 once overflowed to a NaN channel count
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1e308},
        "sliding_attention": {"rope_type": "default"}}},
     "rope_parameters.full_attention.partial_rotary_factor", "at most 1"),
])
def test_what_gemma4_imports_without_is_refused_by_field(tmp_path, fields, field, words):
    data = {"model_type": "gemma4_text", **{k: v for k, v in TEXT.items() if k != "global_head_dim"}, **fields}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(InteropError) as error:
        spec_from_checkpoint(tmp_path)
    assert f"`{field}`" in str(error.value) and words in str(error.value)
