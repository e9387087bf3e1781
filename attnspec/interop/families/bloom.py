"""transformers' ``bloom`` model type (BigScience's BLOOM) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits


class Bloom(Architecture):
    """BLOOM: a LayerNorm of the token embeddings (``word_embeddings_layernorm``: ``input.norm``), softmax
    attention with ALiBi (its slopes 2^(-8h/H) for a power-of-two head count, the ALiBi paper's own) and biases,
    q, k and v packed per head in ``query_key_value``, and a plain tanh-GeLU MLP 4 times as wide with biases,
    under LayerNorms with biases; with ``apply_residual_connection_post_layernorm`` each sub-layer adds to its
    normalised input (``norm_placement: normed_residual``). A tied head by default. transformers adds the ALiBi
    bias by absolute key position, which softmax's shift invariance makes the relative one attnspec adds."""

    model_types = ("bloom",)
    causal_lm = {"bloom": "BloomForCausalLM"}
    config_fields = {"bloom": {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "n_embed": "hidden_size"}}
    """BloomConfig's own names (transformers maps them on load)."""

    rows = (
        Row(("bloom",),
            "a LayerNorm of the embeddings (`input.norm`), softmax attention with ALiBi (`position: {kind: alibi}`) "
            "and biases, q/k/v packed per head, and a plain biased tanh-GeLU MLP under biased LayerNorms; "
            "`apply_residual_connection_post_layernorm` as `norm_placement: normed_residual`",
            "head counts not a power of two (BLOOM's slopes for those interleave a second series; BLOOM-176B's 112 "
            "heads), `pretraining_tp` above 1 with `slow_but_exact`"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads or heads & (heads - 1):
            raise config.refuse("n_head", f"{heads} heads: a power of two dividing hidden_size = {width} (BLOOM's ALiBi "
                                          "slopes for other counts add a second series attnspec's ALiBi lacks)")
        if config.get("slow_but_exact", bool, False) and config.count("pretraining_tp", 1) > 1:
            raise config.refuse("slow_but_exact", "true with pretraining_tp above 1: attnspec imports BLOOM's "
                                                  "unsliced projections (slow_but_exact false)")
        head_dim = width // heads
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_epsilon", 1e-5, positive=True)}
        mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": True,
                 "out_bias": True, "position": {"kind": "alibi"}}
        post = config.get("apply_residual_connection_post_layernorm", bool, False)
        block = {"mixer": mixer, "mlp": {"kind": "mlp", "hidden": 4 * width, "activation": "gelu_tanh", "bias": True},
                 "norm": norm, **({"norm_placement": "normed_residual"} if post else {})}
        fields = common_fields(config)
        fields["input"]["norm"] = norm
        return {**fields, "layers": compress_layers([block] * layers), "final_norm": norm,
                "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer = first.mixer
        if any(b != first for b in blocks) or mixer.kind != "softmax" or getattr(mixer.position, "kind", None) != "alibi" \
                or not mixer.qkv_bias or not mixer.out_bias or mixer.kv_heads not in (None, mixer.heads) \
                or mixer.qk_norm != "none" or mixer.heads * mixer.d_qk != spec.d_model or mixer.d_v != mixer.d_qk \
                or mixer.heads & (mixer.heads - 1) or mixer.scale not in (None, mixer.d_qk ** -0.5) \
                or getattr(mixer, "window", None) is not None or mixer.output_gate != "none" \
                or first.mlp.kind != "mlp" or not first.mlp.bias or first.mlp.activation != "gelu_tanh" \
                or first.mlp.hidden != 4 * spec.d_model or first.norm.kind != "layernorm" or not first.norm.bias \
                or not first.norm.affine or spec.final_norm != first.norm or spec.input.norm != first.norm \
                or first.parallel != "none" or first.norm_placement not in ("pre", "normed_residual") \
                or spec.input.scale != 1.0 or not spec.head.tied or spec.head.bias:
            raise NotExpressible("bloom is alike blocks of biased ALiBi attention (a power-of-two head count) and a 4x "
                                 "tanh-GeLU MLP under biased LayerNorms, an embedding LayerNorm and a tied head")
        return {"hidden_size": spec.d_model, "n_layer": len(blocks), "n_head": mixer.heads,
                "layer_norm_epsilon": first.norm.eps, "tie_word_embeddings": True,
                "apply_residual_connection_post_layernorm": first.norm_placement == "normed_residual"}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.word_embeddings.weight", "embed.weight")]
        links += [rename(f"transformer.{t}.{p}", f"{o}.{p}") for t, o in
                  (("word_embeddings_layernorm", "embed_norm"), ("ln_f", "final_norm")) for p in ("weight", "bias")]
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            links += [Link(f"{theirs}self_attention.query_key_value.{kind}",
                           tuple(f"{ours}mixer.{n}_proj.{kind}" for n in "qkv"), groups=block.mixer.heads)
                      for kind in ("weight", "bias")]
            links += [rename(f"{theirs}self_attention.dense.{p}", f"{ours}mixer.out_proj.{p}") for p in ("weight", "bias")]
            links += [rename(f"{theirs}mlp.dense_{t}.{p}", f"{ours}mlp.{o}.{p}")
                      for t, o in (("h_to_4h", "up"), ("4h_to_h", "down")) for p in ("weight", "bias")]
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in
                      (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2")) for p in ("weight", "bias")]
        return links


ARCHITECTURES = (Bloom(),)
