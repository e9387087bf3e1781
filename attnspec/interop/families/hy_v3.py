"""transformers' ``hy_v3`` model type (Tencent's Hunyuan V3) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, expanded_blocks, expert_counts, moe_links, rename,
                                           shared_count)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class HYV3(LlamaFamily):
    """Hunyuan V3: Qwen3's attention (QK-norm before RoPE), a dense GLU or experts per layer by
    ``mlp_layer_types`` (the first dense by default): sigmoid scores with a correction bias that chooses
    but does not weight, the top ``num_experts_per_tok`` renormalised and times ``router_scaling_factor``,
    beside ``num_shared_experts`` shared ones as one GLU that many times as wide."""

    ALIASES: dict[str, str] = {}
    model_types = ("hy_v3",)
    causal_lm = {"hy_v3": "HYV3ForCausalLM"}
    export_order = None
    stored_names = {"hy_v3": ((r"\.mlp\.gate\.weight$", ".mlp.router.gate.weight"),
                              (r"\.mlp\.e_score_correction_bias$", ".mlp.expert_bias"),
                              (r"\.mlp\.shared_experts\.", ".mlp.shared_mlp."))}
    """Hunyuan V3's checkpoints keep their own names for the router, its bias and the shared experts
    (transformers' conversion_mapping renames them)."""

    HEAD_DIM = 128

    rows = (
        Row(("hy_v3",),
            "qwen3's attention, a GLU or experts per layer by `mlp_layer_types` (sigmoid, correction bias, "
            "renormalised, `router_scaling_factor`, shared experts)",
            "`mlp_bias`; as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("mlp_bias", bool, False):
            raise config.refuse("mlp_bias", "Hunyuan V3's experts take no biases where its dense MLPs would; "
                                "false imports")
        blocks, eps = self.layer_blocks(config, "qwen3")
        layers = len(blocks)
        kinds = config.get("mlp_layer_types", list, None) or ["dense"] + ["sparse"] * (layers - 1)
        if len(kinds) != layers or any(kind not in ("dense", "sparse") for kind in kinds):
            raise config.refuse("mlp_layer_types", f"must name `dense` or `sparse` for each of the {layers} layers")
        experts, chosen = expert_counts(config, "num_experts", 192, "num_experts_per_tok", 8)
        shared = shared_count(config, "num_shared_experts", 1)
        hidden = config.count("moe_intermediate_size", 1536)
        moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": hidden, "scoring": "sigmoid",
               "score_bias": True, "normalize": True, "routed_scale": config.number("router_scaling_factor", 2.826),
               "activation": config.activation(allowed=("silu",)), "shared": shared,
               **({"shared_hidden": shared * hidden} if shared else {})}
        return self.assembled(config, [{**block, "mlp": moe} if kind == "sparse" else block
                                       for block, kind in zip(blocks, kinds)], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        if any(getattr(b.mixer, "window", None) for b in blocks):
            raise NotExpressible("hy_v3 has no sliding windows")
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        dense = next((b.mlp for b in blocks if b.mlp.kind != "moe"), None)
        if moe is not None and (moe.scoring != "sigmoid" or not moe.score_bias or not moe.normalize or moe.groups != 1
                                or moe.shared_gate or (moe.shared and moe.shared_hidden != moe.shared * moe.hidden)
                                or any(b.mlp != moe for b in blocks if b.mlp.kind == "moe")):
            raise NotExpressible("hy_v3's experts are sigmoid-scored with a correction bias, renormalised, "
                                 "ungrouped, beside shared experts as wide as they are, alike in every layer")
        base = super().config(spec, "qwen3")
        for field in ("use_sliding_window", "sliding_window", "layer_types"):
            base.pop(field, None)
        config = {**base, "mlp_bias": False,
                  "mlp_layer_types": ["sparse" if b.mlp.kind == "moe" else "dense" for b in blocks],
                  "intermediate_size": dense.hidden if dense is not None else moe.hidden}
        if moe is not None:
            config.update({"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "num_shared_experts": moe.shared,
                           "router_scaling_factor": moe.routed_scale})
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind != "moe":
            return super().mlp_links(mlp, theirs, ours)
        return [rename(f"{theirs}e_score_correction_bias", f"{ours}score_bias")
                if link.theirs.endswith("gate.e_score_correction_bias") else link
                for link in moe_links(mlp, theirs, ours, shared="shared_experts")]


ARCHITECTURES = (HYV3(),)
