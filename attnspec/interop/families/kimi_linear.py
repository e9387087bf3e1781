"""transformers' ``kimi_linear`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, glu_links, glu_node, head_node, lm_links, moe_links,
                                           rename, rmsnorm_node, w123_links)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.deepseek_v3 import mla_config, mla_links, mla_mixer
from attnspec.spec import limits


class KimiLinear(Architecture):
    """Kimi Linear: KDA layers (the delta rule with a per-channel gate over one A per head, a low-rank
    gate projection and a low-rank sigmoid output gate after a per-head RMSNorm) and latent attention
    without positions (``full_attention``), each followed by a dense GLU MLP or experts (``mlp_layer_types``:
    sigmoid scores, a correction bias, group-limited, renormalised, scaled, shared experts)."""

    model_types = ("kimi_linear",)
    causal_lm = {"kimi_linear": "KimiLinearForCausalLM"}
    STORED = {"model_max_length": "max_position_embeddings", "moe_renormalize": "norm_topk_prob",
              "num_expert_group": "n_group", "num_experts_per_token": "num_experts_per_tok",
              "num_shared_experts": "n_shared_experts"}
    """The names KimiLinearConfig writes (its attribute_map) -> the names read here."""

    rows = (
        Row(("kimi_linear",),
            "KDA layers (the `delta` mixer with a per-channel `mamba` gate over one A per head, `shared_a`, a "
            "low-rank output gate, `gate_rank`) and position-free latent attention, each with a dense GLU or experts "
            "as `mlp_layer_types` says (as deepseek_v3's)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        config = Config({self.STORED.get(k, k): v for k, v in config.data.items()}, config.source)
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        types = config.layer_types(layers, ["full_attention" if i and i % 4 == 0 else "linear_attention"
                                            for i in range(layers)])
        mlp_types = config.get("mlp_layer_types", list, None) or ["dense"] + ["sparse"] * (layers - 1)
        if len(mlp_types) != layers or any(t not in ("dense", "sparse") for t in mlp_types):
            raise config.refuse("mlp_layer_types", f"must list dense or sparse for each of the {layers} layers")
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention (KDA) or full_attention", unknown)
        heads, head_dim = config.count("linear_num_heads"), config.count("linear_head_dim")
        kda = {"kind": "delta", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "feature_map": "l2norm",
               "transition": {"kind": "mamba", "per": "channel", "rank": head_dim, "shared_a": True},
               "conv": {"kind": "short", "projections": ["q", "k", "v"],
                        "width": config.count("linear_conv_kernel_dim", 4, limit=limits.MAX_CONV_WIDTH),
                        "activation": config.activation(allowed=("silu",))},
               "group_norm": True, "shared_norm_weight": True, "output_gate": "sigmoid", "gate_rank": head_dim,
               "norm_eps": eps}
        attention = {**mla_mixer(config), "position": {"kind": "none"}}
        attention.pop("scale")  # NoPE: the softmax scale is qk_head_dim^-1/2, the default
        experts = config.count("num_experts", 256, limit=limits.MAX_EXPERTS)
        shared = config.get("n_shared_experts", int, 1)
        if not 0 <= shared <= limits.MAX_EXPERTS:
            raise config.refuse("n_shared_experts", f"must be from 0 to {limits.MAX_EXPERTS}")
        moe = {"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 8),
               "hidden": config.count("moe_intermediate_size"), "activation": config.activation(),
               "scoring": "sigmoid", "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
               "routed_scale": config.number("routed_scaling_factor", 1.0), "groups": config.count("n_group", 1),
               "top_groups": config.count("topk_group", 1), "shared": shared,
               **({"shared_hidden": shared * config.count("moe_intermediate_size")} if shared else {})}
        blocks = [{"mixer": kda if t == "linear_attention" else attention,
                   "mlp": moe if m == "sparse" else glu_node(config), "norm": rmsnorm_node(eps)}
                  for t, m in zip(types, mlp_types)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        kda = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "mla"), None)
        if any(b.mixer.kind not in ("delta", "mla") for b in blocks) or kda is None:
            raise NotExpressible("kimi_linear has KDA layers and latent attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "layer_types": ["linear_attention" if b.mixer.kind == "delta" else "full_attention" for b in blocks],
                  "mlp_layer_types": ["sparse" if b.mlp.kind == "moe" else "dense" for b in blocks],
                  "linear_num_heads": kda.heads, "linear_head_dim": kda.d_qk,
                  "linear_conv_kernel_dim": kda.conv.width}
        if attention is not None:
            config.update(mla_config(attention))
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if dense is not None:
            config["intermediate_size"] = dense.hidden
        if moe is not None:
            config.update({"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                           "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
                           "topk_group": moe.top_groups or moe.groups, "n_shared_experts": moe.shared})
        config["hidden_act"] = ACTIVATION_NAMES[(dense or moe).activation]
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            mixer = block.mixer
            if mixer.kind == "mla":
                links += mla_links(mixer, f"{theirs}self_attn.", f"{ours}mixer.")
            else:
                a, m = f"{theirs}self_attn.", f"{ours}mixer."
                links += [rename(f"{a}{n}_proj.weight", f"{m}{n}_proj.weight") for n in "qkv"]
                links += [Link(f"{a}{n}_conv1d.weight", (f"{m}conv.filters.{n}",), conv=True) for n in "qkv"]
                links += [rename(f"{a}f_a_proj.weight", f"{m}transition.dt_proj.0.weight"),
                          rename(f"{a}f_b_proj.weight", f"{m}transition.dt_proj.1.weight"),
                          rename(f"{a}dt_bias", f"{m}transition.dt_bias"),
                          Link(f"{a}A_log", (f"{m}transition.A_log",), view=(1, 1, mixer.heads, 1)),
                          rename(f"{a}b_proj.weight", f"{m}beta_proj.weight"),
                          rename(f"{a}g_a_proj.weight", f"{m}gate_down.weight"),
                          rename(f"{a}g_b_proj.weight", f"{m}gate.weight"),
                          rename(f"{a}o_norm.weight", f"{m}norm_weight"),
                          rename(f"{a}o_proj.weight", f"{m}out_proj.weight")]
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            mlp = f"{theirs}block_sparse_moe."  # Kimi's checkpoints keep Mixtral's names, dense layers too
            if block.mlp.kind == "moe":
                links += moe_links(block.mlp, mlp, f"{ours}mlp.", shared="shared_experts", expert_links=w123_links)
            else:
                links += glu_links(mlp, f"{ours}mlp.", False)
        return links


ARCHITECTURES = (KimiLinear(),)
