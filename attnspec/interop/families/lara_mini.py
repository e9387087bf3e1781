"""transformers' ``lara_mini`` model type (Translated's Lara Mini) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, common_fields, compress_layers, expanded_blocks,
                                           expert_counts, glu_links, head_node, lm_links, rename, rmsnorm_node,
                                           rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.qwen3_next import Qwen3Next
from attnspec.spec import limits

PATTERN = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")
"""Lara Mini's layer types by default, repeated (its config class's)."""


class LaraMini(Qwen3Next):
    """Lara Mini: Qwen3.5's Gated DeltaNet layers (stored with their input projections fused in one ``in_proj``, rows
    ``[q | k | v | z | b | a]``, and the gated norm named ``out_norm``) between Qwen3's attention layers (QK-norm, no
    gate), windowed with RoPE on ``sliding_attention`` layers and without positions on ``full_attention`` ones; a
    mixture of experts in every layer (a softmax router's top-k renormalised with ``norm_topk_prob``, one ungated
    shared expert; the experts stored fused); plain RMSNorms; a tied head by default."""

    model_types = ("lara_mini",)
    causal_lm = {"lara_mini": "LaraMiniForCausalLM"}

    rows = (
        Row(("lara_mini",),
            "qwen3_5_text's Gated DeltaNet layers (its fused `in_proj` split row by row) and qwen3's attention layers "
            "(windowed with RoPE on `sliding_attention`, no positions on `full_attention`) in `layer_types` order; "
            "experts in every layer (softmax, top-k renormalised, one ungated shared expert); plain RMSNorms",
            "as qwen3_next"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        types = config.layer_types(layers, [PATTERN[i % len(PATTERN)] for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in PATTERN]
        if unknown:
            raise config.refuse("layer_types", f"{types[unknown[0]]!r} is none of {', '.join(sorted(set(PATTERN)))}",
                                unknown)
        heads, kv_heads, head_dim = config.attention_heads(head_dim=128)
        bias = config.get("attention_bias", bool, False)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qk_norm": "rmsnorm",
                     "norm_eps": eps, "qkv_bias": bias, "out_bias": bias,
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        sliding = {**attention, "window": config.count("sliding_window", 512), "position": config.rope(head_dim)}
        full = {**attention, "position": {"kind": "none"}}
        delta = self.delta_mixer(config, eps)
        experts, chosen = expert_counts(config, "num_experts", 128, "num_experts_per_tok", 4)
        moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": config.count("moe_intermediate_size", 512),
               "activation": config.activation(allowed=("silu",)), "scoring": "softmax",
               "normalize": config.get("norm_topk_prob", bool, True), "shared": 1,
               "shared_hidden": config.count("shared_expert_intermediate_size", 512)}
        mixers = {"linear_attention": delta, "sliding_attention": sliding, "full_attention": full}
        blocks = [{"mixer": mixers[t], "mlp": moe, "norm": rmsnorm_node(eps)} for t in types]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        delta = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        sliding = next((b.mixer for b in blocks if getattr(b.mixer, "window", None)), None)
        moe = blocks[0].mlp
        if delta is None or sliding is None or sliding.position.kind != "rope" or moe.kind != "moe" or any(
                b.mlp != moe for b in blocks) or moe.scoring != "softmax" or moe.shared != 1 or moe.shared_gate \
                or any(b.mixer.kind == "softmax" and (b.mixer.window is None) != (b.mixer.position.kind == "none")
                       for b in blocks):
            raise NotExpressible("lara_mini has Gated DeltaNet layers, windowed rotary attention layers and global "
                                 "position-free ones, the same softmax-routed experts with one shared in every layer")
        types = ["linear_attention" if b.mixer.kind == "delta" else
                 "sliding_attention" if b.mixer.window is not None else "full_attention" for b in blocks]
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "layer_types": types,
                "num_attention_heads": sliding.heads, "num_key_value_heads": sliding.kv_heads or sliding.heads,
                "head_dim": sliding.d_qk, "attention_bias": sliding.qkv_bias, "rms_norm_eps": sliding.norm_eps,
                "sliding_window": sliding.window,
                "rope_parameters": {**rope_config(sliding.position),
                                    "partial_rotary_factor": sliding.position.rotary_fraction},
                "hidden_act": ACTIVATION_NAMES[moe.activation], "num_experts": moe.experts,
                "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
                "norm_topk_prob": moe.normalize, "shared_expert_intermediate_size": moe.shared_hidden or moe.hidden,
                **self.delta_config(delta)}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            if block.mixer.kind == "delta":
                m = f"{theirs}linear_attn."
                links += [Link(f"{m}in_proj.weight", tuple(f"{ours}mixer.{n}.weight" for n in (
                              "q_proj", "k_proj", "v_proj", "gate", "beta_proj", "transition.dt_proj"))),
                          rename(f"{m}out_norm.weight", f"{ours}mixer.norm_weight")]
                links += self.delta_links(m, ours)
            else:
                a = f"{theirs}self_attn."
                links += [rename(f"{a}{n}_proj.weight", f"{ours}mixer.{n}_proj.weight") for n in "qkv"]
                links += [rename(f"{a}o_proj.weight", f"{ours}mixer.out_proj.weight"),
                          rename(f"{a}q_norm.weight", f"{ours}mixer.qk_norm.q"),
                          rename(f"{a}k_norm.weight", f"{ours}mixer.qk_norm.k")]
                if block.mixer.qkv_bias:
                    links += [rename(f"{a}{n}_proj.bias", f"{ours}mixer.{n}_proj.bias") for n in "qkv"]
                    links.append(rename(f"{a}o_proj.bias", f"{ours}mixer.out_proj.bias"))
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            mlp, routed = block.mlp, [f"{ours}mlp.routed.{e}." for e in range(block.mlp.experts)]
            # gate_up_proj (experts, 2 hidden, d): each expert's activated half (attnspec's up), then its linear one
            links += [rename(f"{theirs}mlp.gate.weight", f"{ours}mlp.router.weight"),
                      Link(f"{theirs}mlp.experts.gate_up_proj", tuple(f"{r}{n}.weight" for r in routed
                                                                      for n in ("up", "gate")), stack=mlp.experts),
                      Link(f"{theirs}mlp.experts.down_proj", tuple(f"{r}down.weight" for r in routed),
                           stack=mlp.experts),
                      *glu_links(f"{theirs}mlp.shared_expert.", f"{ours}mlp.shared.", False)]
        return links


ARCHITECTURES = (LaraMini(),)
