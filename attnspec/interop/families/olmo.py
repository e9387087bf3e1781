"""transformers' ``olmo`` model type (OLMo 1) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, common_fields, compress_layers, expanded_blocks, head_node
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily

NORM = {"kind": "layernorm", "eps": 1e-5, "affine": False}
"""OLMo 1's LayerNorm: no weight, no bias, eps 1e-5."""


class Olmo(LlamaFamily):
    """OLMo 1: Llama's attention (biases with ``attention_bias``) and GLU under LayerNorms without weights or
    biases (``affine: false``)."""

    ALIASES: dict[str, str] = {}
    model_types = ("olmo",)
    causal_lm = {"olmo": "OlmoForCausalLM"}
    export_order = None

    rows = (
        Row(("olmo",),
            "llama's attention and GLU under LayerNorms without weights or biases (`affine: false`)",
            "`clip_qkv` (q, k and v clamped: no attnspec part); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.number("clip_qkv", None) is not None:
            raise config.refuse("clip_qkv", "attnspec's attention does not clamp q, k and v; null imports")
        blocks, _ = self.layer_blocks(config, "llama")
        blocks = [{**block, "norm": NORM} for block in blocks]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": NORM,
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        norms = {block.norm.model_dump_json() for block in expanded_blocks(spec)} | {spec.final_norm.model_dump_json()}
        if norms != {spec.final_norm.model_dump_json()} or spec.final_norm.kind != "layernorm" \
                or spec.final_norm.affine or spec.final_norm.eps != NORM["eps"]:
            raise NotExpressible("olmo's norms are LayerNorms of eps 1e-5 without weights or biases")
        config = super().config(spec, "llama")
        for field in ("rms_norm_eps", "mlp_bias"):
            config.pop(field, None)
        return {**config, "clip_qkv": None}

    def links(self, spec) -> list[Link]:  # its norms have no tensors
        return [link for link in super().links(spec) if "norm" not in link.ours[0]]


ARCHITECTURES = (Olmo(),)
