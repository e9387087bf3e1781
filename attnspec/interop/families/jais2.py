"""transformers' ``jais2`` model type (Inception's Jais 2) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, common_fields, compress_layers, expanded_blocks, head_node
from attnspec.interop.architecture import mlp_links as plain_mlp_links
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.interop.families.starcoder2 import Starcoder2


class Jais2(Starcoder2):
    """Jais 2: Llama's attention (biases with ``attention_bias``) and a plain MLP (``up_proj``, squared ReLU,
    ``down_proj``, biases with ``mlp_bias``) under LayerNorms with biases (``layer_norm_eps``); StarCoder2's
    LayerNorm links."""

    model_types = ("jais2",)
    causal_lm = {"jais2": "Jais2ForCausalLM"}

    rows = (
        Row(("jais2",),
            "llama's attention (biases with `attention_bias`) and a plain MLP (`mlp: {kind: mlp}`, squared ReLU, "
            "biases with `mlp_bias`) under LayerNorms with biases (`eps` = layer_norm_eps)",
            "as llama"),
    )

    EPS_FIELD = "layer_norm_eps"
    """The config field of the LayerNorms' eps."""

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, _ = self.layer_blocks(config, "llama")
        norm = {"kind": "layernorm", "eps": config.number(self.EPS_FIELD, 1e-5, positive=True)}
        mlp = {**blocks[0]["mlp"], "kind": "mlp", "activation": config.activation(default="relu2")}
        blocks = [{**block, "mlp": mlp, "norm": norm} for block in blocks]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": norm,
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        if any(b.norm.kind != "layernorm" or b.mlp.kind != "mlp" or b.mixer.qkv_bias != b.mixer.out_bias
               or getattr(b.mixer, "window", None) is not None for b in blocks) \
                or spec.final_norm.kind != "layernorm":
            raise NotExpressible(f"{model_type} is LayerNormed attention (biases alike) and a plain MLP, without "
                                 "windows")
        config = LlamaFamily.config(self, spec, "llama")
        config.pop("rms_norm_eps")
        return {**config, self.EPS_FIELD: first.norm.eps}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return plain_mlp_links(theirs, ours, mlp.bias)


ARCHITECTURES = (Jais2(),)
