"""transformers' ``glm4_moe`` model type (GLM-4.5, GLM-4.6) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, rename
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
    QK_NORM = False
    """``use_qk_norm``'s default (the config class's)."""

    rows = (
        Row(("glm4_moe",),
            "attention with q/k/v biases, QK-norm with `use_qk_norm`, partial RoPE (half by default), with "
            "deepseek_v3's dense MLPs then experts",
            "as llama and deepseek_v3"),
    )

    def attention_blocks(self, config: Config) -> tuple[list[dict], float]:
        blocks, eps = self.layer_blocks(config, "llama")
        mixer = {**blocks[0]["mixer"], "out_bias": False}
        if config.get("use_qk_norm", bool, self.QK_NORM):
            mixer["qk_norm"] = "rmsnorm"
        return [{**block, "mixer": mixer} for block in blocks], eps

    def attention_config(self, spec) -> dict:
        mixer = expanded_blocks(spec)[0].mixer
        if mixer.out_bias or mixer.qk_norm == "rmsnorm_full":
            raise NotExpressible("glm4_moe's output projection has no bias and its QK-norm is per head")
        config = LlamaFamily.config(self, spec, "llama")
        config.pop("mlp_bias", None)
        return {**config, "attention_bias": mixer.qkv_bias, "use_qk_norm": mixer.qk_norm == "rmsnorm"}


class SarvamMoe(Glm4Moe):
    """Sarvam-30B: GLM-4.5's model (transformers runs ``Glm4MoeForCausalLM`` for it) under its own config
    class, whose defaults differ: RoPE over the whole head, QK-norm on; its released configs name the
    q/k/v biases ``use_qkv_bias`` and the experts ``num_experts``."""

    model_types = ("sarvam_moe",)
    causal_lm = {"sarvam_moe": "Glm4MoeForCausalLM"}
    config_fields = {"sarvam_moe": {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                                    "use_qkv_bias": "attention_bias"}}
    ROTARY_FRACTION = 1.0
    QK_NORM = True
    stored_names = {"sarvam_moe": ((r"^model\.embed_tokens\.", "model.word_embeddings."),
                                   (r"\.self_attn\.o_proj\.", ".self_attn.dense."),
                                   (r"\.self_attn\.q_norm\.", ".self_attn.query_layernorm."),
                                   (r"\.self_attn\.k_norm\.", ".self_attn.key_layernorm."),
                                   (r"\.self_attn\.", ".attention."),
                                   (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.expert_bias"))}

    rows = (Row(("sarvam_moe",), "glm4_moe's model and layers (its config class, GLM-4.5's modelling code) with "
                                "RoPE over the whole head and QK-norm by default; q/k/v stored packed as Sarvam's "
                                "checkpoints store them", "as glm4_moe"),)

    def projection_links(self, mixer, theirs: str, ours: str) -> list[Link]:
        """q, k and v packed row-wise in one ``query_key_value`` (transformers splits it on load)."""
        links = [Link(f"{theirs}query_key_value.weight", tuple(f"{ours}{n}_proj.weight" for n in "qkv")),
                 rename(f"{theirs}o_proj.weight", f"{ours}out_proj.weight")]
        if mixer.qkv_bias:
            links.append(Link(f"{theirs}query_key_value.bias", tuple(f"{ours}{n}_proj.bias" for n in "qkv")))
        if mixer.out_bias:
            links.append(rename(f"{theirs}o_proj.bias", f"{ours}out_proj.bias"))
        return links


ARCHITECTURES = (Glm4Moe(), SarvamMoe())
