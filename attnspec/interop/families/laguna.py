"""transformers' ``laguna`` model type as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from typing import Any

from attnspec.errors import shorten
from attnspec.interop.architecture import (Link, Row, attention_links, expanded_blocks, expert_counts, glu_links,
                                           glu_node, moe_links, rename, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Laguna(LlamaFamily):
    """Laguna: QK-normed GQA attention with its own head count per layer (``num_attention_heads_per_layer``),
    RoPE on every layer with each layer type's parameters (partial on the global layers by default), a window on
    the ``sliding_attention`` layers, and a softplus output gate per head (``gating``: true or ``per-head``) or per
    channel; each layer's MLP a dense GLU or experts (``mlp_layer_types``: sigmoid scores of soft-capped logits,
    a correction bias that chooses, renormalised, times ``moe_routed_scaling_factor``, beside one ungated shared
    GLU)."""

    ALIASES: dict[str, str] = {}
    model_types = ("laguna",)
    causal_lm = {"laguna": "LagunaForCausalLM"}
    export_order = None
    stored_names = {"laguna": ((r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.experts.e_score_correction_bias"),)}
    """Laguna keeps its router's correction bias beside the experts."""
    HEAD_DIM = 128

    rows = (
        Row(("laguna",),
            "QK-normed attention with heads per layer, RoPE per layer type, windows on `sliding_attention` layers, a "
            "softplus output gate (`output_gate: softplus`, `gate_per_head`); a GLU or experts per layer (sigmoid, "
            "correction bias, `router_softcap` = moe_router_logit_softcapping, renormalised, scaled, one shared "
            "expert)",
            "`moe_apply_router_weight_on_input` (transformers' Laguna refuses it too); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("moe_apply_router_weight_on_input", bool, False):
            raise config.refuse("moe_apply_router_weight_on_input", "experts weighting their inputs by the router "
                                "are not an attnspec MoE (transformers' Laguna refuses them too); false imports")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        _, kv_heads, head_dim = config.attention_heads(head_dim=self.HEAD_DIM)
        heads = config.get("num_attention_heads_per_layer", list, None) or \
            [config.count("num_attention_heads")] * layers
        if len(heads) != layers or not all(isinstance(h, int) and not isinstance(h, bool) and 0 < h <= limits.MAX_HEADS
                                           and h % kv_heads == 0 for h in heads):
            raise config.refuse("num_attention_heads_per_layer", f"must give each of the {layers} layers a head count "
                                f"that {kv_heads} key/value heads divide")
        types = config.attention_layer_types(layers, ["full_attention"] * layers)
        kinds = config.get("mlp_layer_types", list, None) or ["dense"] + ["sparse"] * (layers - 1)
        if len(kinds) != layers or any(kind not in ("dense", "sparse") for kind in kinds):
            raise config.refuse("mlp_layer_types", f"must name `dense` or `sparse` for each of the {layers} layers")
        gating = config.get("gating", (bool, str), True)
        if gating not in (True, False, "per-head", "per-element"):
            raise config.refuse("gating", f"true, false, `per-head` or `per-element`; got {shorten(gating)}")
        window = config.count("sliding_window", 512)
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        moe = self._experts(config) if "sparse" in kinds else None
        blocks = []
        for count, layer_type, kind in zip(heads, types, kinds):
            mixer: dict[str, Any] = {"kind": "softmax", "heads": count, "d_qk": head_dim, "d_v": head_dim,
                                     "kv_heads": kv_heads, "qk_norm": "rmsnorm", "norm_eps": eps, "qkv_bias": bias,
                                     "out_bias": bias, "output_gate": "softplus",
                                     "gate_per_head": gating in (True, "per-head"),
                                     "position": config.rope(head_dim, layer_type=layer_type)}
            if layer_type == "sliding_attention":
                mixer["window"] = window
            blocks.append({"mixer": mixer, "mlp": moe if kind == "sparse" else glu_node(config),
                           "norm": {"kind": "rmsnorm", "eps": eps}})
        return self.assembled(config, blocks, eps)

    @staticmethod
    def _experts(config: Config) -> dict:
        experts, chosen = expert_counts(config, "num_experts", 256, "num_experts_per_tok", 8)
        cap = config.number("moe_router_logit_softcapping", 0.0)
        if cap < 0:
            raise config.refuse("moe_router_logit_softcapping", "must be 0 (no cap) or positive")
        return {"kind": "moe", "experts": experts, "top_k": chosen,
                "hidden": config.count("moe_intermediate_size", 512), "scoring": "sigmoid", "score_bias": True, "normalize": True,
                "routed_scale": config.number("moe_routed_scaling_factor", 1.0, positive=True),
                **({"router_softcap": cap} if cap else {}), "activation": config.activation(allowed=("silu",)),
                "shared": 1, "shared_hidden": config.count("shared_expert_intermediate_size", 512)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        first = mixers[0]
        if any(m.kind != "softmax" or getattr(m.position, "kind", None) != "rope" for m in mixers):
            raise NotExpressible("laguna is softmax attention with RoPE in every block")
        windows = [m.window for m in mixers]
        types = ["full_attention" if w is None else "sliding_attention" for w in windows]

        def rope_of(mixer) -> dict:
            return {**rope_config(mixer.position), "partial_rotary_factor": mixer.position.rotary_fraction}

        rope = {}
        for layer_type, mixer in zip(types, mixers):
            rope.setdefault(layer_type, rope_of(mixer))
        alike = lambda m: m.model_copy(update={"heads": first.heads, "window": None, "position": None})  # noqa: E731
        if any(alike(m) != alike(first) or rope_of(m) != rope[t] for t, m in zip(types, mixers)) \
                or first.qk_norm != "rmsnorm" or first.qk_norm_after_rope or first.output_gate != "softplus" \
                or first.gate_rank is not None or len({w for w in windows if w}) > 1 \
                or first.qkv_bias != first.out_bias:
            raise NotExpressible("laguna is the same QK-normed attention with a softplus output gate in every block "
                                 "(heads may differ), one window, and one RoPE per layer type")
        mlps = [b.mlp for b in blocks]
        dense = next((m for m in mlps if m.kind != "moe"), None)
        moe = next((m for m in mlps if m.kind == "moe"), None)
        if any(m != (moe if m.kind == "moe" else dense) for m in mlps) or (dense is not None and (
                dense.kind != "glu" or dense.bias)) or (moe is not None and (
                moe.scoring != "sigmoid" or not moe.score_bias or moe.score_bias_on_logits or not moe.normalize
                or moe.groups != 1 or moe.shared != 1 or moe.shared_gate or moe.router_bias or moe.expert_bias
                or moe.glu_limit is not None or not moe.gated)):
            raise NotExpressible("laguna's layers hold a bias-free GLU or its sigmoid-routed experts")
        config = {**self.shared_fields(spec, first), "num_hidden_layers": len(blocks),
                  "attention_bias": first.qkv_bias, "num_attention_heads_per_layer": [m.heads for m in mixers],
                  "layer_types": types, "sliding_window": next((w for w in windows if w), 512),
                  "rope_parameters": rope, "gating": "per-head" if first.gate_per_head else "per-element",
                  "mlp_layer_types": ["sparse" if m.kind == "moe" else "dense" for m in mlps]}
        if dense is not None:
            config["intermediate_size"] = dense.hidden
        if moe is not None:
            config.update(num_experts=moe.experts, num_experts_per_tok=moe.top_k, moe_intermediate_size=moe.hidden,
                          shared_expert_intermediate_size=moe.shared_hidden or moe.hidden,
                          moe_routed_scaling_factor=moe.routed_scale,
                          moe_router_logit_softcapping=moe.router_softcap or 0.0,
                          hidden_act=ACTIVATION_NAMES[moe.activation])
        return config

    def projection_links(self, mixer, theirs: str, ours: str) -> list[Link]:
        return attention_links(theirs, ours, mixer.qkv_bias, mixer.out_bias) + [
            rename(f"{theirs}g_proj.weight", f"{ours}gate.weight")]

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind == "moe":
            return moe_links(mlp, theirs, ours, shared="shared_expert")
        return glu_links(theirs, ours, False)


ARCHITECTURES = (Laguna(),)
