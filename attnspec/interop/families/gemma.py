"""transformers' ``gemma`` model type (Gemma 1) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math
from typing import Any

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, head_node, lm_links, rename,
                                           rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Gemma(Architecture):
    """Gemma 1: Llama's layout with RMSNorms that multiply by 1 + w (stored as w + 1 here), embeddings
    times sqrt(hidden_size), a tanh-GeLU GLU, heads of ``head_dim`` apart from the width, a tied head."""

    model_types = ("gemma",)
    causal_lm = {"gemma": "GemmaForCausalLM"}

    rows = (
        Row(("gemma",),
            "Gemma 1: softmax attention (GQA, RoPE with its scaling, `head_dim`, biases with `attention_bias`), a "
            "GLU of `hidden_act` (tanh-GeLU), RMSNorms whose weights are 1 + w, embeddings times sqrt(d), a tied "
            "head",
            "`use_bidirectional_attention`; as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        if config.get("use_bidirectional_attention", bool, False):
            raise config.refuse("use_bidirectional_attention", "bidirectional attention is not a causal language "
                                "model's; unset imports")
        heads, kv_heads, head_dim = config.attention_heads()
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        mixer: dict[str, Any] = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                                 "qkv_bias": bias, "out_bias": bias, "norm_eps": eps, "position": config.rope(head_dim)}
        if kv_heads != heads:
            mixer["kv_heads"] = kv_heads
        mlp = {"kind": "glu", "hidden": config.count("intermediate_size"), "bias": False,
               "activation": config.activation(default="gelu_pytorch_tanh")}
        common = common_fields(config)
        common["input"]["scale"] = math.sqrt(d_model)
        blocks = [{"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(eps)}] * layers
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first, mlp = blocks[0].mixer, blocks[0].mlp
        if first.kind != "softmax" or first.position is None or first.position.kind != "rope" or \
                spec.input.scale != math.sqrt(spec.d_model):
            raise NotExpressible("gemma is softmax attention with RoPE and embeddings times sqrt(d)")
        if any(getattr(b.mixer, "window", None) or b.mixer.qk_norm != "none" or b.norm_placement != "pre"
               for b in blocks):
            raise NotExpressible("gemma has no windows, no QK-norm and pre-norm blocks")
        return {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden, "num_hidden_layers": len(blocks),
                "num_attention_heads": first.heads, "num_key_value_heads": first.kv_heads or first.heads,
                "head_dim": first.d_qk, "hidden_act": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": first.norm_eps,
                "attention_bias": first.qkv_bias, "rope_parameters": rope_config(first.position)}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight", 1.0)
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight", 1.0),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight", 1.0)]
            links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


ARCHITECTURES = (Gemma(),)
