"""transformers' ``ministral`` and ``cwm`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits



class LayerTypedWindows(LlamaFamily):
    """Ministral and CWM: Llama's layers and weights with ``sliding_window`` on the layers ``layer_types``
    names ``sliding_attention`` (by default every layer for Ministral where a window is set, all but every
    fourth from the first for CWM); CWM's MLP takes biases with ``mlp_bias``."""

    ALIASES: dict[str, str] = {}
    model_types = ("ministral", "cwm")
    causal_lm = {"ministral": "MinistralForCausalLM", "cwm": "CwmForCausalLM"}
    export_order = None

    rows = (
        Row(("ministral", "cwm"),
            "llama's layers with `sliding_window` as the `window` of the `sliding_attention` layers of "
            "`layer_types` (biases: CWM's MLP with `mlp_bias`)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        window = config.count("sliding_window", None)
        default = (["sliding_attention" if window is not None else "full_attention"] * layers
                   if model_type == "ministral" else
                   ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)])
        types = config.attention_layer_types(layers, default)
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        if sliding and window is None:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set", sliding)
        blocks, eps = self.layer_blocks(config, "llama", [window if t == "sliding_attention" else None for t in types])
        if model_type == "ministral":  # no biases: Ministral's projections and MLP take none
            for field in ("attention_bias", "mlp_bias"):
                if config.get(field, bool, False):
                    raise config.refuse(field, "ministral's layers take no biases")
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [block.mixer for block in blocks]
        if any(m.kind != "softmax" or m.position is None or m.position.kind != "rope" or m.qk_norm != "none"
               or m.position != mixers[0].position or m.out_bias for m in mixers):
            raise NotExpressible(f"{model_type} is bias-free softmax attention with one RoPE in every block")
        windows = [getattr(m, "window", None) for m in mixers]
        if len({w for w in windows if w is not None}) > 1:
            raise NotExpressible(f"{model_type} has one sliding window")
        config = {**self.shared_fields(spec, mixers[0]),
                  "sliding_window": next((w for w in windows if w is not None), None),
                  "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows]}
        return {**config, "mlp_bias": blocks[0].mlp.bias} if model_type == "cwm" else config


ARCHITECTURES = (LayerTypedWindows(),)
