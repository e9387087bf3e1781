"""transformers' ``phi`` model type (Phi-1, Phi-1.5, Phi-2) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, rename, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Phi(Architecture):
    """Phi: attention and a plain MLP side by side on one LayerNorm's output (``parallel: shared_norm``):
    softmax attention (GQA, biases, RoPE on the first ``partial_rotary_factor`` of each head, half by default)
    and ``fc1``, ``hidden_act``, ``fc2`` with biases; a final LayerNorm and an untied head with a bias."""

    model_types = ("phi",)
    causal_lm = {"phi": "PhiForCausalLM"}

    rows = (
        Row(("phi",),
            "attention (GQA, biases, partial RoPE) and a plain biased MLP side by side on one LayerNorm's output "
            "(`parallel: shared_norm`), a head with a bias (`head.bias`)",
            "LayerNorms on q and k (`qk_layernorm`); a tied head (its bias would be the embedding's)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("qk_layernorm", bool, False):
            raise config.refuse("qk_layernorm", "LayerNorms of each head's q and k (with biases): attnspec's QK-norm "
                                                "is an RMSNorm")
        if config.get("tie_word_embeddings", bool, False):
            raise config.refuse("tie_word_embeddings", "Phi's head has a bias, which a head tied to the embedding "
                                                       "table cannot have in attnspec")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads()
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_eps", 1e-5, positive=True)}
        mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": True,
                 "out_bias": True, "position": config.rope(head_dim, 0.5)}
        if kv_heads != heads:
            mixer["kv_heads"] = kv_heads
        block = {"mixer": mixer, "norm": norm, "parallel": "shared_norm",
                 "mlp": {"kind": "mlp", "hidden": config.count("intermediate_size"), "bias": True,
                         "activation": config.activation(default="gelu_new")}}
        return {**common_fields(config), "layers": compress_layers([block] * layers), "final_norm": norm,
                "head": {"kind": "lm", "tied": False, "scale": 1.0, "bias": True}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer = first.mixer
        if any(b != first for b in blocks) or first.parallel != "shared_norm" or first.norm.kind != "layernorm" \
                or spec.final_norm != first.norm or first.mlp.kind != "mlp" or not first.mlp.bias \
                or mixer.kind != "softmax" or getattr(mixer.position, "kind", None) != "rope" \
                or not (mixer.qkv_bias and mixer.out_bias) or mixer.qk_norm != "none" or mixer.d_qk != mixer.d_v \
                or getattr(mixer, "window", None) is not None or mixer.position.interleaved \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) or spec.head.tied or not spec.head.bias:
            raise NotExpressible("phi is alike parallel blocks of biased RoPE attention and a plain MLP on one "
                                 "LayerNorm, and a head with a bias")
        rope = {**rope_config(mixer.position), "partial_rotary_factor": mixer.position.rotary_fraction}
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                "num_key_value_heads": mixer.kv_heads or mixer.heads, "head_dim": mixer.d_qk,
                "intermediate_size": first.mlp.hidden, "hidden_act": ACTIVATION_NAMES[first.mlp.activation],
                "layer_norm_eps": first.norm.eps, "rope_parameters": rope, "qk_layernorm": False}

    def links(self, spec) -> list[Link]:
        links = [rename("model.embed_tokens.weight", "embed.weight")]
        links += [rename(f"model.final_layernorm.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        links += [rename(f"lm_head.{p}", f"head.{p}") for p in ("weight", "bias")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            pairs = [(f"self_attn.{n}_proj", f"mixer.{n}_proj") for n in "qkv"]
            pairs += [("self_attn.dense", "mixer.out_proj"), ("mlp.fc1", "mlp.up"), ("mlp.fc2", "mlp.down"),
                      ("input_layernorm", "norm1")]
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in pairs for p in ("weight", "bias")]
        return links


ARCHITECTURES = (Phi(),)
