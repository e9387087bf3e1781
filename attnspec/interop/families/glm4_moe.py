"""transformers' ``glm4_moe`` model type (GLM-4.5, GLM-4.6) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.dots1 import Dots1
from attnspec.interop.families.llama import LlamaFamily


class Glm4Moe(Dots1):
    """GLM-4.5: attention with q/k/v biases (``attention_bias``; none on the output), QK-norm with
    ``use_qk_norm``, RoPE on the first ``partial_rotary_factor`` of each head (half by default), and
    DeepSeek-V3's MLPs: GLUs in the first ``first_k_dense_replace`` layers (one by default), then experts."""

    model_types = ("glm4_moe",)
    causal_lm = {"glm4_moe": "Glm4MoeForCausalLM"}
    DENSE_LAYERS = 1
    RENORMALISE = True
    ROTARY_FRACTION = 0.5

    rows = (
        Row(("glm4_moe",),
            "attention with q/k/v biases, QK-norm with `use_qk_norm`, partial RoPE (half by default), with "
            "deepseek_v3's dense MLPs then experts",
            "as llama and deepseek_v3"),
    )

    def attention_blocks(self, config: Config) -> tuple[list[dict], float]:
        blocks, eps = self.layer_blocks(config, "llama")
        mixer = {**blocks[0]["mixer"], "out_bias": False}
        if config.get("use_qk_norm", bool, False):
            mixer["qk_norm"] = "rmsnorm"
        return [{**block, "mixer": mixer} for block in blocks], eps

    def attention_config(self, spec) -> dict:
        mixer = expanded_blocks(spec)[0].mixer
        if mixer.out_bias or mixer.qk_norm == "rmsnorm_full":
            raise NotExpressible("glm4_moe's output projection has no bias and its QK-norm is per head")
        config = LlamaFamily.config(self, spec, "llama")
        config.pop("mlp_bias", None)
        return {**config, "attention_bias": mixer.qkv_bias, "use_qk_norm": mixer.qk_norm == "rmsnorm"}


ARCHITECTURES = (Glm4Moe(),)
