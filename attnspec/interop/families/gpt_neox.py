"""transformers' ``gpt_neox`` model type (GPT-NeoX, Pythia) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class GptNeoX(Architecture):
    """GPT-NeoX: softmax attention (biases with ``attention_bias``; each head's q, k and v packed in turn in
    ``query_key_value``; RoPE on the first ``partial_rotary_factor`` of each head, a quarter by default) and a
    plain MLP with biases, under LayerNorms with biases; with ``use_parallel_residual`` (the default) the two
    side by side, each on its own norm of the block's input (``parallel: own_norms``); an untied head."""

    model_types = ("gpt_neox",)
    causal_lm = {"gpt_neox": "GPTNeoXForCausalLM"}
    stored_names = {"gpt_neox": ((r"^lm_head\.", "embed_out."),)}
    """Its checkpoints name the head ``embed_out`` (transformers renames it on load)."""
    config_fields = {"gpt_neox": {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}}
    """The names of configs written before transformers 5's ``rope_parameters``."""

    ROTARY_FRACTION, ACTIVATION = 0.25, "gelu"
    """What the config class assumes where a config states no ``partial_rotary_factor`` or ``hidden_act``."""
    EMBED, LAYERS, FINAL_NORM = "gpt_neox.embed_in", "gpt_neox.layers", "gpt_neox.final_layer_norm"
    ATTENTION = "attention"
    """Where the checkpoint keeps the embedding, the layers, the final norm and each layer's attention."""

    rows = (
        Row(("gpt_neox",),
            "softmax attention (biases, per-head packed q/k/v, RoPE on the first `partial_rotary_factor` of each "
            "head) and a plain biased MLP under biased LayerNorms, side by side on their own norms with "
            "`use_parallel_residual` (`parallel: own_norms`)",
            "RoPE scalings as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("num_attention_heads", f"{heads} heads do not divide hidden_size = {width}")
        head_dim = width // heads
        bias = config.get("attention_bias", bool, True)
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_eps", 1e-5, positive=True)}
        block = {"mixer": {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                           "out_bias": bias, "position": config.rope(head_dim, self.ROTARY_FRACTION)},
                 "mlp": {"kind": "mlp", "hidden": config.count("intermediate_size"), "bias": True,
                         "activation": config.activation(default=self.ACTIVATION)},
                 "norm": norm, "parallel": "own_norms" if config.get("use_parallel_residual", bool, True) else "none"}
        return {**common_fields(config), "layers": compress_layers([self.member_block(config, block)] * layers),
                "final_norm": norm, "head": head_node(config, False)}

    def member_block(self, config: Config, block: dict) -> dict:
        """Every layer's block data as a member of the family builds it from GPT-NeoX's ``block``."""
        return block

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer = first.mixer
        if any(b != first for b in blocks) or spec.final_norm != first.norm or first.norm.kind != "layernorm" \
                or first.mlp.kind != "mlp" or not first.mlp.bias or first.parallel == "shared_norm" \
                or mixer.kind != "softmax" or getattr(mixer.position, "kind", None) != "rope" \
                or mixer.qkv_bias != mixer.out_bias or mixer.kv_heads not in (None, mixer.heads) \
                or mixer.heads * mixer.d_qk != spec.d_model or mixer.d_qk != mixer.d_v or mixer.qk_norm != "none" \
                or getattr(mixer, "window", None) is not None or mixer.position.interleaved \
                or mixer.scale not in (None, mixer.d_qk ** -0.5):
            raise NotExpressible("gpt_neox is alike blocks of biased RoPE attention and a plain MLP under LayerNorms")
        rope = {**rope_config(mixer.position), "partial_rotary_factor": mixer.position.rotary_fraction}
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                "intermediate_size": first.mlp.hidden, "hidden_act": ACTIVATION_NAMES[first.mlp.activation],
                "layer_norm_eps": first.norm.eps, "attention_bias": mixer.qkv_bias, "rope_parameters": rope,
                "use_parallel_residual": first.parallel == "own_norms"}

    def links(self, spec) -> list[Link]:
        links = [rename(f"{self.EMBED}.weight", "embed.weight")]
        links += [rename(f"{self.FINAL_NORM}.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"{self.LAYERS}.{index}.", block_prefix(index)
            attention = f"{theirs}{self.ATTENTION}."
            kinds = ("weight", "bias") if block.mixer.qkv_bias else ("weight",)
            links += [Link(f"{attention}query_key_value.{kind}",
                           tuple(f"{ours}mixer.{n}_proj.{kind}" for n in "qkv"), groups=block.mixer.heads)
                      for kind in kinds]
            links += [rename(f"{attention}dense.{kind}", f"{ours}mixer.out_proj.{kind}")
                      for kind in ("weight", "bias")[:1 + block.mixer.out_bias]]
            links += [rename(f"{theirs}mlp.dense_{t}.{p}", f"{ours}mlp.{o}.{p}")
                      for t, o in (("h_to_4h", "up"), ("4h_to_h", "down"))
                      for p in ("weight", "bias")[:1 + block.mlp.bias]]
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in
                      (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2")) for p in ("weight", "bias")]
        return links


ARCHITECTURES = (GptNeoX(),)
