"""transformers' ``olmoe`` model type (OLMoE) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, moe_links, softmax_experts
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Olmoe(LlamaFamily):
    """OLMoE: Llama's pre-norm layers with QK-norm over the whole q and k projections and experts in every
    layer: a softmax router, its top ``num_experts_per_tok`` (renormalised with ``norm_topk_prob``), SiLU
    GLU experts."""

    ALIASES: dict[str, str] = {}
    model_types = ("olmoe",)
    causal_lm = {"olmoe": "OlmoeForCausalLM"}
    export_order = None

    rows = (
        Row(("olmoe",),
            "llama's layers with QK-norm over the whole q and k projections (`qk_norm: rmsnorm_full`) and experts "
            "in every layer (`mlp: {kind: moe}`: softmax router, top-k renormalised with `norm_topk_prob`, SiLU "
            "GLU experts)",
            "`clip_qkv` (q, k and v clamped: no attnspec part); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.number("clip_qkv", None) is not None:
            raise config.refuse("clip_qkv", "attnspec's attention does not clamp q, k and v; null imports")
        blocks, eps = self.layer_blocks(config, "llama")
        experts = config.count("num_experts", 64, limit=limits.MAX_EXPERTS)
        moe = softmax_experts(config, experts, config.count("intermediate_size"), 8,
                              config.get("norm_topk_prob", bool, False))
        blocks = [{**block, "mixer": {**block["mixer"], "qk_norm": "rmsnorm_full"}, "mlp": moe} for block in blocks]
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        moe = blocks[0].mlp
        if any(b.mlp.kind != "moe" or b.mlp != moe or b.mixer.qk_norm != "rmsnorm_full" for b in blocks) \
                or moe.shared:
            raise NotExpressible("olmoe has QK-norm over whole projections and the same experts in every layer")
        config = super().config(spec, "llama")
        config.pop("mlp_bias", None)
        return {**config, "num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                "norm_topk_prob": moe.normalize, "intermediate_size": moe.hidden, "clip_qkv": None}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs, ours)


ARCHITECTURES = (Olmoe(),)
