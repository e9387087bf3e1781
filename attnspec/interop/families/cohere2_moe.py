"""transformers' ``cohere2_moe`` model type (Cohere's mixture-of-experts Command models) as attnspec specs, and
back (what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, common_fields, compress_layers, expanded_blocks,
                                           expert_counts, glu_links, head_node, moe_links, rmsnorm_node, rope_config,
                                           shared_count)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.cohere import Cohere
from attnspec.spec import limits

STRATEGIES = ("sum", "average")
"""How the routed experts' output and the shared experts' combine (``shared_expert_combination_strategy``)."""


class Cohere2Moe(Cohere):
    """Cohere 2 MoE: Command R7B's parallel blocks (attention and MLP side by side on one norm: a bias-free
    LayerNorm, or an RMSNorm where ``rms_norm_eps`` is set) with each layer's MLP a GLU or experts by
    ``mlp_layer_types``; windowed layers rotate interleaved pairs and global ones have no positions, but for
    dense global layers where ``prefix_dense_sliding_window_pattern`` is 1, which rotate too. Experts are
    chosen by the top ``num_experts_per_tok`` router logits and weighted by their softmax (the renormalised
    softmax of all) or their sigmoids (renormalised with ``norm_topk_prob``), beside ``num_shared_experts``
    as one MLP that many times as wide, summed or averaged: an average's halves are folded into the experts'
    and the shared MLP's down projections."""

    model_types = ("cohere2_moe",)
    causal_lm = {"cohere2_moe": "Cohere2MoeForCausalLM"}

    rows = (
        Row(("cohere2_moe",),
            "cohere2's parallel blocks (a LayerNorm or an RMSNorm) with a GLU or experts per layer by "
            "`mlp_layer_types`: softmax or sigmoid scores of the top-k logits, shared experts summed or averaged "
            "(the halves folded into the down projections); RoPE on windowed layers and on dense global ones "
            "where `prefix_dense_sliding_window_pattern` is 1",
            "`shared_expert_combination_strategy` other than sum and average"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads(head_dim=128)  # Cohere2MoeConfig's default
        bias = config.get("attention_bias", bool, False)
        if config.data.get("rms_norm_eps") is not None:
            norm = rmsnorm_node(config.number("rms_norm_eps", 1e-6, positive=True))
        else:
            norm = {"kind": "layernorm", "eps": config.number("layer_norm_eps", 1e-5, positive=True), "bias": False}
        pattern = config.count("sliding_window_pattern", 4)
        types = config.attention_layer_types(layers, ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                                      for i in range(layers)])
        kinds = config.get("mlp_layer_types", list, None) or ["sparse"] * layers
        if len(kinds) != layers or any(kind not in ("dense", "sparse") for kind in kinds):
            raise config.refuse("mlp_layer_types", f"must name `dense` or `sparse` for each of the {layers} layers")
        dense_rotate = config.get("prefix_dense_sliding_window_pattern", int, 1) == 1
        window = config.count("sliding_window", 4096)
        rope = {**config.rope(head_dim), "interleaved": True}
        mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                 "out_bias": bias, **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        dense_hidden = config.count("prefix_dense_intermediate_size", None) or config.count("intermediate_size")
        dense_mlp = {"kind": "glu", "activation": config.activation(), "bias": False, "hidden": dense_hidden}
        experts = self.experts(config) if "sparse" in kinds else None
        blocks = []
        for layer_type, kind in zip(types, kinds):
            if layer_type == "sliding_attention":
                layer_mixer = {**mixer, "position": rope, "window": window}
            else:
                layer_mixer = {**mixer, "position": rope if kind == "dense" and dense_rotate else {"kind": "none"}}
            blocks.append({"mixer": layer_mixer, "mlp": dense_mlp if kind == "dense" else experts, "norm": norm,
                           "parallel": "shared_norm"})
        head = {**head_node(config, True), "scale": config.number("logit_scale", 0.0625, positive=True)}
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": norm, "head": head}

    @staticmethod
    def experts(config: Config) -> dict:
        """``num_experts`` GLUs of ``intermediate_size`` behind the router :class:`Cohere2Moe` describes."""
        experts, chosen = expert_counts(config, "num_experts", 8, "num_experts_per_tok", 2)
        selection = config.get("expert_selection_fn", str, "softmax")
        if selection not in ("softmax", "sigmoid"):
            raise config.refuse("expert_selection_fn", "softmax or sigmoid (transformers takes no other)")
        strategy = config.get("shared_expert_combination_strategy", str, "average")
        if strategy not in STRATEGIES:
            raise config.refuse("shared_expert_combination_strategy", "sum or average (transformers takes no other)")
        shared = shared_count(config, "num_shared_experts", 0)
        hidden = config.count("intermediate_size")
        return {"kind": "moe", "experts": experts, "hidden": hidden, "top_k": chosen,
                "activation": config.activation(), "scoring": selection,
                "normalize": selection == "softmax" or config.get("norm_topk_prob", bool, True), "shared": shared,
                **({"shared_hidden": shared * hidden} if shared else {})}

    def weight_scales(self, spec, config: Config) -> dict[str, float]:
        """An average of the routed and the shared experts' outputs: each down projection times a half."""
        if config.get("shared_expert_combination_strategy", str, "average") != "average":
            return {}
        scales = {}
        for index, block in enumerate(expanded_blocks(spec)):
            if block.mlp.kind == "moe" and block.mlp.shared:
                mlp = f"{block_prefix(index)}mlp."
                scales.update({f"{mlp}routed.{e}.down.weight": 0.5 for e in range(block.mlp.experts)})
                scales[f"{mlp}shared.down.weight"] = 0.5
        return scales

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [block.mixer for block in blocks]
        first = blocks[0]
        if any(b.mixer.kind != "softmax" or b.parallel != "shared_norm" or b.norm != first.norm for b in blocks) \
                or spec.final_norm != first.norm or (first.norm.kind == "layernorm" and first.norm.bias):
            raise NotExpressible("cohere2_moe is parallel blocks on one norm (an RMSNorm or a bias-free LayerNorm)")
        if any(m.qk_norm != "none" or m.output_gate != "none" or m.qkv_bias != m.out_bias for m in mixers):
            raise NotExpressible("cohere2_moe's attention has no QK-norm or gate, and biases on all four projections "
                                 "or none")
        windows = [m.window for m in mixers]
        rotary = [m.position.kind == "rope" for m in mixers]
        kinds = ["sparse" if b.mlp.kind == "moe" else "dense" for b in blocks]
        if any(b.mlp.kind not in ("moe", "glu") for b in blocks) or len({w for w in windows if w}) > 1:
            raise NotExpressible("cohere2_moe has GLUs or experts, and one window")
        global_rotary = {rotate for rotate, w, kind in zip(rotary, windows, kinds) if w is None and kind == "dense"}
        if any(not rotate for rotate, w in zip(rotary, windows) if w is not None) or len(global_rotary) > 1 \
                or any(rotate for rotate, w, kind in zip(rotary, windows, kinds) if w is None and kind == "sparse") \
                or any(m.position.kind == "rope" and not m.position.interleaved for m in mixers):
            raise NotExpressible("cohere2_moe rotates interleaved pairs in its windowed layers, in all its dense "
                                 "global ones or none, and in no other")
        ropes = {repr(sorted(rope_config(m.position).items())) for m in mixers if m.position.kind == "rope"}
        if len(ropes) > 1:
            raise NotExpressible("cohere2_moe has one RoPE")
        mixer = first.mixer
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                  "num_key_value_heads": mixer.kv_heads or mixer.heads, "head_dim": mixer.d_qk,
                  "attention_bias": mixer.qkv_bias, "logit_scale": spec.head.scale,
                  "tie_word_embeddings": spec.head.tied, "mlp_layer_types": kinds,
                  "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
                  "sliding_window": next((w for w in windows if w), 4096),
                  "prefix_dense_sliding_window_pattern": 1 if global_rotary == {True} else 4}
        if first.norm.kind == "rmsnorm":
            config.update({"rms_norm_eps": first.norm.eps, "layer_norm_eps": first.norm.eps})
        else:
            config.update({"rms_norm_eps": None, "layer_norm_eps": first.norm.eps})
        rotated = next((m for m in mixers if m.position.kind == "rope"), None)
        if rotated is not None:
            config["rope_parameters"] = rope_config(rotated.position)
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if moe is not None:
            if moe.score_bias or moe.groups != 1 or moe.routed_scale != 1.0 or moe.shared_gate or not moe.gated \
                    or (moe.scoring == "softmax" and not moe.normalize) or moe.scoring not in ("softmax", "sigmoid") \
                    or (moe.shared and moe.shared_hidden != moe.shared * moe.hidden):
                raise NotExpressible("cohere2_moe's experts are GLUs chosen by softmax (renormalised) or sigmoid "
                                     "scores, unscaled, ungrouped, beside shared experts as wide as they are")
            config.update({"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "intermediate_size": moe.hidden, "expert_selection_fn": moe.scoring,
                           "norm_topk_prob": moe.normalize, "num_shared_experts": moe.shared,
                           "shared_expert_combination_strategy": "sum"})
        if dense is not None:
            config["prefix_dense_intermediate_size"] = dense.hidden
            config.setdefault("intermediate_size", dense.hidden)
        config["hidden_act"] = ACTIVATION_NAMES[(moe or dense).activation]
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind == "moe":
            return moe_links(mlp, theirs, ours, shared="shared_experts")
        return glu_links(theirs, ours, False)


ARCHITECTURES = (Cohere2Moe(),)
