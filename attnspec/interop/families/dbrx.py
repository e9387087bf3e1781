"""transformers' ``dbrx`` model type (Databricks' DBRX) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from typing import Any

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, expert_counts, head_node, rename, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits

LAYER_NORM_EPS = 1e-5
"""DBRX's LayerNorms (``nn.LayerNorm(d_model, bias=False)``) take torch's default eps; no config field sets it."""


class Dbrx(Architecture):
    """DBRX: GQA softmax attention with RoPE whose fused q/k/v projection (``Wqkv``) is clamped to ±``clip_qkv``
    (`qkv_clip`), and experts in every layer (a softmax router, the top ``moe_top_k`` renormalised where
    ``moe_normalize_expert_weights`` is 1, GLU experts stored as three (experts x ffn, d) tensors: w1 and v1
    each expert's rows, w2 each expert's down projection transposed), under LayerNorms without biases. Its
    attention and expert settings sit in the nested ``attn_config`` and ``ffn_config``."""

    model_types = ("dbrx",)
    causal_lm = {"dbrx": "DbrxForCausalLM"}
    config_fields = {"dbrx": {"n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
                              "d_model": "hidden_size", "max_seq_len": "max_position_embeddings"}}
    """DBRX's own names for the fields every family reads."""

    rows = (
        Row(("dbrx",),
            "softmax attention (GQA, RoPE, q/k/v clamped to ±`attn_config.clip_qkv`: `qkv_clip`) and experts in "
            "every layer (softmax router, top `moe_top_k` renormalised, GLU experts) under LayerNorms without "
            "biases",
            "`moe_normalize_expert_weights` other than 1 or none; `attn_config.rope_theta` other than the RoPE "
            "base transformers applies (`rope_parameters`); no `clip_qkv` (transformers' DBRX fails without it)"),
    )

    def read(self, data: dict, model_type: str, source: str) -> Config:
        """The nested ``attn_config`` and ``ffn_config`` read as dotted fields (``attn_config.clip_qkv``), so a
        refusal names where the field is."""
        flat = dict(data)
        for section in ("attn_config", "ffn_config"):
            nested = data.get(section)
            if nested is not None and not isinstance(nested, dict):
                raise Config(data, source).refuse(section, "must be a mapping")
            flat.update({f"{section}.{key}": value for key, value in (nested or {}).items()})
        return super().read(flat, model_type, source)

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("n_heads", f"{heads} heads do not divide d_model = {width}")
        kv_heads = config.count("attn_config.kv_n_heads", 1)
        if heads % kv_heads:
            raise config.refuse("attn_config.kv_n_heads", f"{heads} heads cannot share {kv_heads} key/value heads")
        head_dim = width // heads
        position = config.rope(head_dim)
        stated = config.data.get("attn_config.rope_theta")
        if stated is not None and stated != position["base"]:
            raise config.refuse("attn_config.rope_theta", f"transformers' DBRX rotates with rope_parameters' base "
                                f"{position['base']}, not this {shorten(stated)}: make them equal to import")
        mixer: dict[str, Any] = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                                 "position": position, **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        if config.data.get("attn_config.clip_qkv") is None:  # clamp(min=None, max=None) raises in its attention
            raise config.refuse("attn_config.clip_qkv", "transformers' DBRX attention runs only with a clip (every "
                                "release sets 8), so without one there is nothing to hold an import to; set it")
        mixer["qkv_clip"] = config.number("attn_config.clip_qkv", positive=True)
        experts, chosen = expert_counts(config, "ffn_config.moe_num_experts", 4, "ffn_config.moe_top_k", 1)
        normalize = config.data.get("ffn_config.moe_normalize_expert_weights", 1.0)
        if normalize not in (None, 1, 1.0):
            raise config.refuse("ffn_config.moe_normalize_expert_weights", "attnspec renormalises the chosen "
                                f"weights to sum 1 (p = 1) or not at all (null); got p = {shorten(normalize)}")
        act = config.data.get("ffn_config.ffn_act_fn") or {"name": "silu"}
        if not isinstance(act, dict) or set(act) != {"name"}:
            raise config.refuse("ffn_config.ffn_act_fn", "must be {name: ...} with no other settings")
        activation = Config({"name": act["name"]}, config.source).activation("name", allowed=("silu", "gelu",
                                                                                              "gelu_tanh", "relu"))
        moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": config.count("ffn_config.ffn_hidden_size"),
               "scoring": "softmax", "normalize": normalize is not None, "activation": activation}
        norm = {"kind": "layernorm", "eps": LAYER_NORM_EPS, "bias": False}
        block = {"mixer": mixer, "mlp": moe, "norm": norm}
        return {**common_fields(config), "layers": compress_layers([block] * layers), "final_norm": norm,
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer, moe = first.mixer, first.mlp
        if any(b != first for b in blocks) or first.norm.kind != "layernorm" or first.norm.bias \
                or first.norm.eps != LAYER_NORM_EPS or spec.final_norm != first.norm or mixer.kind != "softmax" \
                or getattr(mixer.position, "kind", None) != "rope" or mixer.qkv_bias or mixer.out_bias \
                or mixer.qk_norm != "none" or mixer.window is not None or mixer.sinks or mixer.d_qk != mixer.d_v \
                or mixer.heads * mixer.d_qk != spec.d_model or mixer.scale not in (None, mixer.d_qk ** -0.5) \
                or first.parallel != "none" or mixer.position.rotary_fraction != 1 or mixer.position.interleaved \
                or mixer.qkv_clip is None:
            raise NotExpressible("dbrx is alike blocks of bias-free RoPE attention with clamped q/k/v (transformers' "
                                 "runs only with a clip) and experts under LayerNorms without biases")
        if moe.kind != "moe" or moe.scoring != "softmax" or moe.shared or moe.score_bias or moe.groups != 1 \
                or moe.routed_scale != 1 or not moe.gated or moe.router_bias or moe.expert_bias \
                or moe.glu_limit is not None:
            raise NotExpressible("dbrx's experts are softmax-routed GLUs without shared experts, biases or clamps")
        return {"d_model": spec.d_model, "n_heads": mixer.heads, "n_layers": len(blocks), "max_seq_len": spec.max_len,
                "rope_parameters": rope_config(mixer.position),
                "attn_config": {"kv_n_heads": mixer.kv_heads or mixer.heads, "clip_qkv": mixer.qkv_clip,
                                "rope_theta": mixer.position.base},
                "ffn_config": {"ffn_hidden_size": moe.hidden, "moe_num_experts": moe.experts, "moe_top_k": moe.top_k,
                               "moe_normalize_expert_weights": 1.0 if moe.normalize else None,
                               "ffn_act_fn": {"name": ACTIVATION_NAMES[moe.activation]}}}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.wte.weight", "embed.weight"), rename("transformer.norm_f.weight",
                                                                           "final_norm.weight")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"transformer.blocks.{index}.", block_prefix(index)
            layer = f"{theirs}norm_attn_norm."
            links += [Link(f"{layer}attn.Wqkv.weight", tuple(f"{ours}mixer.{n}_proj.weight" for n in "qkv")),
                      rename(f"{layer}attn.out_proj.weight", f"{ours}mixer.out_proj.weight"),
                      rename(f"{layer}norm_1.weight", f"{ours}norm1.weight"),
                      rename(f"{layer}norm_2.weight", f"{ours}norm2.weight"),
                      rename(f"{theirs}ffn.router.layer.weight", f"{ours}mlp.router.weight")]
            routed = [f"{ours}mlp.routed.{e}." for e in range(block.mlp.experts)]
            experts = f"{theirs}ffn.experts.mlp."
            links += [Link(f"{experts}w1", tuple(f"{r}up.weight" for r in routed)),
                      Link(f"{experts}v1", tuple(f"{r}gate.weight" for r in routed)),
                      Link(f"{experts}w2", tuple(f"{r}down.weight" for r in routed), stack=block.mlp.experts,
                           transpose=True, flat=True)]
        return links


ARCHITECTURES = (Dbrx(),)
