"""transformers' ``gpt2`` model type (GPT-2, and GPT-SW3, whose config is GPT-2's) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Gpt2(Architecture):
    """GPT-2: a learned position table added to the embeddings; in each block softmax attention (every head
    its own keys and values, biases, q/k/v packed in ``c_attn``) and a plain MLP (``c_fc``, ``activation_function``,
    ``c_proj``), under LayerNorms with biases; a tied head. Its ``Conv1D`` weights store each linear map
    transposed (the links say so). The softmax scale is head_dim^-1/2 (1 without ``scale_attn_weights``), divided
    by the layer's number with ``scale_attn_by_inverse_layer_idx``: each block's own ``scale``."""

    model_types = ("gpt2", "gpt-sw3")
    causal_lm = {"gpt2": "GPT2LMHeadModel", "gpt-sw3": "GPT2LMHeadModel"}
    export_order = ("gpt2", "gpt-sw3")
    """GPT-SW3 is GPT-2's model and config (gpt2 states the same spec first: written as gpt-sw3 only where
    ``--model-type`` names it)."""
    FIELDS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_positions": "max_position_embeddings", "n_inner": "intermediate_size",
              "activation_function": "hidden_act", "layer_norm_epsilon": "norm_eps"}
    config_fields = {"gpt2": FIELDS, "gpt-sw3": FIELDS}
    """GPT2Config's own names (its ``attribute_map`` read forwards) -> the names the reader asks for."""
    SCALED_BY_LAYER = True
    """The type has ``scale_attn_by_inverse_layer_idx``."""
    PLACEMENT = "pre"
    """Where the blocks' LayerNorms are (``pre``: and a final one; ``post``: none after the last block)."""
    TRANSPOSED = True
    """The projections are ``Conv1D``s, their weights stored transposed."""

    rows = (
        Row(("gpt2", "gpt-sw3"),
            "a learned position table (`position: {kind: learned}`), softmax attention with biases (q/k/v packed, "
            "`Conv1D` weights transposed) and a plain MLP (`activation_function`) under LayerNorms with biases; "
            "`scale_attn_by_inverse_layer_idx` as each block's softmax `scale` (GPT-SW3's model is GPT-2's)",
            "cross-attention (`add_cross_attention`); activations other than the gelu and relu kinds"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("add_cross_attention", bool, False):
            raise config.refuse("add_cross_attention", "cross-attention reads an encoder; attnspec imports decoders")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("n_head", f"{heads} heads do not divide n_embd = {width}")
        head_dim = width // heads
        scale = head_dim ** -0.5 if config.get("scale_attn_weights", bool, True) else 1.0
        by_layer = self.scaled_by_layer(config)
        shared = {"kv_heads": self.kv_heads(config, heads)}
        norm = {"kind": "layernorm", "eps": config.number("norm_eps", 1e-5, positive=True)}
        mlp = {"kind": "mlp", "hidden": config.get("intermediate_size", int, None) or 4 * width, "bias": True,
               "activation": self.activation(config)}
        placement = {} if self.PLACEMENT == "pre" else {"norm_placement": self.PLACEMENT}
        blocks = [{"mixer": {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": True,
                             "out_bias": True, "scale": scale / (index + 1) if by_layer else scale,
                             **(shared if shared["kv_heads"] != heads else {})},
                   "mlp": mlp, "norm": norm, **placement} for index in range(layers)]
        return {**common_fields(config), "position": {"kind": "learned"}, "layers": compress_layers(blocks),
                "final_norm": norm if self.PLACEMENT == "pre" else {"kind": "none"}, "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        unscaled = first.mixer.model_copy(update={"scale": None})
        final = "layernorm" if self.PLACEMENT == "pre" else "none"
        if spec.position.kind != "learned" or spec.final_norm.kind != final or first.mixer.kind != "softmax" \
                or any(b.mixer.model_copy(update={"scale": None}) != unscaled or (b.mlp, b.norm) != (first.mlp, first.norm)
                       or b.norm_placement != self.PLACEMENT for b in blocks):
            raise NotExpressible(f"{model_type} is learned positions and alike blocks")
        mixer = first.mixer
        kv_fields = self.kv_fields(mixer)
        if getattr(mixer, "window", None) is not None \
                or not (mixer.qkv_bias and mixer.out_bias) or mixer.qk_norm != "none" or mixer.d_qk != mixer.d_v \
                or mixer.heads * mixer.d_qk != spec.d_model or getattr(mixer.position, "kind", "none") != "none" \
                or first.mlp.kind != "mlp" or not first.mlp.bias or first.norm.kind != "layernorm":
            raise NotExpressible(f"{model_type}'s blocks are biased attention of heads x head_dim = n_embd and a "
                                 "biased plain MLP under LayerNorms")
        scales = [mixer.d_qk ** -0.5 if b.mixer.scale is None else b.mixer.scale for b in blocks]
        by_layer = len(blocks) > 1 and scales[1] != scales[0]
        if by_layer and not self.SCALED_BY_LAYER \
                or any(scale != scales[0] / (index + 1 if by_layer else 1) for index, scale in enumerate(scales)) \
                or scales[0] not in (mixer.d_qk ** -0.5, 1.0):
            raise NotExpressible(f"{model_type}'s softmax scale is head_dim^-1/2 or 1 (divided by the layer's "
                                 "number with scale_attn_by_inverse_layer_idx)")
        return {"vocab_size": spec.input.vocab_size, "n_positions": spec.max_len, "n_embd": spec.d_model,
                "n_layer": len(blocks), "n_head": mixer.heads, "n_inner": first.mlp.hidden,
                **self.activation_fields(first.mlp.activation), "layer_norm_epsilon": first.norm.eps,
                "scale_attn_weights": scales[0] != 1.0, "tie_word_embeddings": spec.head.tied, **kv_fields,
                **({"scale_attn_by_inverse_layer_idx": by_layer} if self.SCALED_BY_LAYER else {})}

    def activation(self, config: Config) -> str:
        """The MLP's activation (``activation_function``, GPT-2's gelu_new by default)."""
        return config.activation(allowed=("gelu", "gelu_tanh", "relu", "relu2", "silu"), default="gelu_new")

    def activation_fields(self, activation: str) -> dict:
        """The config field stating the MLP's activation (the inverse of :meth:`activation`)."""
        return {"activation_function": ACTIVATION_NAMES[activation]}

    def scaled_by_layer(self, config: Config) -> bool:
        return config.get("scale_attn_by_inverse_layer_idx", bool, False)

    def kv_heads(self, config: Config, heads: int) -> int:
        """The key/value heads: GPT-2's heads each have their own."""
        return heads

    def kv_fields(self, mixer) -> dict:
        """The config fields stating ``mixer``'s key/value heads (NotExpressible where the type cannot)."""
        if mixer.kv_heads not in (None, mixer.heads):
            raise NotExpressible("gpt2's heads each have their own keys and values")
        return {}

    def qkv_link(self, mixer, theirs: str, ours: str, kind: str) -> Link:
        """``c_attn``'s ``kind`` (weight or bias): GPT-2 packs the whole q, then k, then v."""
        return Link(f"{theirs}attn.c_attn.{kind}", tuple(f"{ours}mixer.{n}_proj.{kind}" for n in "qkv"),
                    transpose=self.TRANSPOSED and kind == "weight")

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.wte.weight", "embed.weight"), rename("transformer.wpe.weight", "position.table")]
        if spec.final_norm.kind == "layernorm":
            links += [rename(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            links += [self.qkv_link(block.mixer, theirs, ours, kind) for kind in ("weight", "bias")]
            for their_name, our_name in (("attn.c_proj", "mixer.out_proj"), ("mlp.c_fc", "mlp.up"),
                                         ("mlp.c_proj", "mlp.down")):
                links += [Link(f"{theirs}{their_name}.weight", (f"{ours}{our_name}.weight",), transpose=self.TRANSPOSED),
                          rename(f"{theirs}{their_name}.bias", f"{ours}{our_name}.bias")]
            links += [rename(f"{theirs}ln_{n}.{p}", f"{ours}norm{n}.{p}") for n in (1, 2) for p in ("weight", "bias")]
        return links


ARCHITECTURES = (Gpt2(),)
