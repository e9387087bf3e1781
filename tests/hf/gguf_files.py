"""Tiny GGUF files written as llama.cpp's converter writes them, from tiny random transformers models.

The test's truth is transformers reading the file (``from_pretrained(dir, gguf_file=...)``), not the model
the file was written from: a file states only what GGUF metadata carries, and transformers fills the rest
with its config class's defaults, as attnspec must.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def byte_alphabet() -> list[str]:
    """GPT-2's 256 byte characters, in byte order."""
    from attnspec.interop.gguf_tokenizer import _bytes_to_unicode

    table = _bytes_to_unicode()
    return [table[b] for b in range(256)]


TOKENS = [*byte_alphabet(), "Ġt", "th", "the", "<|endoftext|>"]
MERGES = ["Ġ t", "t h", "th e"]
"""A byte-level BPE vocabulary of 260 tokens (three merges and an end-of-text control token)."""


def write_gguf(model, path: Path, arch: str, qtype: str = "Q8_0", keys: dict | None = None) -> Path:
    """Write ``model`` (a transformers causal LM) as llama.cpp's converter would: its config as ``arch``'s
    metadata, :data:`TOKENS` as a byte-level tokenizer, 2-D weights quantised to ``qtype`` where their rows
    are whole blocks (F32 otherwise), Llama's q/k rows interleaved per rotary pair, Gemma's norms + 1."""
    import gguf
    from gguf import GGMLQuantizationType, MODEL_ARCH_NAMES, get_tensor_name_map
    from gguf.quants import quantize

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    prefix = f"{arch}."
    values = {"context_length": config.max_position_embeddings, "block_count": config.num_hidden_layers,
              "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
              "attention.head_count": config.num_attention_heads,
              "attention.head_count_kv": config.num_key_value_heads,
              "attention.layer_norm_rms_epsilon": config.rms_norm_eps, "vocab_size": config.vocab_size}
    for key, value in {**values, **(keys or {})}.items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(prefix + key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3 if t.startswith("<|") else 1 for t in TOKENS])
    writer.add_token_merges(MERGES)
    writer.add_eos_token_id(len(TOKENS) - 1)
    writer.add_bos_token_id(len(TOKENS) - 1)
    arch_id = next(key for key, value in MODEL_ARCH_NAMES.items() if value == arch)
    names = get_tensor_name_map(arch_id, config.num_hidden_layers)
    kind = getattr(GGMLQuantizationType, qtype)
    block = gguf.GGML_QUANT_SIZES[kind][0]
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        stem, _, suffix = name.rpartition(".")
        stored = f"{names.get_name(stem)}.{suffix}"
        array = tensor.detach().float().numpy().copy()
        if arch == "llama" and stored.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in stored else config.num_key_value_heads
            array = array.reshape(heads, 2, -1, array.shape[-1]).swapaxes(1, 2).reshape(array.shape)
        if arch.startswith("gemma") and stored.endswith("norm.weight"):
            array = array + 1
        if array.ndim == 2 and array.shape[-1] % block == 0 and kind != GGMLQuantizationType.F32:
            writer.add_tensor(stored, quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(stored, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def perturbed(model, seed: int = 0):
    """``model`` with every parameter moved by noise (zero- and one-initialised parts matter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, rope_theta=10000.0)
    torch.manual_seed(0)
    return perturbed(LlamaForCausalLM(config).eval()), {"rope.freq_base": 10000.0, "rope.dimension_count": 16}


def tiny_gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
                              sliding_window=4, query_pre_attn_scalar=256)
    torch.manual_seed(0)
    return perturbed(Gemma3ForCausalLM(config).eval()), {"rope.freq_base": 1_000_000.0,
                                                          "attention.key_length": 32, "attention.value_length": 32,
                                                          "attention.sliding_window": 4}
