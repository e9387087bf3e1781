"""transformers' ``mellum`` model type (JetBrains' Mellum) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, glu_node, moe_links, rope_config, softmax_experts
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Mellum(LlamaFamily):
    """Mellum: Qwen3's attention (QK-norm per head, GQA) with a window of ``sliding_window`` on the layers
    ``layer_types`` names sliding and RoPE per layer type (``rope_parameters`` keyed by ``full_attention`` and
    ``sliding_attention``); each layer's MLP by ``mlp_layer_types``: experts (``sparse``: a softmax router, the
    top ``num_experts_per_tok`` renormalised with ``norm_topk_prob``, SiLU GLU experts, stored one by one as
    transformers saves them) or a dense GLU. Its multi-token-prediction
    layers, past the last, are not read (transformers' model has none)."""

    ALIASES: dict[str, str] = {}
    model_types = ("mellum",)
    causal_lm = {"mellum": "MellumForCausalLM"}
    export_order = None

    rows = (
        Row(("mellum",),
            "qwen3's attention with a window on the layers `layer_types` names sliding, RoPE per layer type, and per "
            "`mlp_layer_types` experts (softmax router, top-k renormalised with `norm_topk_prob`, SiLU GLU experts) "
            "or a dense GLU",
            "RoPE scalings as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        types = config.attention_layer_types(layers, ["full_attention"] * layers)
        window = config.count("sliding_window", 1024)
        blocks, eps = self.layer_blocks(config, "qwen3", [window if t == "sliding_attention" else None for t in types])
        heads, _, head_dim = config.attention_heads()
        mlp_types = config.get("mlp_layer_types", list, None) or ["sparse"] * layers
        if len(mlp_types) != layers or any(t not in ("sparse", "dense") for t in mlp_types):
            raise config.refuse("mlp_layer_types", f"one of 'sparse' or 'dense' per layer ({layers})")
        field = "num_local_experts" if "num_local_experts" in config.data else "num_experts"  # as transformers saves it
        experts = config.count(field, 64, limit=limits.MAX_EXPERTS)
        moe = softmax_experts(config, experts, config.count("moe_intermediate_size"), 8,
                              config.get("norm_topk_prob", bool, True))
        dense = glu_node(config)
        blocks = [{**block, "mixer": {**block["mixer"], "position": config.rope(head_dim, layer_type=layer_type)},
                   "mlp": moe if mlp_type == "sparse" else dense}
                  for block, layer_type, mlp_type in zip(blocks, types, mlp_types)]
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        windows = [getattr(b.mixer, "window", None) for b in blocks]
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        dense = next((b.mlp for b in blocks if b.mlp.kind != "moe"), None)
        ropes = {("sliding_attention" if w else "full_attention"): b.mixer.position for b, w in zip(blocks, windows)}
        if len({w for w in windows if w}) > 1 or moe is None or any(b.mlp.kind == "moe" and b.mlp != moe
                                                                     for b in blocks) \
                or any(b.mixer.position != ropes["sliding_attention" if w else "full_attention"]
                       for b, w in zip(blocks, windows)) or moe.shared or moe.shared_gate:
            raise NotExpressible("mellum has one window, one RoPE per layer type and the same experts in every "
                                 "sparse layer")
        plain = spec.model_copy(update={"layers": [b.model_copy(update={"mixer": b.mixer.model_copy(update={
            "window": None, "position": blocks[0].mixer.position})}) for b in blocks]})
        base = super().config(plain, "qwen3")
        return {**base, "layer_types": ["sliding_attention" if w else "full_attention" for w in windows],
                "sliding_window": next((w for w in windows if w), 1024),
                "rope_parameters": {kind: rope_config(position) for kind, position in ropes.items()},
                "mlp_layer_types": ["sparse" if b.mlp.kind == "moe" else "dense" for b in blocks],
                "num_experts": moe.experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
                "norm_topk_prob": moe.normalize, "intermediate_size": dense.hidden if dense is not None else moe.hidden}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs, ours) if mlp.kind == "moe" else super().mlp_links(mlp, theirs, ours)


ARCHITECTURES = (Mellum(),)
