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
        mlp = {"kind": "glu", "hidden": self._hidden(config), "activation": "silu", "bias": False}
        blocks = [{"mixer": conv if t == "conv" else attention, "mlp": mlp, "norm": rmsnorm_node(eps)} for t in types]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, True)}

    @staticmethod
    def _hidden(config: Config) -> int:
        """The MLP's width as Lfm2MLP derives it."""
        hidden = config.count("intermediate_size")
        if not config.get("block_auto_adjust_ff_dim", bool, True):
            return hidden
        hidden = int(2 * hidden / 3)
        multiplier = config.number("block_ffn_dim_multiplier", 1.0) if config.data.get(
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
                  "intermediate_size": blocks[0].mlp.hidden, "block_auto_adjust_ff_dim": False,
                  "conv_L_cache": conv.conv.width, "conv_bias": conv.qkv_bias}
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
            links += [rename(f"{theirs}feed_forward.{t}.weight", f"{ours}mlp.{o}.weight")
                      for t, o in (("w1", "up"), ("w3", "gate"), ("w2", "down"))]
        return links


ARCHITECTURES = (Lfm2(),)
