"""transformers' ``aria_text`` model type (the text model of Rhymes' Aria) as attnspec specs, and back (what a
family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, expanded_blocks, expert_counts, glu_links, rename,
                                           shared_count)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class AriaText(LlamaFamily):
    """Aria's text model: Llama's attention with experts in every layer: the top ``moe_topk`` router logits
    weighted by their softmax (a softmax over all experts, renormalised), ``moe_num_experts`` SiLU GLU experts of
    ``intermediate_size`` stored fused and transposed (``experts.fc1`` (experts, d, 2 hidden), the activated
    half first; ``experts.fc2`` (experts, hidden, d)), beside ``moe_num_shared_experts`` shared ones as one
    GLU that many times as wide."""

    ALIASES: dict[str, str] = {}
    model_types = ("aria_text",)
    causal_lm = {"aria_text": "AriaTextForCausalLM"}
    export_order = None

    rows = (
        Row(("aria_text",),
            "llama's attention with experts in every layer (softmax of the top-k logits, fused transposed expert "
            "tensors, shared experts as one wider GLU)",
            "`mlp_bias`; a `hidden_act` other than silu (its routed experts are SiLU whatever it says); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("mlp_bias", bool, False):
            raise config.refuse("mlp_bias", "Aria's routed experts take no biases where its shared ones would; "
                                "false imports")
        blocks, eps = self.layer_blocks(config, "llama")
        experts, chosen = expert_counts(config, "moe_num_experts", 8, "moe_topk", 2)
        shared = shared_count(config, "moe_num_shared_experts", 2)
        hidden = config.count("intermediate_size")
        moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": hidden, "scoring": "softmax",
               "normalize": True, "activation": config.activation(allowed=("silu",)), "shared": shared,
               **({"shared_hidden": shared * hidden} if shared else {})}
        return self.assembled(config, [{**block, "mlp": moe} for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        moe = blocks[0].mlp
        if any(b.mlp != moe or getattr(b.mixer, "window", None) for b in blocks) or moe.kind != "moe":
            raise NotExpressible("aria_text has the same experts in every layer and no windows")
        if moe.scoring != "softmax" or not moe.normalize or moe.score_bias or moe.groups != 1 \
                or moe.routed_scale != 1.0 or moe.shared_gate or not moe.gated or moe.activation != "silu" \
                or (moe.shared and moe.shared_hidden != moe.shared * moe.hidden):
            raise NotExpressible("aria_text's experts are SiLU GLUs weighted by the softmax of the top-k logits, "
                                 "beside shared experts as wide as they are")
        base = super().config(spec, "llama")
        return {**base, "mlp_bias": False, "intermediate_size": moe.hidden, "moe_num_experts": moe.experts,
                "moe_topk": moe.top_k, "moe_num_shared_experts": moe.shared}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        routed = [f"{ours}routed.{e}." for e in range(mlp.experts)]
        links = [rename(f"{theirs}router.weight", f"{ours}router.weight"),
                 Link(f"{theirs}experts.fc1.weight", tuple(f"{r}{n}.weight" for r in routed for n in ("up", "gate")),
                      stack=mlp.experts, transpose=True),
                 Link(f"{theirs}experts.fc2.weight", tuple(f"{r}down.weight" for r in routed), stack=mlp.experts,
                      transpose=True)]
        if mlp.shared:
            links += glu_links(f"{theirs}shared_experts.", f"{ours}shared.", False)
        return links


ARCHITECTURES = (AriaText(),)
