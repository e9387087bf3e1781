"""transformers' ``opt`` model type (Meta's OPT) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits

POSITION_OFFSET = 2
"""OPT's position table keeps two rows before position 0's (``OPTLearnedPositionalEmbedding``'s offset)."""


class Opt(Architecture):
    """OPT: a learned position table (its first two rows unused), softmax attention with biases (scale
    head_dim^-1/2) and a plain MLP (``fc1``, ``activation_function``, ``fc2``), with LayerNorms before each
    sub-layer and a final one (``do_layer_norm_before``), or after each residual sum and none at the end
    (OPT-350M); a tied head."""

    model_types = ("opt",)
    causal_lm = {"opt": "OPTForCausalLM"}
    rows = (
        Row(("opt",),
            "a learned position table (after its two unused rows), biased softmax attention and a plain MLP "
            "(`ffn_dim`, `activation_function`) under LayerNorms before each sub-layer, or after each residual "
            "sum (`do_layer_norm_before: false`: `norm_placement: post`, no final norm); a tied head",
            "`word_embed_proj_dim` other than `hidden_size` (OPT-350M's projections around the layers), "
            "LayerNorms without weights, `_remove_final_layer_norm`, `enable_bias: false`"),
    )

    PREFIX = "model.decoder."
    """Where the decoder's tensors are stored."""
    FINAL_NORM, HEAD = "final_layer_norm", "lm_head"
    """The final LayerNorm's and the untied head's names."""
    FFN, ACTIVATION = ("ffn_dim", "relu"), "activation_function"
    """The MLP width's field (and the activation's default), the activation's field."""

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("num_attention_heads", f"{heads} heads do not divide hidden_size = {width}")
        if config.count("word_embed_proj_dim", width) != width:
            raise config.refuse("word_embed_proj_dim", "projections of the embeddings into and out of the layers "
                                "(OPT-350M) are not attnspec's; only word_embed_proj_dim = hidden_size imports")
        for field, wanted in (("enable_bias", True), ("layer_norm_elementwise_affine", True),
                              ("_remove_final_layer_norm", False)):
            if config.get(field, bool, wanted) != wanted:
                raise config.refuse(field, f"only {field}: {str(wanted).lower()} imports")
        before = config.get("do_layer_norm_before", bool, True)
        norm = {"kind": "layernorm", "eps": self.eps(config)}
        mlp = {"kind": "mlp", "hidden": config.count(self.FFN[0]), "bias": True,
               "activation": config.activation(self.ACTIVATION, ("gelu", "gelu_tanh", "relu", "relu2", "silu"),
                                               default=self.FFN[1])}
        block = {"mixer": {"kind": "softmax", "heads": heads, "d_qk": width // heads, "d_v": width // heads,
                           "qkv_bias": True, "out_bias": True},
                 "mlp": mlp, "norm": norm, **({} if before else {"norm_placement": "post"})}
        common = common_fields(config)
        common["input"].update(self.input_scale(config, width))
        return {**common, "position": {"kind": "learned"}, "layers": compress_layers([block] * layers),
                "final_norm": norm if before else {"kind": "none"}, "head": head_node(config, True)}

    def eps(self, config: Config) -> float:
        """The LayerNorms' epsilon: OPT's are torch's default (its config has no field)."""
        return 1e-5

    def input_scale(self, config: Config, width: int) -> dict:
        """The embeddings' multiplier (none in OPT)."""
        return {}

    def type_fields(self, spec, first) -> dict:
        """The config fields :meth:`config` writes beyond the shared ones (the inverse of the hooks above)."""
        if spec.input.scale != 1.0:
            raise NotExpressible("opt does not scale its embeddings")
        return {"word_embed_proj_dim": spec.d_model, "ffn_dim": first.mlp.hidden,
                "activation_function": ACTIVATION_NAMES[first.mlp.activation],
                "do_layer_norm_before": first.norm_placement == "pre"}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer = first.mixer
        before = first.norm_placement == "pre"
        if spec.position.kind != "learned" or spec.final_norm.kind != ("layernorm" if before else "none") \
                or any(b != first for b in blocks) or first.norm_placement not in ("pre", "post") \
                or mixer.kind != "softmax" or getattr(mixer, "window", None) is not None \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) \
                or not (mixer.qkv_bias and mixer.out_bias) or mixer.kv_heads not in (None, mixer.heads) \
                or mixer.qk_norm != "none" or mixer.d_qk != mixer.d_v or mixer.heads * mixer.d_qk != spec.d_model \
                or getattr(mixer.position, "kind", "none") != "none" or first.mlp.kind != "mlp" or not first.mlp.bias \
                or first.norm.kind != "layernorm" or not first.norm.bias or (before and spec.final_norm != first.norm):
            raise NotExpressible(f"{model_type} is learned positions and alike blocks of biased attention and a "
                                 "biased MLP under LayerNorms before each sub-layer or after each residual sum")
        return {"vocab_size": spec.input.vocab_size, "max_position_embeddings": spec.max_len,
                "hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                "tie_word_embeddings": spec.head.tied, **self.type_fields(spec, first)}

    def links(self, spec) -> list[Link]:
        links = [rename(f"{self.PREFIX}embed_tokens.weight", "embed.weight"),
                 Link(f"{self.PREFIX}embed_positions.weight", ("position.table",), lead=POSITION_OFFSET)]
        if spec.final_norm.kind == "layernorm":
            links += [rename(f"{self.PREFIX}{self.FINAL_NORM}.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        if not spec.head.tied:
            links.append(rename(f"{self.HEAD}.weight", "head.weight"))
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"{self.PREFIX}layers.{index}.", block_prefix(index)
            links += [rename(f"{theirs}self_attn.{n}_proj.{p}", f"{ours}mixer.{n}_proj.{p}")
                      for n in ("q", "k", "v", "out") for p in ("weight", "bias")]
            links += [rename(f"{theirs}{their}.{p}", f"{ours}mlp.{our}.{p}")
                      for their, our in (("fc1", "up"), ("fc2", "down")) for p in ("weight", "bias")]
            links += [rename(f"{theirs}{their}.{p}", f"{ours}{our}.{p}")
                      for their, our in (("self_attn_layer_norm", "norm1"), ("final_layer_norm", "norm2"))
                      for p in ("weight", "bias")]
        return links


class BioGpt(Opt):
    """BioGPT: OPT's layers (pre-norm), its position table after two unused rows, embeddings times
    sqrt(hidden_size) with ``scale_embedding``, GeLU; its LayerNorms take torch's epsilon (the config's
    ``layer_norm_eps`` is never read by the model); the tied head is ``output_projection``."""

    model_types = ("biogpt",)
    causal_lm = {"biogpt": "BioGptForCausalLM"}
    rows = (
        Row(("biogpt",),
            "opt's pre-norm layers and position table, embeddings times sqrt(d) with `scale_embedding`, "
            "`hidden_act` (`layer_norm_eps` is unread, as in transformers)",
            "as opt"),
    )
    PREFIX = "biogpt."
    FINAL_NORM, HEAD = "layer_norm", "output_projection"
    FFN, ACTIVATION = ("intermediate_size", "gelu"), "hidden_act"

    def eps(self, config: Config) -> float:  # its LayerNorms are built without it: torch's default, as OPT's
        return 1e-5

    def input_scale(self, config: Config, width: int) -> dict:
        return {"scale": math.sqrt(width)} if config.get("scale_embedding", bool, True) else {}

    def type_fields(self, spec, first) -> dict:
        if first.norm_placement != "pre" or spec.input.scale not in (1.0, math.sqrt(spec.d_model)):
            raise NotExpressible("biogpt's LayerNorms come before each sub-layer, its embeddings times 1 or sqrt(d)")
        return {"intermediate_size": first.mlp.hidden, "hidden_act": ACTIVATION_NAMES[first.mlp.activation],
                "scale_embedding": spec.input.scale != 1.0}


ARCHITECTURES = (Opt(), BioGpt())
