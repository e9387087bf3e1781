"""transformers' ``llama4_text`` and ``llama4`` model types (Meta's Llama 4) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from typing import Any

from attnspec.errors import shorten
from attnspec.interop.architecture import (Link, Row, Wrapper, expanded_blocks, expert_counts, glu_links,
                                           rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Llama4(LlamaFamily):
    """Llama 4's text model: RoPE layers (``no_rope_layers`` 1: pairs interleaved, an unweighted RMSNorm of q and k
    after it with ``use_qk_norm``, attention within chunks of ``attention_chunk_size``) and layers without
    positions (full attention; queries scaled by 1 + attn_scale ln(1 + floor((t + 1) / floor_scale)) with
    ``attn_temperature_tuning``); the ``moe_layers`` hold experts (the top ``num_experts_per_tok`` logits' sigmoid
    multiplying each chosen expert's input, beside a shared expert), the others a dense GLU
    (``intermediate_size_mlp``). The multimodal release's text model is the same."""

    ALIASES: dict[str, str] = {}
    model_types = ("llama4_text",)
    causal_lm = {"llama4_text": "Llama4ForCausalLM"}
    export_order = None
    wrappers = {"llama4": Wrapper("llama4_text",
                                  {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."},
                                  ("vision_model.", "multi_modal_projector."))}
    HEAD_DIM = 128
    MLP_NAME = "feed_forward"

    rows = (
        Row(("llama4_text",),
            "RoPE layers (interleaved pairs, an unweighted QK-norm after RoPE, `chunk` = attention_chunk_size) and "
            "layers without positions (queries scaled by `query_scale_beta` = attn_scale per floor_scale positions "
            "from t + 1); experts on `moe_layers` (sigmoid of the top logits weighting each expert's input: "
            "`weight_inputs`; a shared expert), a dense GLU elsewhere",
            "`router_jitter_noise` (training noise); as llama"),
        Row(("llama4",),
            "the multimodal release's text model: `text_config` and the `language_model.` tensors, as `llama4_text`; "
            "the vision model and projector are not read",
            "images: attnspec models are text models"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads(head_dim=self.HEAD_DIM)
        eps = config.number("rms_norm_eps", 1e-5)
        rotated = self._flags(config, "no_rope_layers", layers, [int((i + 1) % config.count(
            "no_rope_layer_interval", 4) != 0) for i in range(layers)])
        step = config.count("interleave_moe_layer_step", 1)
        moe_layers = set(config.get("moe_layers", list, None) or range(step - 1, layers, step))
        if not moe_layers <= set(range(layers)):
            raise config.refuse("moe_layers", f"must name layers among the {layers}")
        chunk = config.data.get("attention_chunk_size")
        chunk = None if chunk is None else config.count("attention_chunk_size")
        bias = config.get("attention_bias", bool, False)
        position = {**config.rope(head_dim), "interleaved": True}
        experts, chosen = expert_counts(config, "num_local_experts", 16, "num_experts_per_tok", 1)
        activation = config.activation(allowed=("silu",))
        hidden = config.count("intermediate_size", 8192)
        moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": hidden, "scoring": "sigmoid",
               "normalize": False, "weight_inputs": True, "activation": activation, "shared": 1,
               "shared_hidden": hidden}
        dense = {"kind": "glu", "hidden": config.count("intermediate_size_mlp", 16384), "bias": False,
                 "activation": activation}
        tuning = config.get("attn_temperature_tuning", bool, True)
        blocks = []
        for index in range(layers):
            mixer: dict[str, Any] = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                                     "qkv_bias": bias, "out_bias": bias, "norm_eps": eps,
                                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
            if rotated[index]:
                mixer["position"] = position
                if config.get("use_qk_norm", bool, True):
                    mixer.update(qk_norm="rmsnorm_unweighted", qk_norm_after_rope=True)
                if chunk is not None:
                    mixer["chunk"] = chunk
            else:
                mixer["position"] = {"kind": "none"}
                if tuning:
                    mixer.update(query_scale_beta=config.number("attn_scale", 0.1), query_scale_offset=1,
                                 query_scale_period=config.count("floor_scale", 8192))
            blocks.append({"mixer": mixer, "mlp": moe if index in moe_layers else dense, "norm": rmsnorm_node(eps)})
        return self.assembled(config, blocks, eps)

    @staticmethod
    def _flags(config: Config, field: str, layers: int, default: list[int]) -> list[int]:
        flags = config.get(field, list, None) or default
        if len(flags) != layers or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
            raise config.refuse(field, f"must give 0 or 1 for each of the {layers} layers; got {shorten(flags)}")
        return flags

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        rotated = [getattr(m.position, "kind", None) == "rope" for m in mixers]
        rope_layers = [m for m, r in zip(mixers, rotated) if r]
        plain = [m for m, r in zip(mixers, rotated) if not r]
        first = mixers[0]
        alike = lambda m: m.model_copy(update={  # noqa: E731
            "position": None, "qk_norm": "none", "qk_norm_after_rope": False, "chunk": None, "query_scale_beta": 0.0,
            "query_scale_period": None, "query_scale_offset": 0})
        if not rope_layers or any(m.kind != "softmax" or alike(m) != alike(first) or m.window is not None
                                  for m in mixers) \
                or len({(m.position.model_dump_json(), m.qk_norm, m.qk_norm_after_rope, m.chunk)
                        for m in rope_layers}) > 1 \
                or not rope_layers[0].position.interleaved \
                or rope_layers[0].qk_norm not in ("none", "rmsnorm_unweighted") \
                or (rope_layers[0].qk_norm != "none") != rope_layers[0].qk_norm_after_rope \
                or any(m.position.kind != "none" or m.qk_norm != "none" or m.chunk is not None for m in plain) \
                or len({(m.query_scale_beta, m.query_scale_period, m.query_scale_offset) for m in plain}) > 1 \
                or any(m.query_scale_beta for m in rope_layers) \
                or any(m.query_scale_beta and m.query_scale_offset != 1 for m in plain):
            raise NotExpressible("llama4_text is one attention with interleaved RoPE (its QK-norm after it, chunks) "
                                 "or no positions (its query scale from t + 1) in each layer")
        mlps = [b.mlp for b in blocks]
        moe = next((m for m in mlps if m.kind == "moe"), None)
        dense = next((m for m in mlps if m.kind != "moe"), None)
        if moe is None or any(m != (moe if m.kind == "moe" else dense) for m in mlps) \
                or moe.scoring != "sigmoid" or moe.normalize or not moe.weight_inputs or moe.shared != 1 \
                or (moe.shared_hidden or moe.hidden) != moe.hidden or moe.shared_gate or moe.score_bias \
                or moe.router_bias or moe.expert_bias or moe.glu_limit is not None or moe.groups != 1 \
                or moe.routed_scale != 1 or not moe.gated or moe.router_softcap is not None \
                or (dense is not None and (dense.kind != "glu" or dense.bias or dense.activation != moe.activation)):
            raise NotExpressible("llama4_text's layers hold its experts (sigmoid weights on their inputs, a shared "
                                 "expert as wide) or a bias-free GLU")
        rope = rope_layers[0]
        tuning = next((m for m in plain if m.query_scale_beta), None)
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": first.heads,
                "num_key_value_heads": first.kv_heads or first.heads, "head_dim": first.d_qk,
                "hidden_act": ACTIVATION_NAMES[moe.activation], "rms_norm_eps": first.norm_eps,
                "attention_bias": first.qkv_bias, "rope_parameters": rope_config(rope.position),
                "no_rope_layers": [int(r) for r in rotated], "use_qk_norm": rope.qk_norm != "none",
                "attention_chunk_size": rope.chunk,
                "layer_types": ["chunked_attention" if r and rope.chunk is not None else "full_attention"
                                for r in rotated],
                "attn_temperature_tuning": tuning is not None,
                **({"attn_scale": tuning.query_scale_beta, "floor_scale": tuning.query_scale_period} if tuning else {}),
                "moe_layers": [i for i, m in enumerate(mlps) if m.kind == "moe"], "num_local_experts": moe.experts,
                "num_experts_per_tok": moe.top_k, "intermediate_size": moe.hidden,
                "intermediate_size_mlp": dense.hidden if dense is not None else moe.hidden}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind != "moe":
            return glu_links(theirs, ours, False)
        routed = [f"{ours}routed.{e}." for e in range(mlp.experts)]
        return [rename(f"{theirs}router.weight", f"{ours}router.weight"),
                Link(f"{theirs}experts.gate_up_proj", tuple(f"{r}{n}.weight" for r in routed for n in ("up", "gate")),
                     stack=mlp.experts, transpose=True),
                Link(f"{theirs}experts.down_proj", tuple(f"{r}down.weight" for r in routed), stack=mlp.experts,
                     transpose=True),
                *glu_links(f"{theirs}shared_expert.", f"{ours}shared.", False)]


ARCHITECTURES = (Llama4(),)
