"""transformers' ``gemma3_text`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import json
import math

from attnspec.interop.architecture import (Architecture, Link, Row, Wrapper, attention_links, block_prefix,
                                           common_fields, compress_layers, expanded_blocks, glu_links, head_node,
                                           lm_links, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Gemma3(Architecture):
    """Gemma 3's text model: sandwich norms (a norm before and after each sub-layer, RMSNorms of
    weight 1 + w), GQA attention with QK-norm, the softmax scale ``query_pre_attn_scalar``^-1/2, sliding
    windows and RoPE bases per layer type (local and global), a tanh-GeLU GLU MLP, embeddings times
    sqrt(hidden_size), a tied head with an optional logit soft-cap. Multimodal Gemma 3 imports its text model."""

    model_types = ("gemma3_text",)
    causal_lm = {"gemma3_text": "Gemma3ForCausalLM"}
    wrappers = {"gemma3": Wrapper("gemma3_text",
                                  {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."},
                                  ("vision_tower.", "multi_modal_projector."), ("final_logit_softcapping",))}
    """Gemma3ForConditionalGeneration applies no logit soft-cap: Gemma3ForCausalLM's alone."""

    rows = (
        Row(("gemma3_text",),
            "Gemma 3's text model: sandwich norms (`norm_placement: sandwich`, weights 1 + w), QK-norm, the scale "
            "`query_pre_attn_scalar`^-1/2, windows and RoPE (with its scaling) per layer type, a tanh-GeLU GLU, "
            "embeddings times sqrt(d), a tied head with `final_logit_softcapping`",
            "`attn_logit_softcapping` (transformers' Gemma 3 attention never applies it), bidirectional attention"),
        Row(("gemma3",),
            "the multimodal release's text model: `text_config` and the `language_model.model.` tensors, as "
            "`gemma3_text` but without the logit soft-cap (Gemma3ForConditionalGeneration applies none); the vision "
            "tower and projector are not read",
            "images: attnspec models are text models"),
    )

    QK_NORM = True
    """Gemma 3 normalises queries and keys per head (Gemma 2 does not)."""
    WINDOW_PATTERN = 6
    """Every WINDOW_PATTERN-th layer attends globally, the others in a window, where `layer_types` is absent."""
    ATTENTION_SOFTCAP = False
    """Whether the type's attention applies `attn_logit_softcapping` (Gemma 2's does). Gemma 3's config holds
    the field but its attention never reads it (transformers 5): a value set there is refused, not dropped."""
    NORM_PLACEMENT = "sandwich"
    """A norm before and after each sub-layer (VaultGemma's: before only, `pre`)."""
    ROPE_PER_LAYER_TYPE = True
    """`rope_parameters` per layer type (Gemma 3's local and global bases); Gemma 2's config holds one."""
    SOFTCAPS = {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    """The soft-caps a config that does not name them gets (its transformers config class's defaults: a GGUF
    file's config names neither)."""
    DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
    """Gemma3TextConfig's RoPE bases where the config states none (``default_theta``)."""

    def _per_layer_type_rope(self, config: Config) -> Config:
        """``config`` with ``rope_parameters`` per layer type, built as Gemma3TextConfig builds it from the
        flat fields where the config has none (transformers 4 configs, GGUF files): the global layers take
        ``rope_theta`` and ``rope_scaling``, the local ones ``rope_local_base_freq``, each base defaulting to
        :data:`DEFAULT_THETA`'s."""
        if not self.ROPE_PER_LAYER_TYPE or config.data.get("rope_parameters") is not None:
            return config
        scaling = config.get("rope_scaling", dict, None) or {}
        full = {"rope_type": "default", **scaling,
                "rope_theta": config.number("rope_theta", self.DEFAULT_THETA["full_attention"])}
        local = {"rope_type": "default",
                 "rope_theta": config.number("rope_local_base_freq", self.DEFAULT_THETA["sliding_attention"])}
        data = {**config.data, "rope_parameters": {"full_attention": full, "sliding_attention": local}}
        return Config(data, config.source)

    def spec(self, config: Config, model_type: str) -> dict:
        config = self._per_layer_type_rope(config)
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        heads, kv_heads, head_dim = config.attention_heads()
        if config.get("use_bidirectional_attention", bool, None):
            raise config.refuse("use_bidirectional_attention", "bidirectional attention is not a causal LM's; unset "
                                "imports")
        softcap = None
        caps = {**self.SOFTCAPS, **{field: config.data[field] for field in self.SOFTCAPS if field in config.data}}
        config = Config({**config.data, **caps}, config.source)  # an absent cap is the class's default
        if config.data.get("attn_logit_softcapping") is not None:
            if not self.ATTENTION_SOFTCAP:
                raise config.refuse("attn_logit_softcapping", f"transformers' {model_type} attention never applies "
                                    "it, so what it would mean is unclear; unset imports")
            softcap = config.number("attn_logit_softcapping", None, positive=True)
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        window = config.count("sliding_window", 4096)
        pattern = config.count("sliding_window_pattern", self.WINDOW_PATTERN)
        default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        types = config.attention_layer_types(layers, default)
        mlp = {"kind": "glu", "hidden": config.count("intermediate_size"), "bias": False,
               "activation": config.activation("hidden_activation", default="gelu_pytorch_tanh")}
        blocks = []
        for layer_type in types:
            mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                     "out_bias": bias, **({"qk_norm": "rmsnorm", "norm_eps": eps} if self.QK_NORM else {}),
                     "scale": config.number("query_pre_attn_scalar", 256, positive=True) ** -0.5,
                     "position": config.rope(head_dim, layer_type=layer_type),
                     **({"kv_heads": kv_heads} if kv_heads != heads else {}),
                     **({"window": window} if layer_type == "sliding_attention" else {}),
                     **({"softcap": softcap} if softcap else {})}
            blocks.append({"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(eps), "norm_placement": self.NORM_PLACEMENT})
        common = common_fields(config)
        common["input"]["scale"] = math.sqrt(d_model)
        softcap = config.number("final_logit_softcapping", None) if config.data.get("final_logit_softcapping") else None
        head = {**head_node(config, True), **({"softcap": softcap} if softcap else {})}
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0].mixer
        if any(b.mixer.kind != "softmax" or b.norm_placement != self.NORM_PLACEMENT for b in blocks):
            raise NotExpressible(f"{model_type} is softmax attention with {self.NORM_PLACEMENT} norms in every block")
        if any(b.mixer.qk_norm != ("rmsnorm" if self.QK_NORM else "none") for b in blocks):
            raise NotExpressible(f"{model_type} {'normalises' if self.QK_NORM else 'does not normalise'} queries "
                                 "and keys in every block")
        caps = {b.mixer.softcap for b in blocks}
        if len(caps) > 1 or (caps != {None} and not self.ATTENTION_SOFTCAP):
            raise NotExpressible(f"{model_type} caps every layer's attention logits alike, or none"
                                 if self.ATTENTION_SOFTCAP else f"{model_type} does not cap attention logits")
        windows = [b.mixer.window for b in blocks]
        types = ["full_attention" if w is None else "sliding_attention" for w in windows]
        rope = {t: rope_config(b.mixer.position) for t, b in zip(types, blocks)}
        if not self.ROPE_PER_LAYER_TYPE:
            if len({json.dumps(r, sort_keys=True) for r in rope.values()}) > 1:
                raise NotExpressible(f"{model_type} has one RoPE for every layer, not one per layer type")
            rope = next(iter(rope.values()))
        mlp = blocks[0].mlp
        config = {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden, "num_hidden_layers": len(blocks),
                  "num_attention_heads": first.heads, "num_key_value_heads": first.kv_heads or first.heads,
                  "head_dim": first.d_qk, "hidden_activation": ACTIVATION_NAMES[mlp.activation],
                  "rms_norm_eps": blocks[0].norm.eps, "attention_bias": first.qkv_bias, "layer_types": types,
                  "sliding_window": next((w for w in windows if w is not None), 4096), "rope_parameters": rope,
                  "query_pre_attn_scalar": self._scalar(first.scale), "final_logit_softcapping": spec.head.softcap}
        if self.ATTENTION_SOFTCAP:
            config["attn_logit_softcapping"] = first.softcap
        return config

    @staticmethod
    def _scalar(scale: float) -> int:
        """``query_pre_attn_scalar`` of a softmax scale: a whole number (Gemma3TextConfig takes nothing else)."""
        scalar = scale ** -2
        if abs(scalar - round(scalar)) > 1e-6 * scalar:
            raise NotExpressible(f"gemma3's softmax scale is a whole number's inverse root, not {scale!r}")
        return round(scalar)

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight", 1.0)
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            if self.QK_NORM:
                links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q", 1.0),
                          rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k", 1.0)]
            norms = (("input_layernorm", "norm1"), ("pre_feedforward_layernorm", "norm2"))
            if self.NORM_PLACEMENT == "sandwich":
                norms += (("post_attention_layernorm", "post_norm1"), ("post_feedforward_layernorm", "post_norm2"))
            for their_norm, our_norm in norms:
                links.append(rename(f"{theirs}{their_norm}.weight", f"{ours}{our_norm}.weight", 1.0))
            links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


ARCHITECTURES = (Gemma3(),)
