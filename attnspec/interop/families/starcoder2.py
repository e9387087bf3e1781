"""transformers' ``starcoder2`` model type (StarCoder2) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, common_fields, compress_layers, expanded_blocks,
                                           head_node, rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily

class Starcoder2(LlamaFamily):
    """StarCoder2: softmax attention (GQA, RoPE, a window in every layer where ``sliding_window`` is set) and
    a plain MLP (``c_fc``, ``hidden_act``, ``c_proj``), every projection biased with ``use_bias``, under
    LayerNorms with biases; a tied head by default."""

    ALIASES: dict[str, str] = {}
    model_types = ("starcoder2",)
    causal_lm = {"starcoder2": "Starcoder2ForCausalLM"}
    export_order = None

    rows = (
        Row(("starcoder2",),
            "softmax attention (GQA, RoPE, a `window` in every layer where `sliding_window` is set) and a plain MLP "
            "(`mlp: {kind: mlp}`, tanh-GeLU), biased with `use_bias`, under LayerNorms with biases (`eps` = "
            "norm_epsilon)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers")
        blocks, _ = self.layer_blocks(config, "llama", [config.count("sliding_window", None)] * layers)
        bias = config.get("use_bias", bool, True)
        mlp = {"kind": "mlp", "hidden": config.count("intermediate_size"), "bias": bias,
               "activation": config.activation(default="gelu_pytorch_tanh")}
        norm = {"kind": "layernorm", "eps": config.number("norm_epsilon", 1e-5, positive=True)}
        blocks = [{**block, "mixer": {**block["mixer"], "qkv_bias": bias, "out_bias": bias}, "mlp": mlp, "norm": norm}
                  for block in blocks]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": norm,
                "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        windows = {getattr(block.mixer, "window", None) for block in blocks}
        biases = {(b.mixer.qkv_bias, b.mixer.out_bias, b.mlp.bias) for b in blocks if b.mlp.kind == "mlp"}
        layered = all(b.norm.kind == "layernorm" and b.mlp.kind == "mlp" for b in blocks)
        if not layered or spec.final_norm.kind != "layernorm" or len(windows) != 1 or len(biases) != 1 \
                or len(set(biases.pop())) != 1:
            raise NotExpressible("starcoder2 is LayerNormed attention and a plain MLP, biased alike, one window")
        window = windows.pop()
        config = super().config(spec, "llama" if window is None else "mistral")
        for field in ("rms_norm_eps", "attention_bias", "mlp_bias"):
            config.pop(field, None)
        return {**config, "use_bias": blocks[0].mlp.bias, "norm_epsilon": blocks[0].norm.eps, "sliding_window": window}

    def links(self, spec) -> list[Link]:
        links = [*super().links(spec), rename("model.norm.bias", "final_norm.bias")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += [rename(f"{theirs}input_layernorm.bias", f"{ours}norm1.bias"),
                      rename(f"{theirs}post_attention_layernorm.bias", f"{ours}norm2.bias")]
        return links

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        names = [("c_fc", "up"), ("c_proj", "down")]
        kinds = ("weight", "bias")[:1 + mlp.bias]
        return [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in names for p in kinds]


ARCHITECTURES = (Starcoder2(),)
