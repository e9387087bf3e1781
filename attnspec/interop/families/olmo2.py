"""transformers' ``olmo2`` and ``olmo3`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from typing import Any

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, glu_node, head_node, lm_links,
                                           rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits



class Olmo2(Architecture):
    """OLMo 2 and OLMo 3: softmax attention in OLMo 2's placement, x + norm(f(x)) for the attention and the
    SiLU GLU alike, with QK-norm over the whole q and k projections before RoPE. OLMo 3 adds a sliding
    window on the layers ``layer_types`` names (by default three of every four), with RoPE parameters per
    layer type."""

    model_types = ("olmo2", "olmo3")
    causal_lm = {"olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM"}

    rows = (
        Row(("olmo2", "olmo3"),
            "softmax attention (GQA, RoPE with its scaling, biases with `attention_bias`) and a SiLU GLU, each in "
            "OLMo 2's placement (`norm_placement: output`: x + norm(f(x))), with QK-norm over the whole q and k "
            "projections (`qk_norm: rmsnorm_full`); OLMo 3's `sliding_window` on the `sliding_attention` layers of "
            "`layer_types`, each layer type with its own RoPE parameters",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads()
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        types, window = self.layer_types(config, model_type, layers)
        mlps = self.mlp_nodes(config, layers)
        blocks = []
        for layer_type, mlp in zip(types, mlps, strict=True):
            mixer: dict[str, Any] = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                                     "qk_norm": self.QK_NORM, "norm_eps": eps, "qkv_bias": bias, "out_bias": bias,
                                     "position": self.position(config, head_dim, layer_type, window)}
            if kv_heads != heads:
                mixer["kv_heads"] = kv_heads
            if layer_type == "sliding_attention":
                mixer["window"] = window
            blocks.append({"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(eps), "norm_placement": self.PLACEMENT})
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    QK_NORM = "rmsnorm_full"
    """OLMo's QK-norm: over the whole q and k projections."""
    PLACEMENT = "output"
    """The blocks' ``norm_placement``: OLMo 2's x + norm(f(x)) (a member in Llama's pre-norm places: ``pre``)."""
    NORM_NAMES = {"pre": (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2")),
                  "output": (("post_attention_layernorm", "norm1"), ("post_feedforward_layernorm", "norm2")),
                  "sandwich": (("input_layernorm", "norm1"), ("post_self_attn_layernorm", "post_norm1"),
                               ("post_attention_layernorm", "norm2"), ("post_mlp_layernorm", "post_norm2"))}
    """Each placement's norms as transformers names them (GLM-4's four for the sandwich) and as attnspec does."""

    def layer_types(self, config: Config, model_type: str, layers: int) -> tuple[list[str], int | None]:
        """Each layer's type (``full_attention`` or ``sliding_attention``) and the sliding window."""
        if model_type == "olmo2":
            return ["full_attention"] * layers, None
        default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
        return config.attention_layer_types(layers, default), config.count("sliding_window", 4096)

    def position(self, config: Config, head_dim: int, layer_type: str, window: int | None) -> dict:
        """A layer's position scheme: RoPE with its layer type's parameters."""
        return config.rope(head_dim, layer_type=layer_type)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [block.mixer for block in blocks]
        if any(m.kind != "softmax" or m.qk_norm != self.QK_NORM for m in mixers) \
                or any(block.norm_placement != self.PLACEMENT for block in blocks):
            raise NotExpressible(f"{model_type} is QK-normed softmax attention with {self.PLACEMENT}-placed norms")
        return self.attention_config(spec, model_type, blocks)

    def attention_config(self, spec, model_type: str, blocks) -> dict:
        """The config of OLMo 2's and 3's attention (windows, RoPE per layer type) and MLP."""
        mixers = [block.mixer for block in blocks]
        if any(m.position is None or m.position.kind != "rope" for m in mixers):
            raise NotExpressible(f"{model_type} has RoPE in every layer")
        windows = [getattr(m, "window", None) for m in mixers]
        if model_type == "olmo2" and any(windows):
            raise NotExpressible("olmo2 has no sliding windows")
        if len({w for w in windows if w is not None}) > 1:
            raise NotExpressible(f"{model_type} has one sliding window")
        first, mlp = mixers[0], blocks[0].mlp
        types = ["full_attention" if w is None else "sliding_attention" for w in windows]
        rope = {t: rope_config(m.position) for t, m in zip(types, mixers)}
        config = {"hidden_size": spec.d_model, **self.mlp_config(blocks), "num_hidden_layers": len(blocks),
                  "num_attention_heads": first.heads, "num_key_value_heads": first.kv_heads or first.heads,
                  "hidden_act": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": first.norm_eps,
                  "attention_bias": first.qkv_bias}
        if first.d_qk * first.heads != spec.d_model:  # transformers' OLMo attention takes its width from the model's
            raise NotExpressible(f"{model_type}'s heads are hidden_size / num_attention_heads wide")
        if model_type == "olmo2":
            return {**config, "rope_parameters": rope["full_attention"]}
        return {**config, "layer_types": types, "sliding_window": next((w for w in windows if w), 4096),
                "rope_parameters": rope}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q"),
                      rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k")]
            links += [rename(f"{theirs}{name}.weight", f"{ours}{norm}.weight")
                      for name, norm in self.NORM_NAMES[self.PLACEMENT]]
            links += self.mlp_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.")
        return links

    def mlp_node(self, config: Config) -> dict:
        """Every layer's MLP (a SiLU GLU; a member with experts gives its own)."""
        return glu_node(config)

    def mlp_nodes(self, config: Config, layers: int) -> list[dict]:
        """Each layer's MLP: :meth:`mlp_node` in every layer (a member whose layers differ gives its own)."""
        return [self.mlp_node(config)] * layers

    def mlp_config(self, blocks) -> dict:
        """The config fields of the blocks' MLP (the inverse of :meth:`mlp_node`)."""
        mlp = blocks[0].mlp
        if any(b.mlp != mlp or b.mlp.kind != "glu" or b.mlp.bias for b in blocks):
            raise NotExpressible("OLMo 2's layers have one bias-free GLU")
        return {"intermediate_size": mlp.hidden}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return glu_links(theirs, ours, False)


ARCHITECTURES = (Olmo2(),)
