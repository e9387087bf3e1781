"""transformers' ``nemotron_h`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, head_node, lm_links, mlp_links,
                                           moe_links, rename, rmsnorm_node)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.mamba2 import mamba2_config, mamba2_links, mamba2_mixer
from attnspec.spec import limits


class NemotronH(Architecture):
    """Nemotron-H: one sub-layer per layer, x + f(RMSNorm(x)), f one of Mamba2 (Δ clamped below at
    ``time_step_min``), softmax attention without positions (GQA), a plain MLP (squared ReLU), or a
    mixture of plain experts (sigmoid scores with a correction bias, group-limited, a shared expert):
    ``layers_block_type``. The MLP and expert layers are blocks without a mixer (``mixer: none``)."""

    model_types = ("nemotron_h",)
    causal_lm = {"nemotron_h": "NemotronHForCausalLM"}
    FIELDS = {"heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "expand": "expand", "state": "ssm_state_size",
              "groups": "n_groups", "conv": "conv_kernel", "conv_bias": "use_conv_bias", "chunk": "chunk_size",
              "bias": "use_bias", "eps": "layer_norm_epsilon", "act": "mamba_hidden_act"}
    TYPES = ("linear_attention", "full_attention", "mlp", "moe")

    rows = (
        Row(("nemotron_h",),
            "one sub-layer per layer as its own block (`layers_block_type`): Mamba2 (Δ clamped below at "
            "`time_step_min`, `dt_min`), position-free GQA attention, a squared-ReLU MLP or experts as blocks without"
            " a mixer (`mixer: none`); experts: plain MLPs, sigmoid scores with the correction bias, group-limited "
            "(`groups`, `top_groups`), renormalised, scaled, one shared expert",
            "`moe_latent_size` (experts in a latent space of their own), multi-token prediction layers, `mlp_bias` "
            "with experts"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        types = config.get("layers_block_type", list)
        if not 0 < len(types) <= limits.MAX_BLOCKS or any(t not in self.TYPES for t in types):
            raise config.refuse("layers_block_type", f"must list 1 to {limits.MAX_BLOCKS} layers, each one of "
                                f"{', '.join(self.TYPES)}")
        if config.get("num_nextn_predict_layers", int, 0):
            raise config.refuse("num_nextn_predict_layers", "multi-token prediction layers are not imported")
        if config.get("moe_latent_size", int, None) is not None and "moe" in types:
            raise config.refuse("moe_latent_size", "experts in a latent space of their own are not an attnspec "
                                "MLP", [i for i, t in enumerate(types) if t == "moe"])
        eps = config.number("layer_norm_epsilon", 1e-5)
        layers = {}
        if "linear_attention" in types:
            layers["linear_attention"] = mamba2_mixer(config, self.FIELDS, (config.number("time_step_min", 0.001),
                                                                             math.inf)), "none"
        if "full_attention" in types:
            heads, kv_heads, head_dim = config.attention_heads()
            attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                         "position": {"kind": "none"}, **({"kv_heads": kv_heads} if kv_heads != heads else {})}
            layers["full_attention"] = attention, "none"
        act = config.activation("mlp_hidden_act", allowed=("relu2", "relu", "silu", "gelu", "gelu_tanh"))
        bias = config.get("mlp_bias", bool, False)
        if "mlp" in types:
            layers["mlp"] = "none", {"kind": "mlp", "hidden": config.count("intermediate_size"), "activation": act,
                                     "bias": bias}
        if "moe" in types:
            if bias:
                raise config.refuse("mlp_bias", "the shared expert's biases are not imported (experts have none)")
            experts = config.count("n_routed_experts", limit=limits.MAX_EXPERTS)
            groups = config.count("n_group", 1)
            layers["moe"] = "none", {
                "kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 2),
                "hidden": config.count("moe_intermediate_size"), "activation": act, "gated": False,
                "scoring": "sigmoid", "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
                "routed_scale": config.number("routed_scaling_factor", 1.0), "groups": groups,
                "top_groups": config.count("topk_group", 1), "shared": 1,
                "shared_hidden": config.count("moe_shared_expert_intermediate_size")}
        blocks = [{"mixer": layers[t][0], "mlp": layers[t][1], "norm": rmsnorm_node(eps)} for t in types]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        types = []
        for block in blocks:
            kind = (block.mixer.kind, block.mlp.kind)
            if kind not in (("linear", "none"), ("softmax", "none"), ("none", "mlp"), ("none", "moe")):
                raise NotExpressible("each nemotron_h layer is one of Mamba2, attention, an MLP or experts")
            types.append({"linear": "linear_attention", "softmax": "full_attention"}.get(kind[0], kind[1]))
        config = {"hidden_size": spec.d_model, "layers_block_type": types, "layer_norm_epsilon": spec.final_norm.eps}
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "linear"), None)
        if mamba is not None:
            config.update(mamba2_config(mamba, spec.d_model, self.FIELDS), mamba_hidden_act="silu",
                          time_step_min=mamba.transition.dt_min or 0.0)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if attention is not None:
            config.update({"num_attention_heads": attention.heads, "head_dim": attention.d_qk,
                           "num_key_value_heads": attention.kv_heads or attention.heads})
        mlp = next((b.mlp for b in blocks if b.mlp.kind == "mlp"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if mlp is not None:
            config.update({"intermediate_size": mlp.hidden, "mlp_bias": mlp.bias})
        if mlp is not None or moe is not None:
            config["mlp_hidden_act"] = ACTIVATION_NAMES[(mlp or moe).activation]
        if moe is not None:
            config.update({"n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                           "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
                           "topk_group": moe.top_groups or moe.groups,
                           "moe_shared_expert_intermediate_size": moe.shared_hidden or moe.hidden})
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "backbone.embeddings.weight", "backbone.norm_f.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"backbone.layers.{index}.", block_prefix(index)
            if block.mixer.kind == "linear":
                links += mamba2_links(block.mixer, f"{theirs}mixer.", f"{ours}mixer.")
            elif block.mixer.kind == "softmax":
                links += attention_links(f"{theirs}mixer.", f"{ours}mixer.", False)
            elif block.mlp.kind == "moe":
                links += moe_links(block.mlp, f"{theirs}mixer.", f"{ours}mlp.", shared="shared_experts")
            else:
                links += mlp_links(f"{theirs}mixer.", f"{ours}mlp.", block.mlp.bias)
            norm = "norm1" if block.mlp.kind == "none" else "norm2"  # the one norm of a layer: its sub-layer's
            links.append(rename(f"{theirs}norm.weight", f"{ours}{norm}.weight"))
        return links


ARCHITECTURES = (NemotronH(),)
