"""transformers' ``afmoe`` model type (Arcee's AFMoE, the Trinity models) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, expert_counts, glu_links, glu_node,
                                           head_node, lm_links, moe_links, rename, rmsnorm_node, rope_config,
                                           shared_count)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Afmoe(Architecture):
    """AFMoE: sandwich norms (plain RMSNorms before and after each sub-layer), GQA attention with QK-norm and a
    sigmoid output gate of its own projection, windowed layers with RoPE and global ones without positions
    (``layer_types``; one global in ``global_attn_every_n_layers`` by default), GLU MLPs in the first
    ``num_dense_layers`` layers and experts after (sigmoid scores, a correction bias choosing but not weighting,
    renormalised top-k times ``route_scale``, shared experts as one MLP), embeddings times sqrt(hidden_size)
    with ``mup_enabled``."""

    model_types = ("afmoe",)
    causal_lm = {"afmoe": "AfmoeForCausalLM"}

    rows = (
        Row(("afmoe",),
            "sandwich norms, QK-norm, a sigmoid output gate (`output_gate`), windows with RoPE on `sliding_attention` "
            "layers and no positions on global ones, GLU MLPs in the first `num_dense_layers` layers then experts "
            "(sigmoid, correction bias, renormalised, `route_scale`, shared experts), `mup_enabled` as `input.scale`",
            "`attention_bias` (its gate has no bias where q, k, v and o would)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads(head_dim=128)  # AfmoeConfig's default
        if config.get("attention_bias", bool, False):
            raise config.refuse("attention_bias", "AFMoE's output gate takes no bias where q, k, v and o would take "
                                "one, and attnspec's gate shares theirs; false imports")
        eps = config.number("rms_norm_eps", 1e-5)
        every = config.count("global_attn_every_n_layers", 4)
        default = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
        types = config.attention_layer_types(layers, default)
        window = config.count("sliding_window", 1024)
        dense = config.get("num_dense_layers", int, 1)
        if not 0 <= dense <= layers:
            raise config.refuse("num_dense_layers", f"must be from 0 to the {layers} layers")
        experts = self.experts(config) if dense < layers else None
        blocks = []
        for index, layer_type in enumerate(types):
            local = layer_type == "sliding_attention"
            mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qk_norm": "rmsnorm",
                     "norm_eps": eps, "output_gate": "sigmoid",
                     "position": config.rope(head_dim) if local else {"kind": "none"},
                     **({"kv_heads": kv_heads} if kv_heads != heads else {}), **({"window": window} if local else {})}
            mlp = glu_node(config) if index < dense else experts
            blocks.append({"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(eps), "norm_placement": "sandwich"})
        common = common_fields(config)
        if config.get("mup_enabled", bool, False):
            common["input"]["scale"] = math.sqrt(config.count("hidden_size"))
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    @staticmethod
    def experts(config: Config) -> dict:
        """AFMoE's experts: ``num_experts`` GLUs of ``moe_intermediate_size``, sigmoid scores whose top
        ``num_experts_per_tok`` (chosen with the correction bias added) are renormalised and times
        ``route_scale``, beside ``num_shared_experts`` shared ones as one MLP that many times as wide."""
        experts, chosen = expert_counts(config, "num_experts", 64, "num_experts_per_tok", 6)
        shared = shared_count(config, "num_shared_experts", 2)
        hidden = config.count("moe_intermediate_size", 1408)
        return {"kind": "moe", "experts": experts, "hidden": hidden, "top_k": chosen,
                "activation": config.activation(), "scoring": "sigmoid", "score_bias": True, "normalize": True,
                "routed_scale": config.number("route_scale", 1.0), "shared": shared,
                **({"shared_hidden": shared * hidden} if shared else {})}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [block.mixer for block in blocks]
        if any(b.mixer.kind != "softmax" or b.norm_placement != "sandwich" for b in blocks):
            raise NotExpressible("afmoe is softmax attention with sandwich norms in every block")
        if any(m.qk_norm != "rmsnorm" or m.output_gate != "sigmoid" or m.qkv_bias or m.out_bias for m in mixers):
            raise NotExpressible("afmoe's attention normalises queries and keys, gates its output by a sigmoid and "
                                 "has no biases")
        local = [m.window is not None for m in mixers]
        if len({m.window for m in mixers if m.window is not None}) > 1:
            raise NotExpressible("afmoe has one window")
        if any((m.position.kind == "rope") != windowed for m, windowed in zip(mixers, local)):
            raise NotExpressible("afmoe rotates its windowed layers' queries and keys and no others'")
        ropes = {repr(sorted(rope_config(m.position).items())) for m in mixers if m.position.kind == "rope"}
        if len(ropes) > 1:
            raise NotExpressible("afmoe has one RoPE")
        kinds = [b.mlp.kind for b in blocks]
        dense = kinds.index("moe") if "moe" in kinds else len(kinds)
        if any(k != "glu" for k in kinds[:dense]) or any(k != "moe" for k in kinds[dense:]):
            raise NotExpressible("afmoe has GLU MLPs in its first layers and experts after them")
        first = mixers[0]
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": first.heads,
                  "num_key_value_heads": first.kv_heads or first.heads, "head_dim": first.d_qk,
                  "rms_norm_eps": blocks[0].norm.eps, "attention_bias": False, "num_dense_layers": dense,
                  "layer_types": ["sliding_attention" if w else "full_attention" for w in local],
                  "sliding_window": next((m.window for m in mixers if m.window is not None), 1024),
                  "tie_word_embeddings": spec.head.tied}
        rotated = next((m for m in mixers if m.position.kind == "rope"), None)
        if rotated is not None:
            config["rope_parameters"] = rope_config(rotated.position)
        scale = spec.input.scale
        if abs(scale - 1.0) > 1e-12 and abs(scale - math.sqrt(spec.d_model)) > 1e-9 * scale:
            raise NotExpressible("afmoe scales its embeddings by sqrt(hidden_size) or not at all")
        config["mup_enabled"] = abs(scale - 1.0) > 1e-12
        mlp = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if mlp is not None:
            config["intermediate_size"] = mlp.hidden
        if moe is not None:
            if moe.scoring != "sigmoid" or not moe.score_bias or not moe.normalize or moe.groups != 1 \
                    or (moe.shared and moe.shared_hidden != moe.shared * moe.hidden) or moe.shared_gate:
                raise NotExpressible("afmoe's experts are sigmoid-scored with a correction bias, renormalised, "
                                     "ungrouped, beside shared experts as wide as they are")
            config.update({"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "num_shared_experts": moe.shared,
                           "route_scale": moe.routed_scale})
        config["hidden_act"] = ACTIVATION_NAMES[(mlp or moe).activation]
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", False)
            links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q"),
                      rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k"),
                      rename(f"{theirs}self_attn.gate_proj.weight", f"{ours}mixer.gate.weight")]
            for their_norm, our_norm in (("input_layernorm", "norm1"), ("post_attention_layernorm", "post_norm1"),
                                         ("pre_mlp_layernorm", "norm2"), ("post_mlp_layernorm", "post_norm2")):
                links.append(rename(f"{theirs}{their_norm}.weight", f"{ours}{our_norm}.weight"))
            if block.mlp.kind == "moe":  # the router's weight under `router.gate`, its bias as `expert_bias`
                routed = moe_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.", shared="shared_experts",
                                   router="router.gate")
                links += [rename(f"{theirs}mlp.expert_bias", f"{ours}mlp.score_bias")
                          if link.theirs.endswith("e_score_correction_bias") else link for link in routed]
            else:
                links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


ARCHITECTURES = (Afmoe(),)
