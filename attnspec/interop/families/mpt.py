"""transformers' ``mpt`` model type (MosaicML's MPT) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits


class Mpt(Architecture):
    """MPT: softmax attention with ALiBi (slopes 2^(-8h/H): ``alibi_bias_max`` 8 and a power-of-two head count,
    where MPT's slopes are ALiBi's own) and a plain exact-GeLU MLP 4 times as wide (transformers' MPT takes no
    other ``expansion_ratio``), no biases anywhere, under LayerNorms without biases; a head tied by default.
    transformers' MPT applies ALiBi whatever ``attn_config.alibi`` says."""

    model_types = ("mpt",)
    causal_lm = {"mpt": "MptForCausalLM"}
    config_fields = {"mpt": {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
                             "max_seq_len": "max_position_embeddings"}}

    rows = (
        Row(("mpt",),
            "softmax attention with ALiBi (`position: {kind: alibi}`) and a plain exact-GeLU MLP, no biases, under "
            "LayerNorms without biases (`bias: false`)",
            "`clip_qkv`, `qk_ln`, multi-query attention, `alibi_bias_max` other than 8, head counts not a power of "
            "two (MPT's slopes are then not ALiBi's), `logit_scale`"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        attention = Config(config.get("attn_config", dict, {}), f"{config.source} attn_config")
        for field, fine in (("clip_qkv", None), ("qk_ln", False), ("alibi_bias_max", 8), ("prefix_lm", False),
                            ("attn_type", "multihead_attention")):
            value = attention.data.get(field, fine)
            if value != fine:
                raise attention.refuse(field, f"{value!r}: attnspec imports MPT's attention with {field} {fine!r}")
        if config.data.get("logit_scale") is not None:
            raise config.refuse("logit_scale", "attnspec imports MPT's logits unscaled (null)")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads or heads & (heads - 1):
            raise config.refuse("n_heads", f"{heads} heads: a power of two dividing d_model = {width} (MPT's ALiBi "
                                           "slopes for other counts are not ALiBi's)")
        head_dim = width // heads
        scale = attention.number("softmax_scale", None)
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_epsilon", 1e-5, positive=True), "bias": False}
        mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "position": {"kind": "alibi"},
                 **({"scale": scale} if scale is not None else {})}
        block = {"mixer": mixer, "mlp": {"kind": "mlp", "hidden": 4 * width, "activation": "gelu", "bias": False},
                 "norm": norm}
        return {**common_fields(config), "max_len": config.count("max_position_embeddings", 2048),
                "layers": compress_layers([block] * layers), "final_norm": norm, "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer = first.mixer
        if any(b != first for b in blocks) or mixer.kind != "softmax" or getattr(mixer.position, "kind", None) != "alibi" \
                or mixer.qkv_bias or mixer.out_bias or mixer.kv_heads not in (None, mixer.heads) \
                or mixer.qk_norm != "none" or mixer.heads * mixer.d_qk != spec.d_model or mixer.d_v != mixer.d_qk \
                or getattr(mixer, "window", None) is not None or first.mlp.kind != "mlp" or first.mlp.bias \
                or first.mlp.activation != "gelu" or first.mlp.hidden != 4 * spec.d_model \
                or first.norm.kind != "layernorm" or first.norm.bias or not first.norm.affine \
                or spec.final_norm != first.norm or first.parallel != "none" or first.norm_placement != "pre":
            raise NotExpressible("mpt is alike blocks of bias-free ALiBi attention and a 4x exact-GeLU MLP under "
                                 "LayerNorms without biases")
        return {"d_model": spec.d_model, "n_heads": mixer.heads, "n_layers": len(blocks), "max_seq_len": spec.max_len,
                "expansion_ratio": 4, "layer_norm_epsilon": first.norm.eps, "no_bias": True,
                "attn_config": {"alibi": True, "softmax_scale": mixer.scale}}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.wte.weight", "embed.weight"), rename("transformer.norm_f.weight", "final_norm.weight")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"transformer.blocks.{index}.", block_prefix(index)
            links += [Link(f"{theirs}attn.Wqkv.weight", tuple(f"{ours}mixer.{n}_proj.weight" for n in "qkv")),
                      rename(f"{theirs}attn.out_proj.weight", f"{ours}mixer.out_proj.weight"),
                      rename(f"{theirs}ffn.up_proj.weight", f"{ours}mlp.up.weight"),
                      rename(f"{theirs}ffn.down_proj.weight", f"{ours}mlp.down.weight"),
                      rename(f"{theirs}norm_1.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}norm_2.weight", f"{ours}norm2.weight")]
        return links


ARCHITECTURES = (Mpt(),)
