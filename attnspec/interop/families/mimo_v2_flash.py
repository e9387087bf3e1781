"""transformers' ``mimo_v2_flash`` model type (Xiaomi's MiMo-V2-Flash) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import json

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, expert_counts, glu_links, glu_node,
                                           head_node, lm_links, moe_links, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class MiMoV2Flash(Architecture):
    """MiMo-V2-Flash: GQA attention with queries and keys ``head_dim`` wide and values ``v_head_dim`` wide (times
    ``attention_value_scale``, folded into the value projection), partial RoPE per layer type, windowed layers
    with twice the key/value heads and attention sinks, global ones without (``layer_types``: the first and every
    sixth global by default); a dense GLU or experts per layer by ``mlp_layer_types``: DeepSeek-V3's router
    (sigmoid scores, a correction bias, group-limited, renormalised with ``norm_topk_prob``, times
    ``routed_scaling_factor``) without shared experts."""

    model_types = ("mimo_v2_flash",)
    causal_lm = {"mimo_v2_flash": "MiMoV2FlashForCausalLM"}
    stored_names = {"mimo_v2_flash": ((r"\.self_attn\.sinks$", ".self_attn.attention_sink_bias"),)}
    """Its checkpoints name the sinks ``attention_sink_bias`` (transformers' conversion_mapping renames them)."""

    rows = (
        Row(("mimo_v2_flash",),
            "attention with values narrower than queries and keys (`d_v`; `attention_value_scale` folded into "
            "them), partial RoPE per layer type, windowed layers with twice the key/value heads and sinks, a GLU or "
            "experts per layer by `mlp_layer_types` (sigmoid, correction bias, group-limited, renormalised, scaled)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads = config.count("num_attention_heads"), config.count("num_key_value_heads", 4)
        head_dim, v_dim = config.count("head_dim", 192), config.count("v_head_dim", 128)
        if heads % (2 * kv_heads):
            raise config.refuse("num_key_value_heads", f"{heads} heads cannot share twice {kv_heads} key/value heads "
                                "(the windowed layers') equally")
        eps = config.number("rms_norm_eps", 1e-5)
        bias = config.get("attention_bias", bool, False)
        types = config.attention_layer_types(layers, ["full_attention" if i == 0 or not (i + 1) % 6
                                                      else "sliding_attention" for i in range(layers)])
        kinds = config.get("mlp_layer_types", list, None) or ["dense"] + ["sparse"] * (layers - 1)
        if len(kinds) != layers or any(kind not in ("dense", "sparse") for kind in kinds):
            raise config.refuse("mlp_layer_types", f"must name `dense` or `sparse` for each of the {layers} layers")
        window = config.count("sliding_window", 129)
        experts = self.experts(config) if "sparse" in kinds else None
        blocks = []
        for layer_type, kind in zip(types, kinds):
            local = layer_type == "sliding_attention"
            shared = 2 * kv_heads if local else kv_heads
            mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": v_dim, "qkv_bias": bias,
                     "out_bias": False, "position": config.rope(head_dim, layer_type=layer_type),
                     **({"kv_heads": shared} if shared != heads else {}),
                     **({"window": window, "sinks": True} if local else {})}
            blocks.append({"mixer": mixer, "mlp": glu_node(config) if kind == "dense" else experts,
                           "norm": rmsnorm_node(eps)})
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    @staticmethod
    def experts(config: Config) -> dict:
        experts, chosen = expert_counts(config, "n_routed_experts", 256, "num_experts_per_tok", 8)
        return {"kind": "moe", "experts": experts, "hidden": config.count("moe_intermediate_size", 2048),
                "top_k": chosen, "activation": config.activation(allowed=("silu",)), "scoring": "sigmoid",
                "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
                "routed_scale": config.number("routed_scaling_factor", 1.0) if config.data.get("routed_scaling_factor")
                is not None else 1.0, "groups": config.count("n_group", 1), "top_groups": config.count("topk_group", 1)}

    def weight_scales(self, spec, config: Config) -> dict[str, float]:
        """``attention_value_scale`` multiplies the values: folded into each value projection."""
        scale = config.number("attention_value_scale", 0.707) if config.data.get("attention_value_scale") is not None \
            else 1.0
        scales = {}
        for index, block in enumerate(expanded_blocks(spec)):
            mixer = f"{block_prefix(index)}mixer."
            scales[f"{mixer}v_proj.weight"] = scale
            if block.mixer.qkv_bias:
                scales[f"{mixer}v_proj.bias"] = scale
        return scales

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        first = mixers[0]
        if any(m.kind != "softmax" or m.qk_norm != "none" or m.output_gate != "none" or m.out_bias
               or (m.d_qk, m.d_v, m.heads, m.qkv_bias) != (first.d_qk, first.d_v, first.heads, first.qkv_bias)
               or b.norm_placement != "pre" for m, b in zip(mixers, blocks)):
            raise NotExpressible("mimo_v2_flash is one softmax attention shape in every block, ungated, without "
                                 "QK-norm or an output bias")
        local = [m.window is not None for m in mixers]
        kv = {(m.kv_heads or m.heads, windowed) for m, windowed in zip(mixers, local)}
        global_kv = {k for k, windowed in kv if not windowed}
        if len({m.window for m in mixers if m.window}) > 1 or any(m.sinks != windowed for m, windowed in
                                                                 zip(mixers, local)) \
                or len(global_kv) > 1 or any(k != 2 * next(iter(global_kv or {k // 2})) for k, w in kv if w):
            raise NotExpressible("mimo_v2_flash has one window, with sinks and twice the global layers' key/value "
                                 "heads on its windowed layers")
        rope = {}
        for m, windowed in zip(mixers, local):
            layer_type = "sliding_attention" if windowed else "full_attention"
            stated = {**rope_config(m.position), "partial_rotary_factor": m.position.rotary_fraction}
            if m.position.kind != "rope" or json.dumps(rope.setdefault(layer_type, stated), sort_keys=True) \
                    != json.dumps(stated, sort_keys=True):
                raise NotExpressible("mimo_v2_flash rotates every layer, with one RoPE per layer type")
        kv_heads = next(iter(global_kv)) if global_kv else (first.kv_heads or first.heads) // 2
        kinds = ["sparse" if b.mlp.kind == "moe" else "dense" for b in blocks]
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": first.heads,
                  "num_key_value_heads": kv_heads, "head_dim": first.d_qk, "v_head_dim": first.d_v,
                  "attention_bias": first.qkv_bias, "attention_value_scale": 1.0, "rms_norm_eps": blocks[0].norm.eps,
                  "layer_types": ["sliding_attention" if w else "full_attention" for w in local],
                  "sliding_window": next((m.window for m in mixers if m.window), 129), "rope_parameters": rope,
                  "mlp_layer_types": kinds, "tie_word_embeddings": spec.head.tied}
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if any(b.mlp.kind not in ("glu", "moe") for b in blocks):
            raise NotExpressible("mimo_v2_flash's MLPs are GLUs or experts")
        if dense is not None:
            config["intermediate_size"] = dense.hidden
        if moe is not None:
            if moe.scoring != "sigmoid" or not moe.score_bias or moe.shared or \
                    any(b.mlp != moe for b in blocks if b.mlp.kind == "moe"):
                raise NotExpressible("mimo_v2_flash's experts are sigmoid-scored with a correction bias and no shared "
                                     "experts, alike in every layer")
            config.update({"n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                           "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
                           "topk_group": moe.top_groups or moe.groups})
        config["hidden_act"] = ACTIVATION_NAMES[(dense or moe).activation]
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias, False)
            if block.mixer.sinks:
                links.append(rename(f"{theirs}self_attn.sinks", f"{ours}mixer.sinks"))
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            links += (moe_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.") if block.mlp.kind == "moe"
                      else glu_links(f"{theirs}mlp.", f"{ours}mlp.", False))
        return links


ARCHITECTURES = (MiMoV2Flash(),)
