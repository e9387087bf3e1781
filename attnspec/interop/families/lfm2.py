"""transformers' ``lfm2`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, lm_links, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits


class Lfm2(Architecture):
    """LFM2: gated short convolutions (``conv`` layers) and softmax attention with QK-norm, RoPE and GQA
    (``full_attention`` layers), each followed by a SiLU GLU MLP (whose width LFM2 derives from
    ``intermediate_size`` when ``block_auto_adjust_ff_dim``); RMSNorms, a tied head."""

    model_types = ("lfm2",)
    causal_lm = {"lfm2": "Lfm2ForCausalLM"}

    rows = (
        Row(("lfm2",),
            "LFM2: gated short convolutions (the `gated_conv` mixer) and QK-normed GQA attention with RoPE in "
            "`layer_types` order, each with a SiLU GLU (its width derived as Lfm2MLP derives it)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads(None)
        attention_layers = config.layer_list("full_attn_idxs", layers) if "full_attn_idxs" in config.data else None
        types = config.layer_types(layers, ["full_attention" if attention_layers is None or i in attention_layers
                                            else "conv" for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("conv", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is conv or full_attention", unknown)
        eps = config.number("norm_eps", 1e-5)
        bias = config.get("conv_bias", bool, False)
        conv = {"kind": "gated_conv", "qkv_bias": bias, "out_bias": bias,
                "conv": {"kind": "short", "width": config.count("conv_L_cache", 3, limit=limits.MAX_CONV_WIDTH),
                         "projections": ["v"], "bias": bias}}
        attention = {"kind": "softmax", "heads": heads, "qk_norm": "rmsnorm", "norm_eps": eps,
                     "position": config.rope(head_dim), **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        blocks = [{"mixer": conv if t == "conv" else attention, "mlp": mlp, "norm": rmsnorm_node(eps)}
                  for t, mlp in zip(types, self.mlp_nodes(config, layers), strict=True)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, True)}

    def mlp_nodes(self, config: Config, layers: int) -> list[dict]:
        """Each layer's MLP: one SiLU GLU in every layer."""
        return [{"kind": "glu", "hidden": self._hidden(config), "activation": "silu", "bias": False}] * layers

    def mlp_config(self, blocks) -> dict:
        """The config fields of the blocks' MLPs (the inverse of :meth:`mlp_nodes`)."""
        mlp = blocks[0].mlp
        if any(b.mlp != mlp for b in blocks) or mlp.kind != "glu" or mlp.bias or mlp.activation != "silu":
            raise NotExpressible("lfm2 has one bias-free SiLU GLU in every layer")
        return {"intermediate_size": mlp.hidden, "block_auto_adjust_ff_dim": False}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return [rename(f"{theirs}{t}.weight", f"{ours}{o}.weight") for t, o in (("w1", "up"), ("w3", "gate"),
                                                                                  ("w2", "down"))]

    @staticmethod
    def _hidden(config: Config) -> int:
        """The MLP's width as Lfm2MLP derives it."""
        hidden = config.count("intermediate_size")
        if not config.get("block_auto_adjust_ff_dim", bool, True):
            return hidden
        hidden = int(2 * hidden / 3)
        multiplier = config.number("block_ffn_dim_multiplier", 1.0, at_most=limits.MAX_EXPANSION) if config.data.get(
            "block_ffn_dim_multiplier") is not None else None
        if multiplier is not None:
            multiple = config.count("block_multiple_of", 256)
            hidden = multiple * ((int(multiplier * hidden) + multiple - 1) // multiple)
        if hidden <= 0:
            raise config.refuse("intermediate_size", "the MLP width it implies is not positive")
        return hidden

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        conv = next((b.mixer for b in blocks if b.mixer.kind == "gated_conv"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if any(b.mixer.kind not in ("gated_conv", "softmax") for b in blocks) or conv is None:
            raise NotExpressible("lfm2 has gated convolution layers and attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "norm_eps": spec.final_norm.eps,
                  "layer_types": ["conv" if b.mixer.kind == "gated_conv" else "full_attention" for b in blocks],
                  **self.mlp_config(blocks), "conv_L_cache": conv.conv.width, "conv_bias": conv.qkv_bias}
        if attention is not None:
            config.update({"num_attention_heads": attention.heads,
                           "num_key_value_heads": attention.kv_heads or attention.heads,
                           "rope_parameters": rope_config(attention.position)})
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.embedding_norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            mixer = block.mixer
            if mixer.kind == "gated_conv":
                names = ["in_proj.weight", "out_proj.weight"] + (["in_proj.bias", "out_proj.bias"] if mixer.qkv_bias
                                                                 else [])
                links += [rename(f"{theirs}conv.{name}", f"{ours}mixer.{name}") for name in names]
                links.append(Link(f"{theirs}conv.conv.weight", (f"{ours}mixer.conv.filters.v",), conv=True))
                if mixer.conv.bias:
                    links.append(rename(f"{theirs}conv.conv.bias", f"{ours}mixer.conv.biases.v"))
            else:
                a = f"{theirs}self_attn."
                links += [rename(f"{a}{n}_proj.weight", f"{ours}mixer.{n}_proj.weight") for n in "qkv"]
                links += [rename(f"{a}out_proj.weight", f"{ours}mixer.out_proj.weight"),
                          rename(f"{a}q_layernorm.weight", f"{ours}mixer.qk_norm.q"),
                          rename(f"{a}k_layernorm.weight", f"{ours}mixer.qk_norm.k")]
            links += [rename(f"{theirs}operator_norm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}ffn_norm.weight", f"{ours}norm2.weight")]
            links += self.mlp_links(block.mlp, f"{theirs}feed_forward.", f"{ours}mlp.")
        return links


class Lfm2Moe(Lfm2):
    """LFM2-MoE: LFM2's layers with a SiLU GLU of ``intermediate_size`` in the first ``num_dense_layers`` and
    experts after: sigmoid scores (plus the block's ``expert_bias`` in the choice with ``use_expert_bias``),
    the chosen ones renormalised with ``norm_topk_prob``, times ``routed_scaling_factor``. transformers adds
    1e-6 to the renormalising sum; attnspec divides by the sum alone (each weight differs by at most 1e-6 of
    itself, relatively)."""

    model_types = ("lfm2_moe",)
    causal_lm = {"lfm2_moe": "Lfm2MoeForCausalLM"}

    rows = (
        Row(("lfm2_moe",),
            "lfm2's layers, GLUs in the first `num_dense_layers`, then experts (sigmoid scores, `expert_bias` in the "
            "choice, renormalised without transformers' 1e-6, `routed_scaling_factor`)", "as lfm2"),
    )

    def mlp_nodes(self, config: Config, layers: int) -> list[dict]:
        dense = config.get("num_dense_layers", int, 2)
        if not 0 <= dense <= layers:
            raise config.refuse("num_dense_layers", f"must be from 0 to the {layers} layers")
        experts = config.count("num_experts", 32, limit=limits.MAX_EXPERTS)
        top_k = config.count("num_experts_per_tok", 4)
        if top_k > experts:
            raise config.refuse("num_experts_per_tok", f"{top_k} experts per token of {experts}")
        moe = {"kind": "moe", "experts": experts, "top_k": top_k, "hidden": config.count("moe_intermediate_size"),
               "activation": "silu", "scoring": "sigmoid", "score_bias": config.get("use_expert_bias", bool, True),
               "normalize": config.get("norm_topk_prob", bool, True),
               "routed_scale": config.number("routed_scaling_factor", 1.0)}
        glu = {"kind": "glu", "hidden": config.count("intermediate_size"), "activation": "silu", "bias": False}
        return [glu if i < dense else moe for i in range(layers)]

    def mlp_config(self, blocks) -> dict:
        mlps = [b.mlp for b in blocks]
        dense = next((i for i, m in enumerate(mlps) if m.kind != "glu"), len(mlps))
        glu = mlps[0] if dense else None
        moe = mlps[dense] if dense < len(mlps) else None
        if any(m != glu for m in mlps[:dense]) or any(m != moe for m in mlps[dense:]) \
                or (glu is not None and (glu.bias or glu.activation != "silu")) \
                or (moe is not None and (moe.scoring != "sigmoid" or moe.shared or moe.groups != 1
                                         or moe.activation != "silu")):
            raise NotExpressible("lfm2_moe has SiLU GLUs in its first layers and one set of sigmoid-routed experts "
                                 "after them")
        config = {"num_dense_layers": dense}
        if glu is not None:
            config["intermediate_size"] = glu.hidden
        if moe is not None:
            config.update(num_experts=moe.experts, num_experts_per_tok=moe.top_k, moe_intermediate_size=moe.hidden,
                          use_expert_bias=moe.score_bias, norm_topk_prob=moe.normalize,
                          routed_scaling_factor=moe.routed_scale)
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind != "moe":
            return super().mlp_links(mlp, theirs, ours)
        links = [rename(f"{theirs}gate.weight", f"{ours}router.weight")]
        if mlp.score_bias:
            links.append(rename(f"{theirs}expert_bias", f"{ours}score_bias"))
        for e in range(mlp.experts):
            links += super().mlp_links(mlp, f"{theirs}experts.{e}.", f"{ours}routed.{e}.")
        return links


ARCHITECTURES = (Lfm2(), Lfm2Moe())
