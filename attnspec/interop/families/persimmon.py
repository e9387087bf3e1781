"""transformers' ``persimmon`` model type (Adept's Persimmon) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, Wrapper, block_prefix, expanded_blocks, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.gpt_neox import GptNeoX


class Persimmon(GptNeoX):
    """Persimmon: GPT-NeoX's blocks one after the other (no parallel residual), each head's q and k through a
    LayerNorm with a bias (``qk_layernorm``: `qk_norm: layernorm`, eps ``layer_norm_eps``) before RoPE on half of
    each head, squared ReLU in the MLP, everything biased."""

    model_types = ("persimmon",)
    causal_lm = {"persimmon": "PersimmonForCausalLM"}
    stored_names: dict = {}
    config_fields: dict = {}
    wrappers = {"fuyu": Wrapper("persimmon", {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."},
                                ("vision_embed_tokens.",))}
    """Fuyu is a Persimmon reading image patches through one linear map (left unread)."""
    ROTARY_FRACTION, ACTIVATION = 0.5, "relu2"
    EMBED, LAYERS, FINAL_NORM, ATTENTION = "model.embed_tokens", "model.layers", "model.final_layernorm", "self_attn"

    rows = (
        Row(("persimmon",),
            "gpt_neox's blocks in sequence with a LayerNorm of each head's q and k (`qk_norm: layernorm`) where "
            "`qk_layernorm`, RoPE on the first `partial_rotary_factor` (half) of each head",
            "RoPE scalings as llama"),
        Row(("fuyu",),
            "the multimodal release's language model: `text_config` and the `language_model.` tensors, as "
            "`persimmon`; the image patches' projection is not read",
            "images: attnspec models are text models"),
    )

    def member_block(self, config: Config, block: dict) -> dict:
        eps = config.number("layer_norm_eps", 1e-5, positive=True)
        qk_norm = {"qk_norm": "layernorm", "norm_eps": eps} if config.get("qk_layernorm", bool, True) else {}
        return {**block, "parallel": "none", "mixer": {**block["mixer"], **qk_norm}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixer = blocks[0].mixer
        if any(b != blocks[0] for b in blocks) or blocks[0].parallel != "none" \
                or mixer.qk_norm not in ("none", "layernorm") or mixer.qk_norm_after_rope \
                or not (mixer.qkv_bias and mixer.out_bias) \
                or (mixer.qk_norm == "layernorm" and mixer.norm_eps != blocks[0].norm.eps):
            raise NotExpressible("persimmon's blocks are alike, sequential and biased, with a LayerNorm of each head's "
                                 "q and k (eps as the block norms') or none")
        plain = blocks[0].model_copy(update={"parallel": "own_norms",
                                             "mixer": mixer.model_copy(update={"qk_norm": "none"})})
        config = super().config(spec.model_copy(update={"layers": [plain]}), model_type)
        for field in ("use_parallel_residual", "attention_bias"):
            config.pop(field)
        return {**config, "num_hidden_layers": len(blocks), "qk_layernorm": mixer.qk_norm == "layernorm"}

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        for index, block in enumerate(expanded_blocks(spec)):
            if block.mixer.qk_norm == "layernorm":
                theirs, ours = f"{self.LAYERS}.{index}.{self.ATTENTION}.", f"{block_prefix(index)}mixer."
                links += [rename(f"{theirs}{s}_layernorm.weight", f"{ours}qk_norm.{s}") for s in "qk"]
                links += [rename(f"{theirs}{s}_layernorm.bias", f"{ours}qk_norm_bias.{s}") for s in "qk"]
        return links


ARCHITECTURES = (Persimmon(),)
