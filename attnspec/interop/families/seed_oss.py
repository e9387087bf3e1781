"""transformers' ``seed_oss`` model type (ByteDance Seed-OSS) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config
from attnspec.interop.families.llama import LlamaFamily


class SeedOss(LlamaFamily):
    """Seed-OSS: Llama's layers with q/k/v biases (``attention_bias``) apart from the output projection's
    (``attention_out_bias``), and MLP biases with ``mlp_bias``; its residual dropout is training's alone."""

    ALIASES: dict[str, str] = {}
    model_types = ("seed_oss",)
    causal_lm = {"seed_oss": "SeedOssForCausalLM"}
    export_order = None

    rows = (
        Row(("seed_oss",),
            "llama's layers with q/k/v biases (`attention_bias`), the output projection's own (`attention_out_bias`) "
            "and MLP biases (`mlp_bias`)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        out_bias = config.get("attention_out_bias", bool, False)
        blocks = [{**block, "mixer": {**block["mixer"], "out_bias": out_bias}} for block in blocks]
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        first = expanded_blocks(spec)[0].mixer
        return {**super().config(spec, "llama"), "attention_bias": first.qkv_bias, "attention_out_bias": first.out_bias}


ARCHITECTURES = (SeedOss(),)
