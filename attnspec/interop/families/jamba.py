"""transformers' ``jamba`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, glu_node, head_node, lm_links,
                                           moe_links, rename, rmsnorm_node)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.mamba import mamba1_config, mamba1_links, mamba1_mixer
from attnspec.spec import limits


class Jamba(Architecture):
    """Jamba: Mamba-1 layers (RMSNorms with weights on Δ, B and C) and softmax attention layers without
    positions (GQA) every ``attn_layer_period`` layers, each followed by a SiLU GLU MLP or, every
    ``expert_layer_period`` layers, a mixture of GLU experts (softmax router, top-k not renormalised)."""

    model_types = ("jamba",)
    causal_lm = {"jamba": "JambaForCausalLM"}
    FIELDS = {"expand": "mamba_expand", "state": "mamba_d_state", "conv": "mamba_d_conv",
              "conv_bias": "mamba_conv_bias", "bias": "mamba_proj_bias", "rank": "mamba_dt_rank"}

    rows = (
        Row(("jamba",),
            "Mamba-1 layers (`selection_norm: rmsnorm`: Jamba's weighted norms) and position-free GQA attention every"
            " `attn_layer_period` layers from `attn_layer_offset`; a SiLU GLU MLP, or experts (softmax router, top-k "
            "not renormalised) every `expert_layer_period` layers",
            "an offset not below its period"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        heads, kv_heads, head_dim = config.attention_heads(None)
        attention = {"kind": "softmax", "heads": heads, "position": {"kind": "none"}}
        if kv_heads != heads:
            attention["kv_heads"] = kv_heads
        mamba = mamba1_mixer(config, self.FIELDS, "rmsnorm", eps)
        experts = config.count("num_experts", 16, limit=limits.MAX_EXPERTS)
        mlp = glu_node(config)
        moe = {"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 2),
               "hidden": mlp["hidden"], "activation": mlp["activation"], "normalize": False}
        periods = {}
        for name, default_period, default_offset in (("attn", 8, 4), ("expert", 2, 1)):
            period = config.count(f"{name}_layer_period", default_period)
            offset = config.get(f"{name}_layer_offset", int, default_offset)
            if not 0 <= offset < period:
                raise config.refuse(f"{name}_layer_offset", f"must be from 0 to {name}_layer_period - 1")
            periods[name] = (period, offset)
        blocks = [{"mixer": attention if i % periods["attn"][0] == periods["attn"][1] else mamba,
                   "mlp": moe if experts > 1 and i % periods["expert"][0] == periods["expert"][1] else mlp,
                   "norm": rmsnorm_node(eps)} for i in range(layers)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        n = len(blocks)
        attention = [i for i, b in enumerate(blocks) if b.mixer.kind == "softmax"]
        sparse = [i for i, b in enumerate(blocks) if b.mlp.kind == "moe"]
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "mamba"), None)
        if mamba is None or not attention or any(b.mixer.kind not in ("softmax", "mamba") for b in blocks):
            raise NotExpressible("jamba has Mamba-1 layers and softmax attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": n, "rms_norm_eps": spec.final_norm.eps,
                  "num_attention_heads": blocks[attention[0]].mixer.heads,
                  "num_key_value_heads": blocks[attention[0]].mixer.kv_heads or blocks[attention[0]].mixer.heads,
                  **mamba1_config(mamba, spec.d_model, self.FIELDS),
                  "attn_layer_period": _period(attention, n), "attn_layer_offset": attention[0]}
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = blocks[sparse[0]].mlp if sparse else None
        mlp = dense or moe
        config["intermediate_size"] = mlp.hidden
        config["hidden_act"] = ACTIVATION_NAMES[mlp.activation]
        if moe is None:
            config.update(num_experts=1, expert_layer_period=1, expert_layer_offset=0)
        else:
            config.update(num_experts=moe.experts, num_experts_per_tok=moe.top_k,
                          expert_layer_period=_period(sparse, n), expert_layer_offset=sparse[0])
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            if block.mixer.kind == "mamba":
                links += mamba1_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
            else:
                links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight")]
            if block.mlp.kind == "moe":
                links += moe_links(block.mlp, f"{theirs}feed_forward.", f"{ours}mlp.", router="router")
            else:
                links += glu_links(f"{theirs}feed_forward.", f"{ours}mlp.", block.mlp.bias)
        return links


def _period(indices: list[int], layers: int) -> int:
    """The period p of layer indices i0, i0 + p, i0 + 2p, ... (one index: any period past the last layer)."""
    period = indices[1] - indices[0] if len(indices) > 1 else layers
    if indices != list(range(indices[0], layers, period)):
        raise NotExpressible(f"layers {indices} are not every {period}th layer from layer {indices[0]}")
    return period


ARCHITECTURES = (Jamba(),)
