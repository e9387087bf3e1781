"""transformers' ``glm`` and ``glm4`` model types (GLM-4 dense, GLM-4-0414) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, block_prefix, expanded_blocks, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.interop.families.phi3 import Phi3


class Glm(LlamaFamily):
    """GLM: Llama's layers with q/k/v biases (``attention_bias``; none on the output), RoPE on interleaved
    pairs of the first ``partial_rotary_factor`` of each head, and the GLU's gate and up packed in one
    ``gate_up_proj`` (gate first). GLM-4 adds a norm after each sub-layer (sandwich norms)."""

    ALIASES: dict[str, str] = {}
    model_types = ("glm", "glm4")
    causal_lm = {"glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM"}
    export_order = None

    rows = (
        Row(("glm", "glm4"),
            "llama's layers with q/k/v biases (`attention_bias`), RoPE on interleaved pairs (`interleaved: true`) of "
            "the first `partial_rotary_factor` of each head, a packed `gate_up_proj`; GLM-4's norms after each "
            "sub-layer too (`norm_placement: sandwich`)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers")
        blocks, eps = self.layer_blocks(config, "llama", [None] * layers)
        if blocks[0]["mlp"]["bias"]:
            raise config.refuse("mlp_bias", "GLM's MLP takes no biases")
        mixer = {**blocks[0]["mixer"], "out_bias": False,
                 "position": {**blocks[0]["mixer"]["position"], "interleaved": True}}
        placement = {"norm_placement": "sandwich"} if model_type == "glm4" else {}
        return self.assembled(config, [{**block, "mixer": mixer, **placement} for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        placement = "sandwich" if model_type == "glm4" else "pre"
        first = blocks[0].mixer
        if any(b.norm_placement != placement or b.mixer.out_bias or not b.mixer.position.interleaved
               for b in blocks if b.mixer.kind == "softmax" and b.mixer.position is not None):
            raise NotExpressible(f"{model_type} has interleaved RoPE, no output bias and {placement} norms")
        config = super().config(spec, "llama")
        if config.pop("mlp_bias", False):
            raise NotExpressible(f"{model_type}'s MLP takes no biases")
        return {**config, "attention_bias": first.qkv_bias}

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        for index, block in enumerate(expanded_blocks(spec)):
            if block.norm_placement == "sandwich":  # GLM-4's norms after each sub-layer
                theirs, ours = f"model.layers.{index}.", block_prefix(index)
                links += [rename(f"{theirs}post_self_attn_layernorm.weight", f"{ours}post_norm1.weight"),
                          rename(f"{theirs}post_mlp_layernorm.weight", f"{ours}post_norm2.weight")]
        return links

    mlp_links = Phi3.mlp_links


ARCHITECTURES = (Glm(),)
