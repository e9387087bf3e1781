"""transformers' ``smollm3`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily



class SmolLM3(LlamaFamily):
    """SmolLM3: Llama's layers and weights, where the layers ``no_rope_layers`` marks 0 (by default every
    ``no_rope_layer_interval``-th) have no positions (NoPE), and with ``use_sliding_window`` the
    ``sliding_attention`` layers of ``layer_types`` a window."""

    ALIASES: dict[str, str] = {}
    model_types = ("smollm3",)
    causal_lm = {"smollm3": "SmolLM3ForCausalLM"}
    export_order = None

    rows = (
        Row(("smollm3",),
            "llama's layers, without positions (`position: {kind: none}`) where `no_rope_layers` is 0 (by default "
            "every `no_rope_layer_interval`-th layer), and with `use_sliding_window` a `window` on the "
            "`sliding_attention` layers of `layer_types`",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        layers = len(blocks)
        interval = config.count("no_rope_layer_interval", 4)
        roped = config.get("no_rope_layers", list, [int((i + 1) % interval != 0) for i in range(layers)])
        if len(roped) != layers or any(flag not in (0, 1) or isinstance(flag, float) for flag in roped):
            raise config.refuse("no_rope_layers", f"must list 1 (RoPE) or 0 (none) for each of the {layers} layers")
        windowed = config.get("use_sliding_window", bool, False)
        window = config.count("sliding_window", None)
        default = ["sliding_attention" if windowed and window is not None and not rope else "full_attention"
                   for rope in roped]
        types = config.attention_layer_types(layers, default)
        sliding = [i for i, t in enumerate(types) if windowed and t == "sliding_attention"]
        if sliding and window is None:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set", sliding)
        for index, block in enumerate(blocks):
            mixer = dict(block["mixer"])
            if not roped[index]:
                mixer["position"] = {"kind": "none"}
            if index in sliding:
                mixer["window"] = window
            block["mixer"] = mixer
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [block.mixer for block in blocks]
        if any(m.kind != "softmax" or m.qk_norm != "none" for m in mixers) or \
                any(block.norm_placement != "pre" for block in blocks):
            raise NotExpressible("smollm3 is softmax attention without QK-norm in pre-norm blocks")
        roped = [m.position is not None and m.position.kind == "rope" for m in mixers]
        rotated = [m for m, rope in zip(mixers, roped) if rope]
        if not rotated or any(m.position != rotated[0].position for m in rotated):
            raise NotExpressible("smollm3's RoPE layers share one rotation")
        windows = [getattr(m, "window", None) for m in mixers]
        if len({w for w in windows if w is not None}) > 1:
            raise NotExpressible("smollm3 has one sliding window")
        window = next((w for w in windows if w is not None), None)
        return {**self.shared_fields(spec, rotated[0]), "attention_bias": mixers[0].out_bias,
                "mlp_bias": blocks[0].mlp.bias, "no_rope_layers": [int(r) for r in roped],
                "use_sliding_window": window is not None, "sliding_window": window,
                "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows]}


ARCHITECTURES = (SmolLM3(),)
