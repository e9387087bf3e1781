"""transformers' ``gpt_neo`` model type (EleutherAI's GPT-Neo) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits

KINDS = ("global", "local")


class GptNeo(Architecture):
    """GPT-Neo: GPT-2's learned position table, LayerNorms and biased MLP (``c_fc``, ``c_proj`` as plain
    linear maps), with softmax attention of unscaled scores (scale 1), bias-free q/k/v and a biased output
    projection, every layer global or local (a window of ``window_size`` positions, itself included) by
    ``attention_types``; a tied head. (Its scores are computed in float32 whatever the model's dtype, as
    attnspec's softmax attention does for half precision.)"""

    model_types = ("gpt_neo",)
    causal_lm = {"gpt_neo": "GPTNeoForCausalLM"}
    config_fields = {"gpt_neo": {"num_heads": "num_attention_heads", "num_layers": "num_hidden_layers",
                                 "activation_function": "hidden_act", "layer_norm_epsilon": "norm_eps"}}
    rows = (
        Row(("gpt_neo",),
            "a learned position table, softmax attention of unscaled scores (`scale: 1`) with bias-free q/k/v, "
            "global or windowed by `attention_types`, and a biased plain MLP under LayerNorms; a tied head",
            "an untied head; activations other than the gelu and relu kinds"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("num_heads", f"{heads} heads do not divide hidden_size = {width}")
        kinds = self.layer_kinds(config, layers)
        window = config.count("window_size", 256)
        norm = {"kind": "layernorm", "eps": config.number("norm_eps", 1e-5, positive=True)}
        mlp = {"kind": "mlp", "hidden": config.get("intermediate_size", int, None) or 4 * width, "bias": True,
               "activation": config.activation(allowed=("gelu", "gelu_tanh", "relu", "relu2", "silu"),
                                               default="gelu_new")}
        blocks = [{"mixer": {"kind": "softmax", "heads": heads, "d_qk": width // heads, "d_v": width // heads,
                             "qkv_bias": False, "out_bias": True, "scale": 1.0,
                             **({"window": window} if kind == "local" else {})},
                   "mlp": mlp, "norm": norm} for kind in kinds]
        if not config.get("tie_word_embeddings", bool, True):
            raise config.refuse("tie_word_embeddings", "GPT-Neo's head is its embedding; an untied one has no "
                                "tensor in its checkpoint")
        return {**common_fields(config), "position": {"kind": "learned"}, "layers": compress_layers(blocks),
                "final_norm": norm, "head": head_node(config, True)}

    @staticmethod
    def layer_kinds(config: Config, layers: int) -> list[str]:
        """Each layer's ``global`` or ``local``: ``attention_layers``, else ``attention_types`` expanded
        (``[[["global", "local"], 12]]``: the pair twelve times), refused unless one per layer."""
        kinds = config.data.get("attention_layers")
        if kinds is None:
            types = config.data.get("attention_types", [[["global", "local"], layers // 2]])
            try:
                kinds = [kind for pattern, repeat in types for _ in range(int(repeat)) for kind in pattern]
            except (TypeError, ValueError):
                raise config.refuse("attention_types", "a list of [[kinds...], repeat] pairs") from None
        if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in KINDS for kind in kinds):
            raise config.refuse("attention_types", f"one of {', '.join(KINDS)} for each of the {layers} layers")
        return kinds

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        windows = [getattr(b.mixer, "window", None) for b in blocks]
        window = next((w for w in windows if w is not None), 256)
        alike = [b.mixer.model_copy(update={"window": None}) for b in blocks]
        mixer = first.mixer
        if spec.position.kind != "learned" or spec.final_norm.kind != "layernorm" or not spec.head.tied \
                or mixer.kind != "softmax" or any(a != alike[0] for a in alike) \
                or any(w not in (None, window) for w in windows) \
                or any((b.mlp, b.norm, b.norm_placement) != (first.mlp, first.norm, "pre") for b in blocks) \
                or mixer.qkv_bias or not mixer.out_bias or mixer.scale != 1.0 or mixer.kv_heads not in (None, mixer.heads) \
                or mixer.qk_norm != "none" or mixer.d_qk != mixer.d_v or mixer.heads * mixer.d_qk != spec.d_model \
                or getattr(mixer.position, "kind", "none") != "none" or first.mlp.kind != "mlp" or not first.mlp.bias \
                or first.norm.kind != "layernorm":
            raise NotExpressible("gpt_neo is learned positions, a tied head and alike blocks of unscaled bias-free "
                                 "q/k/v attention (global or one window) and a biased MLP under LayerNorms")
        return {"vocab_size": spec.input.vocab_size, "max_position_embeddings": spec.max_len,
                "hidden_size": spec.d_model, "num_layers": len(blocks), "num_heads": mixer.heads,
                "intermediate_size": first.mlp.hidden, "window_size": window,
                "attention_types": [[["global" if w is None else "local" for w in windows], 1]],
                "activation_function": ACTIVATION_NAMES[first.mlp.activation],
                "layer_norm_epsilon": first.norm.eps, "tie_word_embeddings": True}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.wte.weight", "embed.weight"), rename("transformer.wpe.weight", "position.table")]
        links += [rename(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            links += [rename(f"{theirs}attn.attention.{n}_proj.weight", f"{ours}mixer.{n}_proj.weight") for n in "qkv"]
            links += [rename(f"{theirs}attn.attention.out_proj.{p}", f"{ours}mixer.out_proj.{p}")
                      for p in ("weight", "bias")]
            links += [rename(f"{theirs}mlp.{their}.{p}", f"{ours}mlp.{our}.{p}")
                      for their, our in (("c_fc", "up"), ("c_proj", "down")) for p in ("weight", "bias")]
            links += [rename(f"{theirs}ln_{n}.{p}", f"{ours}norm{n}.{p}") for n in (1, 2) for p in ("weight", "bias")]
        return links


ARCHITECTURES = (GptNeo(),)
