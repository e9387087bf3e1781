"""transformers' ``exaone4`` model type (LG's EXAONE 4.0) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row, rope_config
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.olmo2 import Olmo2


class Exaone4(Olmo2):
    """EXAONE 4.0: OLMo 2's placement (x + norm(f(x))) with QK-norm per head, no biases, and, where
    ``sliding_window`` is set, a window on the layers ``layer_types`` names sliding (by default all but every
    ``sliding_window_pattern``-th) with RoPE on those layers only: the global layers have no positions (NoPE)."""

    model_types = ("exaone4",)
    causal_lm = {"exaone4": "Exaone4ForCausalLM"}
    QK_NORM = "rmsnorm"

    rows = (
        Row(("exaone4",),
            "olmo2's placement with QK-norm per head; with `sliding_window`, windowed RoPE layers per `layer_types` "
            "and global layers without positions",
            "as llama"),
    )

    def layer_types(self, config: Config, model_type: str, layers: int) -> tuple[list[str], int | None]:
        window = config.count("sliding_window", None)
        pattern = config.get("sliding_window_pattern", (int, str), 4)
        if window is None or not pattern:
            default = ["full_attention"] * layers
        elif isinstance(pattern, int):
            default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        else:  # "LLLG": local (sliding) and global layers, repeated
            if set(pattern) - {"L", "G"}:
                raise config.refuse("sliding_window_pattern", f"{pattern!r}: a pattern of L (local) and G (global)")
            default = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                       for i in range(layers)]
        return config.attention_layer_types(layers, default), window

    def position(self, config: Config, head_dim: int, layer_type: str, window: int | None) -> dict:
        if window is None or layer_type == "sliding_attention":
            return config.rope(head_dim)
        return {"kind": "none"}

    def attention_config(self, spec, model_type: str, blocks) -> dict:
        mixers = [block.mixer for block in blocks]
        windows = [getattr(m, "window", None) for m in mixers]
        window = next((w for w in windows if w is not None), None)
        rotary = [m.position is not None and m.position.kind == "rope" for m in mixers]
        if any(w not in (None, window) for w in windows) or any(m.qkv_bias or m.out_bias for m in mixers) \
                or rotary != [window is None or w is not None for w in windows] \
                or len({rope_config(m.position)["rope_theta"] for m, r in zip(mixers, rotary) if r}) > 1 \
                or len({str(rope_config(m.position)) for m, r in zip(mixers, rotary) if r}) != 1:
            raise NotExpressible("exaone4 has one window, no biases, and one RoPE on its windowed layers (every "
                                 "layer without windows) and none on the others")
        first = mixers[0]
        rope = next(rope_config(m.position) for m, r in zip(mixers, rotary) if r)
        return {"hidden_size": spec.d_model, **self.mlp_config(blocks), "num_hidden_layers": len(blocks),
                "num_attention_heads": first.heads, "num_key_value_heads": first.kv_heads or first.heads,
                "head_dim": first.d_qk, "hidden_act": ACTIVATION_NAMES[blocks[0].mlp.activation],
                "rms_norm_eps": first.norm_eps, "sliding_window": window, "rope_parameters": rope,
                "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows]}


ARCHITECTURES = (Exaone4(),)
