"""transformers' ``flint`` model type as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, expanded_blocks, expert_counts, moe_links,
                                           rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Flint(LlamaFamily):
    """Flint: Qwen3's attention (QK-norm) with attention sinks in every layer, windowed layers with RoPE and
    global ones without positions (``layer_types``: global on the first two layers, every fourth and the last by
    default), a dense GLU on ``mlp_only_layers`` and experts elsewhere (every ``decoder_sparse_step``-th): sigmoid
    scores without a correction bias, the top ``num_experts_per_tok`` renormalised with ``norm_topk_prob``,
    and one ungated shared GLU expert ``shared_expert_intermediate_size`` wide."""

    ALIASES: dict[str, str] = {}
    model_types = ("flint",)
    causal_lm = {"flint": "FlintForCausalLM"}
    export_order = None
    stored_names = {"flint": ((r"\.self_attn\.sinks$", ".self_attn.softmax_offset"),)}
    """Flint's checkpoints name the sinks ``softmax_offset`` (transformers' conversion_mapping renames them)."""

    rows = (
        Row(("flint",),
            "qwen3's attention with sinks (`sinks: true`), windows with RoPE on `sliding_attention` layers and no "
            "positions on global ones, a GLU on `mlp_only_layers`, experts elsewhere (sigmoid scores renormalised "
            "with `norm_topk_prob`, one ungated shared expert)",
            "as llama"),
    )

    HEAD_DIM = 128

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        default = ["full_attention" if i < 2 or i % 4 == 1 or i == layers - 1 else "sliding_attention"
                   for i in range(layers)]
        types = config.attention_layer_types(layers, default)
        window = config.count("sliding_window", 513)
        blocks, eps = self.layer_blocks(config, "qwen3", [window if t == "sliding_attention" else None
                                                          for t in types])
        step = config.count("decoder_sparse_step", 1)
        dense_only = config.layer_list("mlp_only_layers", layers) if config.data.get("mlp_only_layers") is not None \
            else [0, 1]
        experts, chosen = expert_counts(config, "num_experts", 256, "num_experts_per_tok", 6)
        moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": config.count("moe_intermediate_size", 512),
               "scoring": "sigmoid", "normalize": config.get("norm_topk_prob", bool, True),
               "activation": config.activation(allowed=("silu",)), "shared": 1,
               "shared_hidden": config.count("shared_expert_intermediate_size", 1024)}
        layered = []
        for index, block in enumerate(blocks):
            mixer = {**block["mixer"], "sinks": True}
            if "window" not in mixer:
                mixer["position"] = {"kind": "none"}
            sparse = index not in dense_only and (index + 1) % step == 0
            layered.append({**block, "mixer": mixer, **({"mlp": moe} if sparse else {})})
        return self.assembled(config, layered, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        if any(m.kind != "softmax" or not m.sinks or m.qk_norm != "rmsnorm" for m in mixers):
            raise NotExpressible("flint is softmax attention with QK-norm and sinks in every block")
        windows = [m.window for m in mixers]
        if len({w for w in windows if w}) > 1 or any((m.position.kind == "rope") != (m.window is not None)
                                                     for m in mixers):
            raise NotExpressible("flint has one window, with RoPE on its windowed layers and none on the others")
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        dense = next((b.mlp for b in blocks if b.mlp.kind != "moe"), None)
        if moe is None or moe.scoring != "sigmoid" or moe.score_bias or moe.groups != 1 or moe.routed_scale != 1.0 \
                or moe.shared != 1 or moe.shared_gate or any(b.mlp != moe for b in blocks if b.mlp.kind == "moe"):
            raise NotExpressible("flint's experts are sigmoid-scored, unbiased and unscaled, beside one ungated "
                                 "shared expert, alike in every sparse layer")
        rotated = next((m for m in mixers if m.position.kind == "rope"), None)
        if rotated is None:  # its RoPE has nowhere to be stated
            raise NotExpressible("flint rotates its windowed layers: a spec of global layers alone is no flint")
        shaped = spec.model_copy(update={"layers": [blocks[0].model_copy(update={"mixer": rotated.model_copy(
            update={"window": None})})]})
        base = super().config(shaped, "qwen3")
        base.pop("use_sliding_window", None)
        return {**base, "num_hidden_layers": len(blocks), "head_dim": mixers[0].d_qk,
                "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
                "sliding_window": next((w for w in windows if w), 513),
                "mlp_only_layers": [i for i, b in enumerate(blocks) if b.mlp.kind != "moe"], "decoder_sparse_step": 1,
                "num_experts": moe.experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
                "norm_topk_prob": moe.normalize, "shared_expert_intermediate_size": moe.shared_hidden or moe.hidden,
                "intermediate_size": dense.hidden if dense is not None else moe.hidden}

    def links(self, spec) -> list[Link]:
        return super().links(spec) + [rename(f"model.layers.{i}.self_attn.sinks", f"{block_prefix(i)}mixer.sinks")
                                      for i in range(len(expanded_blocks(spec)))]

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs, ours) if mlp.kind == "moe" else super().mlp_links(mlp, theirs, ours)


ARCHITECTURES = (Flint(),)
