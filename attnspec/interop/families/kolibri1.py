"""transformers' ``kolibri1`` model type as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expert_counts, moe_links
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.exaone4 import Exaone4


class Kolibri1(Exaone4):
    """Kolibri 1: EXAONE 4.0's attention (QK-norm per head; a window on the ``sliding_attention`` layers, by
    default all but every fifth, with RoPE there and no positions on the global ones) in GLM-4's sandwich of four
    norms, and experts in every layer: sigmoid scores of the router's logits, chosen by the logits plus a
    correction bias (`score_bias_on_logits`), renormalised with ``norm_topk_prob``, beside one ungated shared
    GLU ``shared_expert_intermediate_size`` wide."""

    model_types = ("kolibri1",)
    causal_lm = {"kolibri1": "Kolibri1ForCausalLM"}
    PLACEMENT = "sandwich"
    stored_names = {"kolibri1": ((r"\.mlp\.gate\.e_score_correction_bias$", ".moe.router.expert_bias"),
                                 (r"\.post_self_attn_layernorm\.", ".post_attn_norm."),
                                 (r"\.post_mlp_layernorm\.", ".post_ffn_norm."))}
    """Its checkpoints' own names for the router's bias and the norms after each sub-layer (transformers'
    conversion_mapping renames them)."""

    rows = (
        Row(("kolibri1",),
            "exaone4's attention in GLM-4's sandwich norms; experts in every layer (sigmoid scores chosen by the "
            "logits plus a correction bias: `score_bias_on_logits`; renormalised with `norm_topk_prob`; one "
            "ungated shared expert)",
            "as llama"),
    )

    def layer_types(self, config: Config, model_type: str, layers: int) -> tuple[list[str], int | None]:
        window = config.count("sliding_window", 513)
        default = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)]
        return config.attention_layer_types(layers, default), window

    def mlp_node(self, config: Config) -> dict:
        field = "num_local_experts" if "num_local_experts" in config.data else "num_experts"  # as transformers saves it
        experts, chosen = expert_counts(config, field, 384, "num_experts_per_tok", 6)
        return {"kind": "moe", "experts": experts, "top_k": chosen,
                "hidden": config.count("moe_intermediate_size", 512),
                "scoring": "sigmoid", "score_bias": True, "score_bias_on_logits": True,
                "normalize": config.get("norm_topk_prob", bool, False),
                "activation": config.activation(allowed=("silu",)), "shared": 1,
                "shared_hidden": config.count("shared_expert_intermediate_size", 512)}

    def mlp_config(self, blocks) -> dict:
        moe = blocks[0].mlp
        if any(b.mlp != moe for b in blocks) or moe.kind != "moe" or moe.scoring != "sigmoid" \
                or not (moe.score_bias and moe.score_bias_on_logits) or moe.groups != 1 or moe.routed_scale != 1 \
                or moe.shared != 1 or moe.shared_gate or moe.router_bias or moe.expert_bias or not moe.gated \
                or moe.glu_limit is not None:
            raise NotExpressible("kolibri1's layers hold the same experts: sigmoid scores chosen by biased logits, "
                                 "one ungated shared expert")
        return {"num_experts": moe.experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
                "norm_topk_prob": moe.normalize, "shared_expert_intermediate_size": moe.shared_hidden or moe.hidden}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs, ours, shared="shared_experts")


ARCHITECTURES = (Kolibri1(),)
