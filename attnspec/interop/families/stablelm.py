"""transformers' ``stablelm`` model type (StableLM 2, StableLM-3B-4E1T) as attnspec specs, and back (what a
family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, common_fields, compress_layers, expanded_blocks,
                                           head_node, rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class StableLm(LlamaFamily):
    """StableLM: Llama's attention (q/k/v biases with ``use_qkv_bias``, none on the output; RoPE on the first
    ``partial_rotary_factor`` of each head, a quarter by default) and GLU MLP under LayerNorms with biases; with
    ``use_parallel_residual`` the two side by side on the one input norm (``parallel: shared_norm``)."""

    ALIASES: dict[str, str] = {}
    model_types = ("stablelm",)
    causal_lm = {"stablelm": "StableLmForCausalLM"}
    export_order = None
    ROTARY_FRACTION = 0.25

    rows = (
        Row(("stablelm",),
            "llama's attention (q/k/v biases with `use_qkv_bias`, partial RoPE) and GLU MLP under biased LayerNorms, "
            "side by side on one norm with `use_parallel_residual` (`parallel: shared_norm`)",
            "LayerNorms of q and k per head (`qk_layernorm`); heads x head_dim other than hidden_size; as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("qk_layernorm", bool, False):
            raise config.refuse("qk_layernorm", "a LayerNorm of each head's q and k, each head its own: attnspec's "
                                                "QK-norm is an RMSNorm shared by the heads")
        blocks, _ = self.layer_blocks(config, "llama")
        mixer = blocks[0]["mixer"]
        if mixer["heads"] * mixer["d_v"] != config.count("hidden_size"):
            raise config.refuse("num_attention_heads", "StableLM's output projection takes hidden_size channels: "
                                                       "heads x head_dim must be hidden_size")
        bias = config.get("use_qkv_bias", bool, False)
        mixer = {**mixer, "qkv_bias": bias, "out_bias": False}
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_eps", 1e-5, positive=True)}
        parallel = {"parallel": "shared_norm"} if config.get("use_parallel_residual", bool, False) else {}
        blocks = [{**block, "mixer": mixer, "norm": norm, **parallel} for block in blocks]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": norm,
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        if any(b.parallel != first.parallel or b.norm != first.norm for b in blocks) or first.parallel == "own_norms" \
                or spec.final_norm != first.norm or first.norm.kind != "layernorm" or not first.norm.bias \
                or first.mixer.out_bias or first.mixer.heads * first.mixer.d_v != spec.d_model:
            raise NotExpressible("stablelm is LayerNormed blocks without an output bias, parallel on one norm or not")
        config = super().config(spec, "llama")
        for field in ("rms_norm_eps", "mlp_bias", "attention_bias"):
            config.pop(field, None)
        return {**config, "layer_norm_eps": first.norm.eps, "use_qkv_bias": first.mixer.qkv_bias,
                "use_parallel_residual": first.parallel == "shared_norm", "qk_layernorm": False}

    def links(self, spec) -> list[Link]:
        links = [link for link in super().links(spec)
                 if not link.theirs.endswith("layernorm.weight") and link.theirs != "model.norm.weight"]
        links += [rename(f"model.norm.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            norms = [("input_layernorm", "norm1")]
            if block.parallel == "none":
                norms.append(("post_attention_layernorm", "norm2"))
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in norms for p in ("weight", "bias")]
        return links


ARCHITECTURES = (StableLm(),)
