"""transformers' ``apertus`` and ``apertus1p5_text`` model types (the Swiss AI Apertus models) as attnspec specs,
and back (what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, mlp_links, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Apertus(LlamaFamily):
    """Apertus: Qwen3's attention (QK-norm before RoPE, llama3 RoPE scaling by default) and a plain MLP without
    biases whose activation is xIELU (`activation: xielu`, its two learnt numbers per layer and its fixed β and
    ε read from the weights) or another of attnspec's; the norms named ``attention_layernorm`` and
    ``feedforward_layernorm``. Apertus 1.5's text model is the same."""

    ALIASES: dict[str, str] = {}
    model_types = ("apertus", "apertus1p5_text")
    causal_lm = {"apertus": "ApertusForCausalLM", "apertus1p5_text": "Apertus1p5TextForCausalLM"}
    export_order = ("apertus", "apertus1p5_text")
    """Both types state the same spec: apertus is written unless ``--model-type`` names the other."""
    NORM_NAMES = ("attention_layernorm", "feedforward_layernorm")
    ACTIVATIONS = ("xielu", "silu", "gelu", "gelu_tanh", "relu", "relu2")

    rows = (
        Row(("apertus", "apertus1p5_text"),
            "qwen3's attention and a plain MLP without biases (`mlp: {kind: mlp}`) of `hidden_act` xIELU "
            "(`activation: xielu`: α_p, α_n learnt per layer, β and ε as the weights hold them) or another",
            "as llama"),
    )

    def layer_mlp(self, config: Config, model_type: str) -> dict:
        if config.get("mlp_bias", bool, False):
            raise config.refuse("mlp_bias", "Apertus's MLP takes no biases; false imports")
        return {"kind": "mlp", "hidden": config.count("intermediate_size"), "bias": False,
                "activation": config.activation(allowed=self.ACTIVATIONS, default="xielu")}

    def spec(self, config: Config, model_type: str) -> dict:
        return super().spec(config, "qwen3")

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mlp = blocks[0].mlp
        if any(b.mlp.kind != "mlp" or b.mlp.bias or b.mlp != mlp or b.mixer.qk_norm != "rmsnorm"
               or b.mixer.qk_norm_after_rope or getattr(b.mixer, "window", None) for b in blocks):
            raise NotExpressible(f"{model_type} has QK-norm attention without windows and the same plain MLP without "
                                 "biases in every block")
        config = super().config(spec, "qwen3")
        for field in ("use_sliding_window", "sliding_window", "layer_types"):
            config.pop(field, None)
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        links = mlp_links(theirs, ours, False)
        if mlp.activation == "xielu":
            links += [rename(f"{theirs}act_fn.{name}", f"{ours}activation.{name}")
                      for name in ("alpha_p", "alpha_n", "beta", "eps")]
        return links


ARCHITECTURES = (Apertus(),)
