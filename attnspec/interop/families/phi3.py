"""transformers' ``phi3`` model type (Phi-3, Phi-3.5, Phi-4-mini) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Phi3(LlamaFamily):
    """Phi-3: Llama's layers with q, k, v packed in one ``qkv_proj`` and the GLU's gate and up in one
    ``gate_up_proj`` (gate first), partial RoPE (``partial_rotary_factor``) and a window in every layer
    where ``sliding_window`` is set."""

    ALIASES: dict[str, str] = {}
    model_types = ("phi3",)
    causal_lm = {"phi3": "Phi3ForCausalLM"}
    export_order = None

    rows = (
        Row(("phi3",),
            "llama's layers from packed projections (`qkv_proj`, `gate_up_proj`), partial RoPE "
            "(`partial_rotary_factor`), a `window` in every layer where `sliding_window` is set",
            "RoPE scaling `longrope` (Phi-3's long-context releases); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers")
        blocks, eps = self.layer_blocks(config, "llama", [config.count("sliding_window", None)] * layers)
        if any(block["mixer"]["qkv_bias"] or block["mlp"]["bias"] for block in blocks):
            raise config.refuse("attention_bias" if blocks[0]["mixer"]["qkv_bias"] else "mlp_bias",
                                "Phi-3's projections take no biases")
        return self.assembled(config, blocks, eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        windows = {getattr(block.mixer, "window", None) for block in blocks}
        if len(windows) != 1:
            raise NotExpressible("phi3 has one sliding window in every layer, or none")
        window = windows.pop()
        config = super().config(spec, "llama" if window is None else "mistral")
        if config.pop("attention_bias") or config.pop("mlp_bias", False):
            raise NotExpressible("phi3's projections take no biases")
        position = blocks[0].mixer.position
        return {**config, "sliding_window": window, "partial_rotary_factor": position.rotary_fraction}

    def projection_links(self, mixer, theirs: str, ours: str) -> list[Link]:
        return [Link(f"{theirs}qkv_proj.weight", tuple(f"{ours}{n}_proj.weight" for n in "qkv")),
                rename(f"{theirs}o_proj.weight", f"{ours}out_proj.weight")]

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        # gate_up_proj = [gate; up]: transformers' activated half is attnspec's `up`
        return [Link(f"{theirs}gate_up_proj.weight", (f"{ours}up.weight", f"{ours}gate.weight")),
                rename(f"{theirs}down_proj.weight", f"{ours}down.weight")]


ARCHITECTURES = (Phi3(),)
