"""transformers' ``dots1`` model type (rednote's dots.llm1) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, glu_links, moe_links
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.deepseek_v3 import DeepseekV3, experts_config
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits


class Dots1(LlamaFamily):
    """dots.llm1: Qwen3's attention (QK-norm; a window on the layers ``layer_types`` names sliding) with
    DeepSeek-V3's MLPs: GLUs in the first ``first_k_dense_replace`` layers, then experts (sigmoid scores with a
    correction bias, group-limited top-k, renormalised with ``norm_topk_prob``, times
    ``routed_scaling_factor``, shared experts)."""

    ALIASES: dict[str, str] = {}
    model_types = ("dots1",)
    causal_lm = {"dots1": "Dots1ForCausalLM"}
    export_order = None

    rows = (
        Row(("dots1",),
            "qwen3's attention (windows on the layers `layer_types` names sliding) with deepseek_v3's dense MLPs "
            "then experts",
            "as qwen3 and deepseek_v3"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        types = config.attention_layer_types(layers, ["full_attention"] * layers)
        window = config.count("sliding_window", None)
        if window is None and "sliding_attention" in types:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set",
                                [i for i, t in enumerate(types) if t == "sliding_attention"])
        windows = [window if t == "sliding_attention" else None for t in types]
        blocks, eps = self.layer_blocks(config, "qwen3", windows)
        # Dots1Config's router does not renormalise unless asked (DeepSeek-V3's does)
        moe = DeepseekV3.experts(Config({"norm_topk_prob": False, **config.data}, config.source))
        dense = config.get("first_k_dense_replace", int, 0)
        return self.assembled(config, [{**block, "mlp": block["mlp"] if i < dense else moe}
                                       for i, block in enumerate(blocks)], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        dense = next((i for i, b in enumerate(blocks) if b.mlp.kind == "moe"), len(blocks))
        if any(b.mlp.kind != "moe" for b in blocks[dense:]) or any(b.mlp.kind != "glu" or b.mlp.bias
                                                                   for b in blocks[:dense]):
            raise NotExpressible("dots1 has dense MLPs in its first layers and experts after them")
        moe = blocks[dense].mlp if dense < len(blocks) else None
        if moe is not None and (moe.scoring != "sigmoid" or not moe.score_bias):
            raise NotExpressible("dots1's experts are sigmoid-scored with a correction bias")
        config = super().config(spec, "qwen3")
        config.pop("use_sliding_window")
        if dense:
            config["intermediate_size"] = blocks[0].mlp.hidden
        return {**config, "first_k_dense_replace": dense, **(experts_config(moe) if moe is not None else {})}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind == "moe":
            return moe_links(mlp, theirs, ours, shared="shared_experts")
        return glu_links(theirs, ours, False)


ARCHITECTURES = (Dots1(),)
