"""transformers' ``helium`` model type (Kyutai's Helium) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Helium(LlamaFamily):
    """Helium: Llama's layers with RoPE on interleaved pairs (2i, 2i + 1), q/k/v biases with ``attention_bias``
    and none on the output projection, which maps ``hidden_size`` to ``hidden_size`` (so heads x head_dim must
    be the width). Its norms multiply by their weight in float32 before rounding, Llama's after: equal in a
    float32 model, one rounding apart in bfloat16."""

    ALIASES: dict[str, str] = {}
    model_types = ("helium",)
    causal_lm = {"helium": "HeliumForCausalLM"}
    export_order = None

    rows = (
        Row(("helium",),
            "llama's layers with RoPE on interleaved pairs (`interleaved: true`), q/k/v biases (`attention_bias`) "
            "and none on the output",
            "heads x head_dim other than hidden_size (transformers' output projection is hidden_size wide); as "
            "llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        mixer = blocks[0]["mixer"]
        if mixer["heads"] * mixer["d_v"] != config.count("hidden_size"):
            raise config.refuse("head_dim", f"{mixer['heads']} heads of {mixer['d_v']} channels are not "
                                            f"hidden_size wide, which Helium's output projection takes")
        mixer = {**mixer, "out_bias": False, "position": {**mixer["position"], "interleaved": True}}
        return self.assembled(config, [{**block, "mixer": mixer} for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0].mixer
        if any(block.mixer.out_bias or not getattr(block.mixer.position, "interleaved", False)
               or block.mixer.heads * block.mixer.d_v != spec.d_model for block in blocks):
            raise NotExpressible("helium has interleaved RoPE, no output bias and heads x head_dim = hidden_size")
        return {**super().config(spec, "llama"), "attention_bias": first.qkv_bias}


ARCHITECTURES = (Helium(),)
