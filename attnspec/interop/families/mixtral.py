"""transformers' ``mixtral`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, moe_links, softmax_experts, w123_links
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Mixtral(LlamaFamily):
    """Mixtral: Mistral's attention (a window in every layer where ``sliding_window`` is set) and a sparse
    MoE block in every layer: a softmax router over ``num_local_experts``, its top ``num_experts_per_tok``
    renormalised, GLU experts of ``hidden_act`` stored as w1 (gate), w3 (up) and w2 (down) under
    ``block_sparse_moe``."""

    ALIASES: dict[str, str] = {}
    model_types = ("mixtral",)
    causal_lm = {"mixtral": "MixtralForCausalLM"}
    export_order = None

    rows = (
        Row(("mixtral",),
            "mistral's attention (a `window` in every layer where `sliding_window` is set) and experts in every "
            "layer (`mlp: {kind: moe}`: softmax router, top-k renormalised, GLU experts of `hidden_act`)",
            "`router_jitter_noise` (attnspec's experts take no jitter); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "mistral")
        if config.number("router_jitter_noise", 0.0):
            raise config.refuse("router_jitter_noise", "attnspec's experts take no jitter; 0 imports")
        experts = config.count("num_local_experts", 8, limit=limits.MAX_EXPERTS)
        moe = softmax_experts(config, experts, config.count("intermediate_size"), 2, True,
                              config.activation())  # MixtralExperts applies ACT2FN[hidden_act]
        blocks = [{**block, "mlp": moe} for block in blocks]
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        moe = blocks[0].mlp
        if any(b.mlp.kind != "moe" for b in blocks):
            raise NotExpressible("mixtral has experts in every layer")
        windowed = any(getattr(b.mixer, "window", None) for b in blocks)
        config = super().config(spec, "mistral" if windowed else "llama")
        config.pop("mlp_bias", None)
        return {**config, "num_local_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                "intermediate_size": moe.hidden, "sliding_window": config.get("sliding_window"),
                "router_jitter_noise": 0.0}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs.replace(".mlp.", ".block_sparse_moe."), ours, expert_links=w123_links)


ARCHITECTURES = (Mixtral(),)
