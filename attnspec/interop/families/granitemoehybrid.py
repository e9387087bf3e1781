"""transformers' ``granitemoehybrid`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, head_node, lm_links, rename,
                                           rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.bamba import Bamba
from attnspec.interop.families.mamba2 import mamba2_config, mamba2_links, mamba2_mixer, time_step_limit
from attnspec.spec import limits


class GraniteMoeHybrid(Architecture):
    """Granite 4.0-H: Mamba2 layers and softmax attention layers (GQA, RoPE or none, the softmax scale
    ``attention_multiplier``), each followed by experts (softmax over the top-k logits, i.e. renormalised
    top-k; GLU experts stored fused) plus a shared GLU MLP, or by the shared MLP alone; muP
    multipliers on the embeddings (``embedding_multiplier``), every residual branch
    (``residual_multiplier``) and the logits (divided by ``logits_scaling``)."""

    model_types = ("granitemoehybrid",)
    causal_lm = {"granitemoehybrid": "GraniteMoeHybridForCausalLM"}
    FIELDS = {**Bamba.FIELDS, "eps": "rms_norm_eps"}

    rows = (
        Row(("granitemoehybrid",),
            "Granite 4.0-H: Mamba2 and attention layers (RoPE or none, softmax scale `attention_multiplier`), each "
            "with experts (fused tensors, softmax over the top-k = renormalised) plus the shared GLU MLP, or the "
            "shared MLP alone; `embedding_multiplier` as `input.scale`, `residual_multiplier` as each block's "
            "`residual_scale`, `logits_scaling` as `head.scale`",
            "position types other than rope/none"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        types = config.layer_types(layers, ["linear_attention"] * layers)
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention (Mamba2) or full_attention", unknown)
        heads, kv_heads, head_dim = config.attention_heads(None)
        bias = config.get("attention_bias", bool, False)
        kind = config.get("position_embedding_type", str, None)
        if kind not in (None, "rope", "nope"):
            raise config.refuse("position_embedding_type", f"{shorten(kind)!r}: rope or none import")
        attention = {"kind": "softmax", "heads": heads, "qkv_bias": bias, "out_bias": bias,
                     "scale": config.number("attention_multiplier", 1.0),
                     "position": config.rope(head_dim) if kind == "rope" else {"kind": "none"},
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        mamba = mamba2_mixer(config, self.FIELDS) if "linear_attention" in types else None
        shared = config.count("shared_intermediate_size")
        experts = config.get("num_local_experts", int, 8)
        if experts < 0 or experts > limits.MAX_EXPERTS:
            raise config.refuse("num_local_experts", f"must be from 0 to {limits.MAX_EXPERTS}")
        act = config.activation()
        mlp = ({"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 2),
                "hidden": config.count("intermediate_size"), "activation": act, "shared": 1, "shared_hidden": shared}
               if experts else {"kind": "glu", "hidden": shared, "activation": act, "bias": False})
        multiplier = config.number("residual_multiplier", 1.0)
        blocks = [{"mixer": mamba if t == "linear_attention" else attention, "mlp": mlp, "norm": rmsnorm_node(eps),
                   **({"residual_scale": multiplier} if multiplier != 1.0 else {})} for t in types]
        embedding = config.number("embedding_multiplier", 1.0)
        logits = config.number("logits_scaling", 1.0, positive=True)
        common = common_fields(config)
        if embedding != 1.0:
            common["input"]["scale"] = embedding
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": {**head_node(config, False), "scale": 1.0 / logits}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "linear"), None)
        if any(b.mixer.kind not in ("softmax", "linear") or b.mlp != blocks[0].mlp for b in blocks):
            raise NotExpressible("granitemoehybrid has Mamba2 and attention layers, each with the same MLP")
        mlp = blocks[0].mlp
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "layer_types": ["full_attention" if b.mixer.kind == "softmax" else "linear_attention"
                                  for b in blocks],
                  "embedding_multiplier": spec.input.scale, "residual_multiplier": blocks[0].scales()[0][1],
                  "logits_scaling": 1.0 / spec.head.scale, "hidden_act": ACTIVATION_NAMES[mlp.activation]}
        if mlp.kind == "moe":
            config.update(num_local_experts=mlp.experts, num_experts_per_tok=mlp.top_k, intermediate_size=mlp.hidden,
                          shared_intermediate_size=mlp.shared_hidden or mlp.hidden)
        else:
            config.update(num_local_experts=0, shared_intermediate_size=mlp.hidden)
        if attention is not None:
            rope = attention.position.kind == "rope"
            config.update({"num_attention_heads": attention.heads,
                           "num_key_value_heads": attention.kv_heads or attention.heads,
                           "attention_bias": attention.qkv_bias, "attention_multiplier": attention.scale,
                           "position_embedding_type": "rope" if rope else None,
                           **({"rope_parameters": rope_config(attention.position)} if rope else {})})
        if mamba is not None:
            config.update(mamba2_config(mamba, spec.d_model, self.FIELDS), time_step_limit=time_step_limit(mamba))
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            if block.mixer.kind == "linear":
                links += mamba2_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
            else:
                links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            mlp, shared = block.mlp, f"{ours}mlp." if block.mlp.kind == "glu" else f"{ours}mlp.shared."
            links += [Link(f"{theirs}shared_mlp.input_linear.weight", (f"{shared}up.weight", f"{shared}gate.weight")),
                      rename(f"{theirs}shared_mlp.output_linear.weight", f"{shared}down.weight")]
            if mlp.kind == "moe":  # experts fused: input_linear (E, 2 hidden, d) = each expert's up | gate
                moe, routed = f"{theirs}block_sparse_moe.", [f"{ours}mlp.routed.{e}." for e in range(mlp.experts)]
                links += [rename(f"{moe}router.layer.weight", f"{ours}mlp.router.weight"),
                          Link(f"{moe}input_linear.weight",
                               tuple(f"{r}{n}.weight" for r in routed for n in ("up", "gate")), stack=mlp.experts),
                          Link(f"{moe}output_linear.weight", tuple(f"{r}down.weight" for r in routed),
                               stack=mlp.experts)]
        return links


ARCHITECTURES = (GraniteMoeHybrid(),)
