"""A stored tensor is never dropped unread.

Where an import treats a checkpoint tensor as a copy of another (a tied LM head, a later use of Zamba2's
shared block, MiniMax's decay tables computed from its slopes), transformers 5 reads the stored tensor
as it is: a tied head stored with other values than the embedding is loaded untied ("both are present
in the checkpoints with different values, so we will NOT tie them"), and so is a later shared block
whose numbers differ; MiniMax's decay buffers are loaded from the file. So the import compares each
such tensor with what attnspec's model would hold: equal, it imports as before; a head that differs
imports untied, logit-equal to transformers; a shared block's later use or a decay table that differs
(which attnspec's model cannot hold) is an InteropError naming the tensor, before anything is written.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnspec.errors import InteropError
from attnspec.interop.convert import convert_weights, spec_from_checkpoint
from tests.hf.test_interop import SMALL, _imported, _perturbed, _relative, _tokens

BOUND = 1e-4  # test_interop's: float32 logits of two implementations of one function


def _store(directory, change) -> None:
    """Rewrite ``directory``'s weights with ``change(tensors)`` applied."""
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _tied(model_type: str):
    import transformers

    if model_type == "ctrl":  # transformers' CTRL ties its head whatever the config says
        config = transformers.CTRLConfig(vocab_size=SMALL["vocab_size"], n_embd=32, n_layer=1, n_head=4, dff=48)
    else:
        config = transformers.CONFIG_MAPPING[model_type](**SMALL, head_dim=8, tie_word_embeddings=True)
    return _perturbed(lambda: transformers.AutoModelForCausalLM.from_config(config))


@pytest.mark.parametrize("model_type", ["llama", "nanochat", "qwen3", "gemma3_text", "ctrl"])
def test_a_tied_config_s_stored_head_imports_tied_when_equal_and_untied_as_transformers_when_not(tmp_path,
                                                                                                  model_type):
    from transformers import AutoModelForCausalLM

    reference = _tied(model_type)
    reference.save_pretrained(tmp_path / "same")
    embedding = reference.get_input_embeddings().weight.detach()
    _store(tmp_path / "same", lambda t: t.__setitem__("lm_head.weight", embedding.clone()))
    spec = spec_from_checkpoint(tmp_path / "same")[1]
    assert spec.head.tied  # an equal copy: tied, as the config says
    with torch.no_grad():
        assert _relative(_imported(tmp_path / "same", model_type)(_tokens()), reference(_tokens()).logits) < BOUND

    reference.save_pretrained(tmp_path / "other")
    head = 0.5 * torch.randn_like(embedding)
    _store(tmp_path / "other", lambda t: t.__setitem__("lm_head.weight", head))
    data, spec, _ = spec_from_checkpoint(tmp_path / "other")
    assert not spec.head.tied and "stores another head" in data["description"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "other").eval()  # transformers: the stored head
    assert torch.equal(loaded.lm_head.weight, head)
    with torch.no_grad():
        assert _relative(_imported(tmp_path / "other", model_type)(_tokens()), loaded(_tokens()).logits) < BOUND
    tied = spec_from_checkpoint(tmp_path / "same")[1]  # a spec that ties, given the other file: refused
    with pytest.raises(InteropError, match=r"lm_head.weight' differs .* a copy of the embedding.* `head.tied: false`"):
        convert_weights(tied, tmp_path / "other", model_type)


def test_a_config_alone_still_describes_its_model(tmp_path):
    """Nothing stored, nothing to compare: the spec of a config without weights is the config's."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **SMALL, "tie_word_embeddings": True}))
    assert spec_from_checkpoint(tmp_path)[1].head.tied


def test_a_later_use_of_zamba2_s_shared_block_imports_only_as_a_copy_of_the_first(tmp_path):
    from transformers import Zamba2Config, Zamba2ForCausalLM

    config = Zamba2Config(**{**SMALL, "num_hidden_layers": 3}, layers_block_type=["hybrid", "linear_attention",
                          "hybrid"], num_mem_blocks=1, adapter_rank=3, n_mamba_heads=4, mamba_d_state=6, chunk_size=8)
    reference = _perturbed(lambda: Zamba2ForCausalLM(config))
    first = "model.layers.0.shared_transformer.self_attn.q_proj.weight"
    later = first.replace("layers.0.", "layers.2.")
    reference.save_pretrained(tmp_path / "copy")
    _store(tmp_path / "copy", lambda t: t.__setitem__(later, t[first].clone()))  # written with every use
    with torch.no_grad():
        assert _relative(_imported(tmp_path / "copy", "zamba2")(_tokens()), reference(_tokens()).logits) < BOUND
    reference.save_pretrained(tmp_path / "other")
    _store(tmp_path / "other", lambda t: t.__setitem__(later, t[first] + 0.01))
    spec = spec_from_checkpoint(tmp_path / "other")[1]
    with pytest.raises(InteropError, match=f"{later}' differs .*shared block's weights in layer 0, which layer 2 calls"):
        convert_weights(spec, tmp_path / "other", "zamba2")
    reference.save_pretrained(tmp_path / "stranger")  # a use no layer makes: not part of the model
    _store(tmp_path / "stranger", lambda t: t.__setitem__(first.replace("layers.0.", "layers.1."), t[first].clone()))
    with pytest.raises(InteropError, match="is not part of the zamba2 model"):
        convert_weights(spec, tmp_path / "stranger", "zamba2")


def test_minimax_s_stored_decay_tables_import_only_as_its_slopes_make_them(tmp_path):
    from transformers import MiniMaxConfig, MiniMaxForCausalLM

    config = MiniMaxConfig(**{**SMALL, "intermediate_size": 24}, num_local_experts=2, num_experts_per_tok=1,
                           block_size=4, layer_types=["linear_attention", "full_attention"])
    reference = _perturbed(lambda: MiniMaxForCausalLM(config))
    reference.save_pretrained(tmp_path)
    spec = spec_from_checkpoint(tmp_path)[1]
    assert convert_weights(spec, tmp_path, "minimax")  # as saved: the tables its slopes make
    _store(tmp_path, lambda t: t.__setitem__("model.layers.0.self_attn.key_decay",
                                             t["model.layers.0.self_attn.key_decay"] * 0.5))
    loaded = MiniMaxForCausalLM.from_pretrained(tmp_path)  # transformers computes with the stored table
    assert not torch.allclose(loaded.model.layers[0].self_attn.key_decay, reference.model.layers[0].self_attn.key_decay)
    with pytest.raises(InteropError, match="key_decay' differs .*the table its slopes make with `block_size` 4"):
        convert_weights(spec, tmp_path, "minimax")
