"""transformers' ``granite`` model type (IBM Granite 3 dense) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, common_fields, compress_layers, expanded_blocks, head_node, rmsnorm_node
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Granite(LlamaFamily):
    """Granite: Llama's layers and weights with μP's multipliers as spec settings: the embeddings times
    ``embedding_multiplier`` (``input.scale``), the softmax scale ``attention_multiplier`` (in place of
    head_dim^-1/2), every residual branch times ``residual_multiplier`` (each block's ``residual_scale``)
    and the logits divided by ``logits_scaling`` (``head.scale`` = its inverse)."""

    ALIASES: dict[str, str] = {}
    model_types = ("granite",)
    causal_lm = {"granite": "GraniteForCausalLM"}
    export_order = None

    rows = (
        Row(("granite",),
            "llama's layers (biases with `attention_bias`, `mlp_bias`) with its multipliers: "
            "`embedding_multiplier` as `input.scale`, `attention_multiplier` as the softmax `scale`, "
            "`residual_multiplier` as each block's `residual_scale`, `logits_scaling` as `head.scale` (its inverse)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        scale = config.number("attention_multiplier", self.default_attention_multiplier(config), positive=True)
        residual = config.number("residual_multiplier", 1.0)
        blocks = [{**block, "mixer": {**block["mixer"], "scale": scale},
                   "mlp": self.mlp_node(config, block["mlp"], model_type), **self.block_fields(config),
                   **({"residual_scale": residual} if residual != 1.0 else {})} for block in blocks]
        common = common_fields(config)
        common["input"]["scale"] = config.number("embedding_multiplier", 1.0, positive=True)
        head = {**head_node(config, False), "scale": self.head_scale(config)}
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps), "head": head}

    def default_attention_multiplier(self, config: Config) -> float:
        """The softmax scale where ``attention_multiplier`` is unset (Granite's config class: 1)."""
        return 1.0

    def block_fields(self, config: Config) -> dict:
        """Block fields a member sets in every block (none for Granite)."""
        return {}

    def head_scale(self, config: Config) -> float:
        """The logits' multiplier: Granite divides them by ``logits_scaling``."""
        return 1.0 / config.number("logits_scaling", 1.0, positive=True)

    def mlp_node(self, config: Config, dense: dict, model_type: str) -> dict:
        """A block's MLP (the Llama MLP ``dense``; a member with experts gives its own)."""
        return dense

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        if len({block.mixer.scale for block in blocks}) != 1 or len({block.scales() for block in blocks}) != 1:
            raise NotExpressible("granite has one softmax scale and one residual multiplier")
        (skip, residual), (mlp_skip, mlp_residual) = blocks[0].scales()
        if skip != 1.0 or mlp_skip != 1.0 or residual != mlp_residual:
            raise NotExpressible("granite multiplies both residual branches alike and keeps the skip")
        return {**super().config(spec, "llama"), "attention_multiplier": blocks[0].mixer.scale,
                "residual_multiplier": residual, "embedding_multiplier": spec.input.scale,
                "logits_scaling": 1.0 / spec.head.scale}


ARCHITECTURES = (Granite(),)
