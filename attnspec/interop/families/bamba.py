"""transformers' ``bamba`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, glu_node, head_node, lm_links,
                                           rename, rmsnorm_node, rope_config)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.mamba2 import mamba2_config, mamba2_links, mamba2_mixer, time_step_limit
from attnspec.spec import limits


class Bamba(Architecture):
    """Bamba: Mamba2 layers and softmax attention layers (GQA, partial RoPE) at ``attn_layer_indices``,
    each followed by a SiLU GLU MLP; RMSNorms."""

    model_types = ("bamba",)
    causal_lm = {"bamba": "BambaForCausalLM"}
    FIELDS = {"heads": "mamba_n_heads", "head_dim": "mamba_d_head", "expand": "mamba_expand",
              "state": "mamba_d_state", "groups": "mamba_n_groups", "conv": "mamba_d_conv",
              "conv_bias": "mamba_conv_bias", "chunk": "mamba_chunk_size", "bias": "mamba_proj_bias",
              "eps": "rms_norm_eps"}

    rows = (
        Row(("bamba",),
            "Mamba2 layers (as `mamba2`, sizes from its `mamba_*` fields) and softmax attention layers (GQA, partial "
            "RoPE 0.5) at `attn_layer_indices`, each followed by a SiLU GLU MLP; RMSNorms",
            "as mamba2 (`mamba_proj_bias`)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        attention_layers = config.layer_list("attn_layer_indices", layers)
        heads, kv_heads, head_dim = config.attention_heads(None)
        bias = config.get("attention_bias", bool, False)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                     "out_bias": bias, "position": config.rope(head_dim, 0.5)}
        if kv_heads != heads:
            attention["kv_heads"] = kv_heads
        mamba = mamba2_mixer(config, self.FIELDS)
        mlp = glu_node(config, bias=config.get("mlp_bias", bool, False))
        blocks = [{"mixer": attention if i in attention_layers else mamba, "mlp": mlp, "norm": rmsnorm_node(eps)}
                  for i in range(layers)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "linear"), None)
        if attention is None or mamba is None or getattr(attention.position, "kind", None) != "rope":
            raise NotExpressible("bamba has Mamba2 layers and rotary softmax attention layers")
        mlp = blocks[0].mlp
        return {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden or mlp.expansion * spec.d_model,
                "num_hidden_layers": len(blocks), "num_attention_heads": attention.heads,
                "num_key_value_heads": attention.kv_heads or attention.heads, "hidden_act": "silu",
                "rms_norm_eps": mamba.norm_eps, "attention_bias": attention.qkv_bias,
                "mlp_bias": mlp.bias, "rope_parameters": {**rope_config(attention.position),
                                                          "partial_rotary_factor": attention.position.rotary_fraction},
                "attn_layer_indices": [i for i, b in enumerate(blocks) if b.mixer.kind == "softmax"],
                **mamba2_config(mamba, spec.d_model, self.FIELDS), "time_step_limit": time_step_limit(mamba)}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            if block.mixer.kind == "linear":
                links += mamba2_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
            else:
                links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight")]
            links += glu_links(f"{theirs}feed_forward.", f"{ours}mlp.", block.mlp.bias)
        return links


ARCHITECTURES = (Bamba(),)
