"""transformers' ``openai-gpt`` model type (the first GPT) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.gpt2 import Gpt2


class OpenAIGpt(Gpt2):
    """GPT (2018): GPT-2's layers with each LayerNorm after its residual sum (``norm_placement: post``, no final
    norm), the softmax scale head_dim^-1/2 always, and ``afn``'s activation (its ``gelu`` is the tanh
    approximation)."""

    model_types = ("openai-gpt",)
    causal_lm = {"openai-gpt": "OpenAIGPTLMHeadModel"}
    export_order = None
    config_fields = {"openai-gpt": Gpt2.FIELDS}
    stored_names = {"openai-gpt": ((r"^transformer\.wte\.", "transformer.tokens_embed."),
                                   (r"^transformer\.wpe\.", "transformer.positions_embed."))}
    SCALED_BY_LAYER = False
    PLACEMENT = "post"
    AFN = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
    """``afn`` -> attnspec's activation (transformers' ACT_FNS of this model: its gelu is gelu_new)."""

    rows = (
        Row(("openai-gpt",),
            "gpt2's layers with each LayerNorm after its residual sum (`norm_placement: post`, no final norm)",
            "activations other than `afn`'s gelu, relu, silu"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        return super().spec(Config({**config.data, "scale_attn_weights": True}, config.source), model_type)

    def scaled_by_layer(self, config: Config) -> bool:
        return False

    def activation(self, config: Config) -> str:
        afn = config.get("afn", str, "gelu")
        if afn not in self.AFN:
            raise config.refuse("afn", f"activation {afn!r}: attnspec has {', '.join(self.AFN)} of this model's")
        return self.AFN[afn]

    def activation_fields(self, activation: str) -> dict:
        names = {ours: afn for afn, ours in reversed(self.AFN.items())}
        if activation not in names:
            raise NotExpressible(f"openai-gpt has no {activation} activation")
        return {"afn": names[activation]}

    def config(self, spec, model_type: str) -> dict:
        config = super().config(spec, model_type)
        if not config.pop("scale_attn_weights"):
            raise NotExpressible("openai-gpt scales its scores by head_dim^-1/2")
        return config


ARCHITECTURES = (OpenAIGpt(),)
