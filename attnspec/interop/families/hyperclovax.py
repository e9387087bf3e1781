"""transformers' ``hyperclovax`` model type (NAVER's HyperCLOVA X SEED) as attnspec specs, and back (what a
family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, block_prefix, expanded_blocks, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.granite import Granite


class HyperClovaX(Granite):
    """HyperCLOVA X: Granite's layers and μP multipliers, with a norm after each sub-layer
    (``use_post_norm``, Peri-LN: ``norm_placement: sandwich``) before the residual multiplier, the logits
    *multiplied* by ``logits_scaling`` (Granite divides) and the softmax scale head_dim^-1/2 where
    ``attention_multiplier`` is unset."""

    model_types = ("hyperclovax",)
    causal_lm = {"hyperclovax": "HyperCLOVAXForCausalLM"}

    rows = (
        Row(("hyperclovax",),
            "granite's layers and multipliers with a norm after each sub-layer where `use_post_norm` "
            "(`norm_placement: sandwich`) and `logits_scaling` multiplying the logits (`head.scale`)",
            "as llama"),
    )

    def default_attention_multiplier(self, config: Config) -> float:
        heads = config.count("num_attention_heads")
        return (config.get("head_dim", int, None) or config.count("hidden_size") // heads) ** -0.5

    def block_fields(self, config: Config) -> dict:
        return {"norm_placement": "sandwich"} if config.get("use_post_norm", bool, True) else {}

    def head_scale(self, config: Config) -> float:
        return config.number("logits_scaling", 1.0, positive=True)

    def config(self, spec, model_type: str) -> dict:
        placements = {block.norm_placement for block in expanded_blocks(spec)}
        if len(placements) != 1 or placements & {"output", "post"}:
            raise NotExpressible("hyperclovax puts a norm before each sub-layer, and after it in every layer or none")
        config = super().config(spec, "granite")
        return {**config, "logits_scaling": spec.head.scale, "use_post_norm": placements == {"sandwich"}}

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        for index, block in enumerate(expanded_blocks(spec)):
            if block.norm_placement == "sandwich":
                theirs, ours = f"model.layers.{index}.", block_prefix(index)
                links += [rename(f"{theirs}post_norm1.weight", f"{ours}post_norm1.weight"),
                          rename(f"{theirs}post_norm2.weight", f"{ours}post_norm2.weight")]
        return links


ARCHITECTURES = (HyperClovaX(),)
