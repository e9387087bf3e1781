"""transformers' ``recurrent_gemma`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, head_node, lm_links, rename,
                                           rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class RecurrentGemma(Architecture):
    """RecurrentGemma (Griffin): RG-LRU recurrent blocks and local multi-query attention (partial RoPE, a
    window, a biased output projection) in ``block_types``' cycle, each followed by a biased tanh-GeLU GLU
    MLP of half ``intermediate_size``; RMSNorms of weight 1 + w, embeddings times sqrt(hidden_size)
    rounded to bfloat16 as transformers does, a tied head with a logit soft-cap."""

    model_types = ("recurrent_gemma",)
    causal_lm = {"recurrent_gemma": "RecurrentGemmaForCausalLM"}

    rows = (
        Row(("recurrent_gemma",),
            "RG-LRU blocks (the `rglru` mixer: Griffin's block with its block-diagonal gates) and local MQA attention"
            " (window, partial RoPE 0.5, a biased output projection) in the `block_types` cycle, each with a biased "
            "tanh-GeLU GLU; embeddings times sqrt(d) rounded to bfloat16 as transformers does; soft-capped tied head"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        eps = config.number("rms_norm_eps", 1e-6)
        heads, kv_heads, head_dim = config.attention_heads(None)
        cycle = config.get("block_types", list, ["recurrent", "recurrent", "attention"])
        if not cycle or any(t not in ("recurrent", "attention") for t in cycle):
            raise config.refuse("block_types", "must list recurrent and attention blocks")
        width = config.count("lru_width", d_model, limit=limits.MAX_INNER)
        act = config.activation("hidden_activation")
        recurrent = {"kind": "rglru", "heads": heads, "width": width, "activation": act, "qkv_bias": True,
                     "out_bias": True, "conv": {"kind": "short", "width": config.count("conv1d_width", 4,
                                                                                       limit=limits.MAX_CONV_WIDTH),
                                                "projections": ["v"], "bias": True}}
        attention = {"kind": "softmax", "heads": heads, "qkv_bias": config.get("attention_bias", bool, False),
                     "out_bias": True, "window": config.count("attention_window_size", 2048),
                     "position": config.rope(head_dim, 0.5),
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        mlp = {"kind": "glu", "hidden": config.count("intermediate_size") // 2, "activation": act, "bias": True}
        blocks = [{"mixer": recurrent if cycle[i % len(cycle)] == "recurrent" else attention, "mlp": mlp,
                   "norm": rmsnorm_node(eps)} for i in range(layers)]
        import torch

        common = common_fields(config)
        common["input"]["scale"] = float(torch.tensor(math.sqrt(d_model), dtype=torch.bfloat16))
        head = {**head_node(config, True), "softcap": config.number("logits_soft_cap", 30.0)}
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        recurrent = next((b.mixer for b in blocks if b.mixer.kind == "rglru"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if recurrent is None or attention is None or any(b.mixer.kind not in ("rglru", "softmax") for b in blocks):
            raise NotExpressible("recurrent_gemma has RG-LRU blocks and local attention blocks")
        types = ["recurrent" if b.mixer.kind == "rglru" else "attention" for b in blocks]
        period = next(p for p in range(1, len(types) + 1) if all(types[i] == types[i % p] for i in range(len(types))))
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                "lru_width": recurrent.width, "conv1d_width": recurrent.conv.width,
                "attention_window_size": attention.window, "attention_bias": attention.qkv_bias,
                "intermediate_size": 2 * blocks[0].mlp.hidden,
                "hidden_activation": ACTIVATION_NAMES[recurrent.activation],
                "block_types": types[:period], "logits_soft_cap": spec.head.softcap,
                "rope_parameters": {**rope_config(attention.position),
                                    "partial_rotary_factor": attention.position.rotary_fraction}}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.final_norm.weight", 1.0)
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            t, m = f"{theirs}temporal_block.", f"{ours}mixer."
            if block.mixer.kind == "rglru":
                names = [f"{n}.{p}" for n in ("linear_x", "linear_y", "linear_out") for p in ("weight", "bias")]
                links += [rename(f"{t}{n}", f"{m}{n}") for n in names]
                gates = [f"{g}_gate_{p}" for g in ("input", "recurrent") for p in ("weight", "bias")]
                lru = ["recurrent_param", *gates]
                links += [rename(f"{t}rg_lru.{n}", f"{m}{n}") for n in lru]
                links += [Link(f"{t}conv_1d.weight", (f"{m}conv.filters.v",), conv=True),
                          rename(f"{t}conv_1d.bias", f"{m}conv.biases.v")]
            else:
                links += attention_links(t, m, block.mixer.qkv_bias)
                if not block.mixer.qkv_bias:
                    links.append(rename(f"{t}o_proj.bias", f"{m}out_proj.bias"))
            links += [rename(f"{theirs}temporal_pre_norm.weight", f"{ours}norm1.weight", 1.0),
                      rename(f"{theirs}channel_pre_norm.weight", f"{ours}norm2.weight", 1.0)]
            links += glu_links(f"{theirs}mlp_block.", f"{ours}mlp.", True)
        return links


ARCHITECTURES = (RecurrentGemma(),)
