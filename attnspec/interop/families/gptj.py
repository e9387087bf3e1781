"""transformers' ``gptj`` model type (GPT-J) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, rename)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.gpt2 import Gpt2
from attnspec.spec import limits


class GptJ(Architecture):
    """GPT-J: attention and a plain MLP side by side on one LayerNorm's output (``parallel: shared_norm``):
    softmax attention without biases, RoPE (base 10000) on interleaved pairs of each head's first
    ``rotary_dim`` channels, and ``fc_in``, ``activation_function``, ``fc_out`` with biases; a final LayerNorm
    and an untied head with a bias."""

    model_types = ("gptj",)
    causal_lm = {"gptj": "GPTJForCausalLM"}
    config_fields = {"gptj": Gpt2.FIELDS}

    rows = (
        Row(("gptj",),
            "attention (no biases, RoPE on interleaved pairs of the first `rotary_dim` channels) and a plain biased "
            "MLP side by side on one LayerNorm's output (`parallel: shared_norm`), a head with a bias",
            "`rotary_dim` null (transformers' own model cannot run it); a tied head"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("tie_word_embeddings", bool, False):
            raise config.refuse("tie_word_embeddings", "GPT-J's head has a bias, which a head tied to the embedding "
                                                       "table cannot have in attnspec")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("n_head", f"{heads} heads do not divide n_embd = {width}")
        head_dim = width // heads
        rotary = config.count("rotary_dim")
        if rotary > head_dim or rotary % 2 or int(head_dim * (rotary / head_dim)) != rotary:
            raise config.refuse("rotary_dim", f"{rotary} rotated channels of a {head_dim}-channel head: an even number "
                                              "up to the head's width")
        position = {"kind": "rope", "base": 10000.0, "interleaved": True,
                    **({"rotary_fraction": rotary / head_dim} if rotary != head_dim else {})}
        norm = {"kind": "layernorm", "eps": config.number("norm_eps", 1e-5, positive=True)}
        block = {"mixer": {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "position": position},
                 "mlp": {"kind": "mlp", "hidden": config.get("intermediate_size", int, None) or 4 * width, "bias": True,
                         "activation": config.activation(default="gelu_new")},
                 "norm": norm, "parallel": "shared_norm"}
        return {**common_fields(config), "layers": compress_layers([block] * layers), "final_norm": norm,
                "head": {"kind": "lm", "tied": False, "scale": 1.0, "bias": True}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer = first.mixer
        position = mixer.position
        if any(b != first for b in blocks) or first.parallel != "shared_norm" or first.norm.kind != "layernorm" \
                or spec.final_norm != first.norm or first.mlp.kind != "mlp" or not first.mlp.bias \
                or mixer.kind != "softmax" or getattr(position, "kind", None) != "rope" or not position.interleaved \
                or position.base != 10000.0 or position.scaling != "none" or mixer.qkv_bias or mixer.out_bias \
                or mixer.kv_heads not in (None, mixer.heads) or mixer.heads * mixer.d_qk != spec.d_model \
                or mixer.qk_norm != "none" or mixer.d_qk != mixer.d_v or getattr(mixer, "window", None) is not None \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) or spec.head.tied or not spec.head.bias:
            raise NotExpressible("gptj is alike parallel blocks of bias-free attention with interleaved RoPE of base "
                                 "10000 and a plain MLP on one LayerNorm, and a head with a bias")
        return {"n_embd": spec.d_model, "n_layer": len(blocks), "n_head": mixer.heads, "n_positions": spec.max_len,
                "rotary_dim": position.rotary_width(mixer.d_qk), "n_inner": first.mlp.hidden,
                "activation_function": ACTIVATION_NAMES[first.mlp.activation], "layer_norm_epsilon": first.norm.eps}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.wte.weight", "embed.weight")]
        links += [rename(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        links += [rename(f"lm_head.{p}", f"head.{p}") for p in ("weight", "bias")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            links += [rename(f"{theirs}attn.{n}.weight", f"{ours}mixer.{n}.weight")
                      for n in ("q_proj", "k_proj", "v_proj", "out_proj")]
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in
                      (("mlp.fc_in", "mlp.up"), ("mlp.fc_out", "mlp.down"), ("ln_1", "norm1")) for p in ("weight", "bias")]
        return links


ARCHITECTURES = (GptJ(),)
