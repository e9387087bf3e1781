"""transformers' ``ctrl`` model type (Salesforce's CTRL) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits

LAYER_EPS = 1e-6
"""The eps of every layer's LayerNorms: CTRL's EncoderLayer fixes it (``layer_norm_epsilon`` is the final norm's)."""


class Ctrl(Architecture):
    """CTRL: token embeddings times sqrt(n_embd) plus fixed sinusoids (sin then cos halves, attnspec's
    `sinusoidal`), pre-norm blocks of softmax attention with biases and a ReLU MLP with biases (``dff``) under
    LayerNorms with biases (eps 1e-6 inside the layers, ``layer_norm_epsilon`` for the final one), and a head tied
    to the embedding with a bias of its own."""

    model_types = ("ctrl",)
    causal_lm = {"ctrl": "CTRLLMHeadModel"}
    config_fields = {"ctrl": {"n_embd": "hidden_size", "n_positions": "max_position_embeddings"}}

    rows = (
        Row(("ctrl",),
            "embeddings times sqrt(d) (`input.scale`) plus sin/cos sinusoids (`position: sinusoidal`), pre-norm "
            "biased attention and a biased ReLU MLP under biased LayerNorms, a tied head with a bias",
            "an untied head (`tie_word_embeddings: false`: transformers' CTRL ties it whatever the config says)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if not config.get("tie_word_embeddings", bool, True):
            raise config.refuse("tie_word_embeddings", "CTRL's head reads the embedding; true imports")
        layers = config.count("n_layer", limit=limits.MAX_BLOCKS)
        width, heads = config.count("n_embd"), config.count("n_head")
        if width % heads:
            raise config.refuse("n_head", f"{heads} heads do not divide n_embd = {width}")
        norm = {"kind": "layernorm", "eps": LAYER_EPS}
        block = {"mixer": {"kind": "softmax", "heads": heads, "d_qk": width // heads, "d_v": width // heads,
                           "qkv_bias": True, "out_bias": True},
                 "mlp": {"kind": "mlp", "hidden": config.count("dff"), "bias": True, "activation": "relu"},
                 "norm": norm}
        common = common_fields(config)
        common["input"]["scale"] = width ** 0.5
        return {**common, "position": {"kind": "sinusoidal"}, "layers": compress_layers([block] * layers),
                "final_norm": {"kind": "layernorm", "eps": config.number("layer_norm_epsilon", 1e-6, positive=True)},
                "head": {"kind": "lm", "tied": True, "scale": 1.0, "bias": True}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer, mlp, norm, position = first.mixer, first.mlp, first.norm, spec.position
        if any(b != first for b in blocks) or getattr(position, "kind", None) != "sinusoidal" \
                or position.spacing != "half" or position.offset != 0 or position.base != 10000.0 \
                or spec.input.scale != spec.d_model ** 0.5 or not spec.head.tied or not spec.head.bias \
                or spec.head.scale not in (None, 1.0) or spec.head.softcap is not None \
                or norm.kind != "layernorm" or not norm.bias or norm.eps != LAYER_EPS \
                or spec.final_norm.kind != "layernorm" or not spec.final_norm.bias \
                or mixer.kind != "softmax" or not mixer.qkv_bias or not mixer.out_bias \
                or mixer.kv_heads not in (None, mixer.heads) or mixer.heads * mixer.d_qk != spec.d_model \
                or mixer.d_qk != mixer.d_v or mixer.qk_norm != "none" or mixer.window is not None or mixer.sinks \
                or mixer.position is not None and mixer.position.kind != "none" or mixer.qkv_clip is not None \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) or mlp.kind != "mlp" or not mlp.bias \
                or mlp.activation != "relu" or first.parallel != "none" or first.norm_placement != "pre":
            raise NotExpressible("ctrl is pre-norm biased attention and ReLU MLPs over scaled embeddings and "
                                 "sinusoids, with a tied, biased head")
        return {"n_embd": spec.d_model, "n_layer": len(blocks), "n_head": mixer.heads, "dff": mlp.hidden,
                "n_positions": spec.max_len, "layer_norm_epsilon": spec.final_norm.eps, "tie_word_embeddings": True}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.w.weight", "embed.weight")]
        if spec.head.tied:
            links.append(rename("lm_head.bias", "head_bias"))
        else:  # a stored head that differs from the embedding: transformers then loads it untied
            links += [rename(f"lm_head.{p}", f"head.{p}") for p in ("weight", "bias")]
        links += [rename(f"transformer.layernorm.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            attention = f"{theirs}multi_head_attention."
            links += [rename(f"{attention}W{n}.{p}", f"{ours}mixer.{n}_proj.{p}") for n in "qkv" for p in
                      ("weight", "bias")]
            links += [rename(f"{attention}dense.{p}", f"{ours}mixer.out_proj.{p}") for p in ("weight", "bias")]
            links += [rename(f"{theirs}ffn.{t}.{p}", f"{ours}mlp.{o}.{p}") for t, o in (("0", "up"), ("2", "down"))
                      for p in ("weight", "bias")]
            links += [rename(f"{theirs}layernorm{i}.{p}", f"{ours}norm{i}.{p}") for i in (1, 2)
                      for p in ("weight", "bias")]
        return links


ARCHITECTURES = (Ctrl(),)
