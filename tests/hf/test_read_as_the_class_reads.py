"""A family reads a config field only where the type's transformers class reads it.

``tie_word_embeddings``: the classes of :data:`attnspec.interop.architecture.NEVER_TIED_TYPES` declare no tied
weights, so their stored head is the head whatever the config says (a config that ties it imports the stored
head, logit-equal; without a stored head, the import names the missing tensor).

``partial_rotary_factor``: the classes of :data:`attnspec.interop.config.ROTARY_FRACTION_TYPES` rotate that
share of each head; every other class's default RoPE rotates the whole head whatever the config says, and
its scaled RoPE cannot run with a partial factor (transformers raises on the shapes). The set is held to
transformers' own source, and the behaviour to its logits.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from attnspec.errors import InteropError
from attnspec.interop.config import ROTARY_FRACTION_TYPES
from attnspec.interop.convert import spec_from_checkpoint
from tests.hf.test_interop import SMALL, _imported, _perturbed, _relative, _tokens, spec_blocks

BOUND = 1e-4  # test_interop's: float32 logits of two implementations of one function


def test_the_types_that_read_a_partial_rotary_factor_are_those_whose_modelling_code_reads_it():
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from attnspec.interop.registry import architectures

    reads = set()
    for model_type in architectures():
        module = importlib.import_module(getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]).__module__)
        if "partial_rotary_factor" in inspect.getsource(module):
            reads.add(model_type)
    assert reads == ROTARY_FRACTION_TYPES


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
def test_a_class_that_ignores_the_factor_rotates_the_whole_head_and_refuses_it_scaled(tmp_path, model_type):
    import transformers

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    config = transformers.CONFIG_MAPPING[model_type](**SMALL, rope_parameters=rope)
    reference = _perturbed(lambda: transformers.AutoModelForCausalLM.from_config(config))
    reference.save_pretrained(tmp_path / "default")
    spec = spec_from_checkpoint(tmp_path / "default")[1]
    assert all(block.mixer.position.rotary_fraction == 1.0 for block in spec_blocks(spec))
    with torch.no_grad():
        assert _relative(_imported(tmp_path / "default", model_type)(_tokens()), reference(_tokens()).logits) < BOUND
    scaled = transformers.CONFIG_MAPPING[model_type](**SMALL, rope_parameters={**rope, "rope_type": "linear",
                                                                               "factor": 2.0})
    with pytest.raises(RuntimeError):  # transformers' own model cannot run it
        transformers.AutoModelForCausalLM.from_config(scaled)(_tokens())
    reference.config.rope_parameters = scaled.rope_parameters
    reference.save_pretrained(tmp_path / "scaled")
    with pytest.raises(InteropError, match=r"rope_parameters.partial_rotary_factor`: .*rotates the whole head"):
        spec_from_checkpoint(tmp_path / "scaled")


def test_a_class_that_reads_the_factor_rotates_that_share(tmp_path):
    from transformers import GlmConfig, GlmForCausalLM

    config = GlmConfig(**SMALL, head_dim=8, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 0.5})
    reference = _perturbed(lambda: GlmForCausalLM(config))
    reference.save_pretrained(tmp_path)
    assert {b.mixer.position.rotary_fraction for b in spec_blocks(spec_from_checkpoint(tmp_path)[1])} == {0.5}
    with torch.no_grad():
        assert _relative(_imported(tmp_path, "glm")(_tokens()), reference(_tokens()).logits) < BOUND


def test_a_class_that_never_ties_its_head_is_imported_with_its_stored_head(tmp_path):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from attnspec.interop.architecture import NEVER_TIED_TYPES
    from attnspec.interop.registry import architectures

    never = {t for t in architectures()
             if not getattr(getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t]), "_tied_weights_keys", None)}
    assert never == NEVER_TIED_TYPES
    from transformers import xLSTMConfig, xLSTMForCausalLM

    config = xLSTMConfig(vocab_size=SMALL["vocab_size"], hidden_size=64, num_hidden_layers=1, num_heads=4,
                         qk_dim_factor=1.0, v_dim_factor=2.0, chunk_size=8, ffn_round_up_to_multiple_of=16,
                         max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=True)
    reference = _perturbed(lambda: xLSTMForCausalLM(config))
    assert reference.lm_head.weight is not reference.get_input_embeddings().weight  # the class never ties
    reference.save_pretrained(tmp_path)
    assert not spec_from_checkpoint(tmp_path)[1].head.tied
    with torch.no_grad():
        assert _relative(_imported(tmp_path, "xlstm")(_tokens()), reference(_tokens()).logits) < BOUND
