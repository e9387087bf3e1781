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

    DENSE_LAYERS = 0
    """``first_k_dense_replace``'s default (the config class's)."""
    RENORMALISE = False
    """``norm_topk_prob``'s default: Dots1Config's router does not renormalise unless asked (DeepSeek-V3's does)."""

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.attention_blocks(config)
        moe = DeepseekV3.experts(Config({"norm_topk_prob": self.RENORMALISE, **config.data}, config.source))
        dense = config.get("first_k_dense_replace", int, self.DENSE_LAYERS)
        return self.assembled(config, [{**block, "mlp": block["mlp"] if i < dense else moe}
                                       for i, block in enumerate(blocks)], eps)

    def attention_blocks(self, config: Config) -> tuple[list[dict], float]:
        """Each layer's block with its attention and a dense MLP (:meth:`LlamaFamily.layer_blocks`), and the eps."""
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        types = config.attention_layer_types(layers, ["full_attention"] * layers)
        window = config.count("sliding_window", None)
        if window is None and "sliding_attention" in types:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set",
                                [i for i, t in enumerate(types) if t == "sliding_attention"])
        return self.layer_blocks(config, "qwen3", [window if t == "sliding_attention" else None for t in types])

    def attention_config(self, spec) -> dict:
        """The config fields of the attention and the dense MLP (the inverse of :meth:`attention_blocks`)."""
        config = super().config(spec, "qwen3")
        config.pop("use_sliding_window")
        return config

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        dense = next((i for i, b in enumerate(blocks) if b.mlp.kind == "moe"), len(blocks))
        if any(b.mlp.kind != "moe" for b in blocks[dense:]) or any(b.mlp.kind != "glu" or b.mlp.bias
                                                                   for b in blocks[:dense]):
            raise NotExpressible(f"{model_type} has dense MLPs in its first layers and experts after them")
        moe = blocks[dense].mlp if dense < len(blocks) else None
        if moe is not None and (moe.scoring != "sigmoid" or not moe.score_bias):
            raise NotExpressible(f"{model_type}'s experts are sigmoid-scored with a correction bias")
        config = self.attention_config(spec)
        if dense:
            config["intermediate_size"] = blocks[0].mlp.hidden
        return {**config, "first_k_dense_replace": dense, **(experts_config(moe) if moe is not None else {})}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind == "moe":
            return moe_links(mlp, theirs, ours, shared="shared_experts")
        return glu_links(theirs, ours, False)


ARCHITECTURES = (Dots1(),)
