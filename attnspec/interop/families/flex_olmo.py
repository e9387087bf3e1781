"""transformers' ``flex_olmo`` model type (Ai2's FlexOlmo) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, moe_links, softmax_experts
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.olmo2 import Olmo2
from attnspec.spec import limits


class FlexOlmo(Olmo2):
    """FlexOlmo: OLMo 2's layers (x + norm(f(x)), QK-norm over whole projections) with OLMoE's experts in every
    layer: a softmax router, its top ``num_experts_per_tok`` (renormalised with ``norm_topk_prob``), SiLU GLU
    experts."""

    model_types = ("flex_olmo",)
    causal_lm = {"flex_olmo": "FlexOlmoForCausalLM"}

    rows = (
        Row(("flex_olmo",),
            "olmo2's layers with olmoe's experts in every layer",
            "as olmo2 and olmoe"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        return super().spec(config, "olmo2")

    def config(self, spec, model_type: str) -> dict:
        return super().config(spec, "olmo2")

    def mlp_node(self, config: Config) -> dict:
        experts = config.count("num_experts", 7, limit=limits.MAX_EXPERTS)
        return softmax_experts(config, experts, config.count("intermediate_size"), 5,
                               config.get("norm_topk_prob", bool, False))

    def mlp_config(self, blocks) -> dict:
        moe = blocks[0].mlp
        if any(b.mlp != moe for b in blocks) or moe.kind != "moe" or moe.shared or moe.scoring != "softmax" \
                or moe.score_bias:
            raise NotExpressible("flex_olmo has the same softmax-routed experts in every layer")
        return {"num_experts": moe.experts, "num_experts_per_tok": moe.top_k, "norm_topk_prob": moe.normalize,
                "intermediate_size": moe.hidden}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs, ours)


ARCHITECTURES = (FlexOlmo(),)
