"""transformers' ``bitnet`` model type (Microsoft's BitNet b1.58, unquantised) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, block_prefix, expanded_blocks, rename, rmsnorm_node
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class BitNet(LlamaFamily):
    """BitNet: Llama with a sub-layer norm inside each sub-layer, an RMSNorm of the attention's output over every head
    before the output projection (`group_norm` with `norm_span: full`) and of the MLP's hidden before its down
    projection (`inner_norm`), and a squared-ReLU GLU. Its released checkpoints quantise the linear maps (ternary
    weights, 8-bit activations: `quantization_config`), which is refused; the model transformers builds from a
    config without one computes in full precision, and that is what imports."""

    ALIASES: dict[str, str] = {}
    model_types = ("bitnet",)
    causal_lm = {"bitnet": "BitNetForCausalLM"}
    export_order = None

    rows = (
        Row(("bitnet",),
            "llama with BitNet's sub-layer norms: an RMSNorm of the attention's output over every head before `o_proj` "
            "(`group_norm: true`, `norm_span: full`) and of the MLP's hidden before `down_proj` (`inner_norm: "
            "rmsnorm`), a GLU of `hidden_act` (squared ReLU)",
            "a `quantization_config` (the released BitNet b1.58 checkpoints' ternary weights and 8-bit activations: "
            "attnspec's linear maps are not quantised); `head_dim` x heads other than hidden_size; as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        mixer = blocks[0]["mixer"]
        if mixer["heads"] * mixer["d_v"] != config.count("hidden_size"):
            raise config.refuse("head_dim", f"BitNet normalises the attention's output with a norm of hidden_size, "
                                            f"which {mixer['heads']} heads of {mixer['d_v']} do not fill")
        mixer = {**mixer, "group_norm": True, "norm_span": "full"}
        mlp = {**blocks[0]["mlp"], "activation": config.activation(default="relu2"), "inner_norm": rmsnorm_node(eps)}
        return self.assembled(config, [{**block, "mixer": mixer, "mlp": mlp} for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        if any(not b.mixer.group_norm or b.mixer.norm_span != "full" or b.mlp.kind != "glu"
               or b.mlp.inner_norm.kind != "rmsnorm" or getattr(b.mixer, "window", None) for b in blocks):
            raise NotExpressible("bitnet has attention normalised over every head before o_proj without windows and a "
                                 "GLU with an RMSNorm before down_proj in every block")
        config = super().config(spec, "llama")
        config.pop("mlp_bias")
        return config

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        for index, _ in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += [rename(f"{theirs}self_attn.attn_sub_norm.weight", f"{ours}mixer.norm_weight"),
                      rename(f"{theirs}mlp.ffn_sub_norm.weight", f"{ours}mlp.inner_norm.weight")]
        return links


ARCHITECTURES = (BitNet(),)
