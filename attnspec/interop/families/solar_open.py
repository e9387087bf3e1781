"""transformers' ``solar_open`` model type (Upstage's Solar Open) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.dots1 import Dots1
from attnspec.interop.families.llama import LlamaFamily


class SolarOpen(Dots1):
    """Solar Open: Llama's attention (q/k/v biases with ``attention_bias``, none on the output) with
    DeepSeek-V3's experts in every layer (sigmoid scores with a correction bias, group-limited top-k,
    renormalised with ``norm_topk_prob``, times ``routed_scaling_factor``, shared experts)."""

    model_types = ("solar_open",)
    causal_lm = {"solar_open": "SolarOpenForCausalLM"}
    RENORMALISE = True

    rows = (
        Row(("solar_open",),
            "llama's attention (q/k/v biases, none on the output) with deepseek_v3's experts in every layer",
            "as llama and deepseek_v3"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if "first_k_dense_replace" in config.data:  # its config class has no dense layers
            config = Config({k: v for k, v in config.data.items() if k != "first_k_dense_replace"}, config.source)
        return super().spec(config, model_type)

    def attention_blocks(self, config: Config) -> tuple[list[dict], float]:
        # no layer is dense: the blocks' dense MLP (replaced by the experts) is drawn at the experts' width
        config = Config({**config.data, "intermediate_size": config.count("moe_intermediate_size")}, config.source)
        blocks, eps = self.layer_blocks(config, "llama")
        mixer = {**blocks[0]["mixer"], "out_bias": False}
        return [{**block, "mixer": mixer} for block in blocks], eps

    def attention_config(self, spec) -> dict:
        mixer = expanded_blocks(spec)[0].mixer
        if mixer.out_bias or mixer.qk_norm != "none":
            raise NotExpressible("solar_open's attention has no output bias and no QK-norm")
        config = LlamaFamily.config(self, spec, "llama")
        config.pop("mlp_bias", None)
        return {**config, "attention_bias": mixer.qkv_bias}

    def config(self, spec, model_type: str) -> dict:
        config = super().config(spec, model_type)
        if config.pop("first_k_dense_replace"):
            raise NotExpressible("solar_open has experts in every layer")
        config.pop("intermediate_size", None)
        return config


ARCHITECTURES = (SolarOpen(),)
