"""transformers' ``gpt_neox_japanese`` model type as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, common_fields, compress_layers, expanded_blocks,
                                           head_node, rename, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.gpt_neox import GptNeoX
from attnspec.spec import limits


class GptNeoXJapanese(GptNeoX):
    """GPT-NeoX Japanese: GPT-NeoX's per-head packed q/k/v without biases in pre-norm blocks one after the other,
    a bias added to the attention's output in the last layer alone (``dense_bias``: that block's `out_bias`), an
    MLP without biases ``intermediate_multiple_size`` times as wide, LayerNorms with biases and a tied head."""

    model_types = ("gpt_neox_japanese",)
    causal_lm = {"gpt_neox_japanese": "GPTNeoXJapaneseForCausalLM"}
    stored_names: dict = {}
    config_fields: dict = {}
    ROTARY_FRACTION, ACTIVATION = 1.0, "gelu"
    EMBED, LAYERS, FINAL_NORM = "gpt_neox_japanese.embed_in", "gpt_neox_japanese.layers", \
        "gpt_neox_japanese.final_layer_norm"

    rows = (
        Row(("gpt_neox_japanese",),
            "gpt_neox's packed attention without biases in sequential pre-norm blocks, the last block's output "
            "projection biased (`dense_bias`), a bias-free MLP, a tied head",
            "RoPE scalings as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("num_attention_heads", f"{heads} heads do not divide hidden_size = {width}")
        hidden = width * config.count("intermediate_multiple_size", 4, limit=limits.MAX_EXPANSION)
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_eps", 1e-5, positive=True)}
        mixer = {"kind": "softmax", "heads": heads, "d_qk": width // heads, "d_v": width // heads,
                 "position": config.rope(width // heads, self.ROTARY_FRACTION)}
        mlp = {"kind": "mlp", "hidden": hidden, "bias": False, "activation": config.activation(default="gelu")}
        blocks = [{"mixer": {**mixer, "out_bias": index == layers - 1}, "mlp": mlp, "norm": norm}
                  for index in range(layers)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": norm,
                "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer, mlp, norm = first.mixer, first.mlp, first.norm
        biased = [b.mixer.out_bias for b in blocks]
        if any(b.model_copy(update={"mixer": b.mixer.model_copy(update={"out_bias": False})}) !=
               first.model_copy(update={"mixer": mixer.model_copy(update={"out_bias": False})}) for b in blocks) \
                or biased != [False] * (len(blocks) - 1) + [True] or norm.kind != "layernorm" or not norm.bias \
                or spec.final_norm != norm or mixer.kind != "softmax" or mixer.qkv_bias \
                or getattr(mixer.position, "kind", None) != "rope" or mixer.position.interleaved \
                or mixer.kv_heads not in (None, mixer.heads) or mixer.heads * mixer.d_qk != spec.d_model \
                or mixer.d_qk != mixer.d_v or mixer.qk_norm != "none" or mixer.window is not None \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) or mlp.kind != "mlp" or mlp.bias \
                or first.parallel != "none" or not spec.head.tied:
            raise NotExpressible("gpt_neox_japanese is sequential bias-free packed attention (the last block's "
                                 "output biased) and MLPs under biased LayerNorms, with a tied head")
        if mlp.hidden % spec.d_model:
            raise NotExpressible("gpt_neox_japanese's MLP is a whole multiple of hidden_size wide")
        rope = {**rope_config(mixer.position), "partial_rotary_factor": mixer.position.rotary_fraction}
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                "intermediate_multiple_size": mlp.hidden // spec.d_model,
                "hidden_act": ACTIVATION_NAMES[mlp.activation], "layer_norm_eps": norm.eps, "rope_parameters": rope,
                "tie_word_embeddings": True}

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        last = len(expanded_blocks(spec)) - 1
        theirs = f"{self.LAYERS}.{last}.{self.ATTENTION}.dense.bias"
        return [rename(f"{self.LAYERS}.{last}.{self.ATTENTION}.dense_bias", link.ours[0]) if link.theirs == theirs
                else link for link in links]


ARCHITECTURES = (GptNeoXJapanese(),)
