"""transformers' ``xglm`` model type (Meta's XGLM) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits

OFFSET = 2
"""XGLM's position table starts at row 2 (fairseq's padding index 1, plus one): token t is at position t + 2."""


class Xglm(Architecture):
    """XGLM: fairseq's decoder. Token embeddings times sqrt(d_model) with ``scale_embedding``, plus fixed
    sinusoids in tensor2tensor's spacing starting at position 2 (``position: {kind: sinusoidal, spacing:
    half_minus_one, offset: 2}``); pre-norm blocks of softmax attention with biases and a plain MLP
    (``ffn_dim``, ``activation_function``) with biases, under LayerNorms with biases; a final LayerNorm and a
    tied head."""

    model_types = ("xglm",)
    causal_lm = {"xglm": "XGLMForCausalLM"}
    config_fields = {"xglm": {"hidden_size": "d_model", "num_attention_heads": "attention_heads",
                              "num_hidden_layers": "num_layers"}}

    rows = (
        Row(("xglm",),
            "fairseq's decoder: embeddings times sqrt(d) (`scale_embedding`, `input.scale`) plus tensor2tensor's "
            "sinusoids from position 2 (`position: {kind: sinusoidal, spacing: half_minus_one, offset: 2}`), "
            "pre-norm biased attention and a biased plain MLP under biased LayerNorms, a tied head",
            "cross-attention (`add_cross_attention`); activations other than the gelu and relu kinds"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("add_cross_attention", bool, False):
            raise config.refuse("add_cross_attention", "attnspec imports decoder-only models; false imports")
        layers = config.count("num_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("d_model"), config.count("attention_heads")
        if width % heads:
            raise config.refuse("attention_heads", f"{heads} heads do not divide d_model = {width}")
        head_dim = width // heads
        norm = {"kind": "layernorm", "eps": 1e-5}  # nn.LayerNorm's default: XGLM's config names none
        block = {"mixer": {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": True,
                           "out_bias": True},
                 "mlp": {"kind": "mlp", "hidden": config.count("ffn_dim"), "bias": True,
                         "activation": config.activation("activation_function", ("gelu", "gelu_tanh", "relu"),
                                                         default="gelu")},
                 "norm": norm}
        common = common_fields(Config({**config.data, "hidden_size": width}, config.source))
        if config.get("scale_embedding", bool, True):
            common["input"]["scale"] = width ** 0.5
        return {**common, "position": {"kind": "sinusoidal", "spacing": "half_minus_one", "offset": OFFSET},
                "layers": compress_layers([block] * layers), "final_norm": norm, "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer, mlp = first.mixer, first.mlp
        position = spec.position
        norm = first.norm
        if any(b != first for b in blocks) or getattr(position, "kind", None) != "sinusoidal" \
                or position.spacing != "half_minus_one" or position.offset != OFFSET or position.base != 10000.0 \
                or spec.input.scale not in (1.0, spec.d_model ** 0.5) or not spec.head.tied \
                or norm.kind != "layernorm" or not norm.bias or norm.eps != 1e-5 or spec.final_norm != norm \
                or mixer.kind != "softmax" or not mixer.qkv_bias or not mixer.out_bias \
                or mixer.kv_heads not in (None, mixer.heads) or mixer.heads * mixer.d_qk != spec.d_model \
                or mixer.d_qk != mixer.d_v or mixer.qk_norm != "none" or getattr(mixer, "window", None) is not None \
                or mixer.position is not None and mixer.position.kind != "none" \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) or mlp.kind != "mlp" or not mlp.bias \
                or first.parallel != "none" or first.norm_placement != "pre":
            raise NotExpressible("xglm is fairseq's pre-norm decoder with tensor2tensor's sinusoids from position 2")
        return {"d_model": spec.d_model, "num_layers": len(blocks), "attention_heads": mixer.heads,
                "ffn_dim": mlp.hidden, "activation_function": ACTIVATION_NAMES[mlp.activation],
                "scale_embedding": spec.input.scale != 1.0, "max_position_embeddings": spec.max_len,
                "tie_word_embeddings": True}

    def links(self, spec) -> list[Link]:
        links = [rename("model.embed_tokens.weight", "embed.weight")]
        links += [rename(f"model.layer_norm.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += [rename(f"{theirs}self_attn.{n}_proj.{p}", f"{ours}mixer.{n}_proj.{p}")
                      for n in "qkv" for p in ("weight", "bias")]
            links += [rename(f"{theirs}self_attn.out_proj.{p}", f"{ours}mixer.out_proj.{p}") for p in ("weight", "bias")]
            links += [rename(f"{theirs}fc1.{p}", f"{ours}mlp.up.{p}") for p in ("weight", "bias")]
            links += [rename(f"{theirs}fc2.{p}", f"{ours}mlp.down.{p}") for p in ("weight", "bias")]
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in
                      (("self_attn_layer_norm", "norm1"), ("final_layer_norm", "norm2")) for p in ("weight", "bias")]
        return links


ARCHITECTURES = (Xglm(),)
