"""transformers' ``ernie4_5`` model type (Baidu's dense ERNIE 4.5) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Ernie4_5(LlamaFamily):
    """ERNIE 4.5: Llama's layers with RoPE on interleaved pairs (2i, 2i + 1), rotated in float32 (as attnspec
    rotates), and one ``use_bias`` for every projection of attention and the MLP."""

    ALIASES: dict[str, str] = {}
    model_types = ("ernie4_5",)
    causal_lm = {"ernie4_5": "Ernie4_5ForCausalLM"}
    export_order = None

    rows = (
        Row(("ernie4_5",),
            "llama's layers with RoPE on interleaved pairs (`interleaved: true`) and biases on every projection "
            "with `use_bias`",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        return self.assembled(config, *self.ernie_blocks(config))

    def ernie_blocks(self, config: Config) -> tuple[list[dict], float]:
        """Each layer's block (its dense MLP) and the norms' eps."""
        blocks, eps = self.layer_blocks(config, "llama")
        bias = config.get("use_bias", bool, False)
        mixer = blocks[0]["mixer"]
        mixer = {**mixer, "qkv_bias": bias, "out_bias": bias, "position": {**mixer["position"], "interleaved": True}}
        mlp = {**blocks[0]["mlp"], "bias": bias}
        return [{**block, "mixer": mixer, "mlp": mlp} for block in blocks], eps

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        bias = blocks[0].mixer.qkv_bias
        dense = [block.mlp for block in blocks if block.mlp.kind != "moe"]
        if any(not getattr(block.mixer.position, "interleaved", False) or block.mixer.qkv_bias != bias
               or block.mixer.out_bias != bias for block in blocks) \
                or any(mlp.kind != "glu" or mlp.bias != bias or mlp != dense[0] for mlp in dense):
            raise NotExpressible(f"{model_type} has interleaved RoPE and one bias setting for every projection")
        config = LlamaFamily.config(self, spec, "llama")
        for field in ("attention_bias", "mlp_bias"):
            config.pop(field, None)
        if dense:
            config["intermediate_size"] = dense[0].hidden
        return {**config, "use_bias": bias}


ARCHITECTURES = (Ernie4_5(),)
