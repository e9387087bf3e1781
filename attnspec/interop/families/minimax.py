"""transformers' ``minimax`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Copy, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, head_node, lm_links, moe_links, rename,
                                           rmsnorm_node, rope_config, w123_links)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits

if TYPE_CHECKING:
    from torch import Tensor


class MiniMax(Architecture):
    """MiniMax-01/M1: lightning attention layers (linear attention with SiLU on q, k and v, a fixed decay
    per head from ALiBi's slopes scaled down with depth and stored as buffers, no normaliser, an RMSNorm
    over the whole output width, then a sigmoid output gate) and softmax attention layers (GQA, RoPE, an
    optional window), each followed by a Mixtral-style mixture of GLU experts. Every sub-layer keeps the
    normalised input as its skip, α norm(x) + β f(norm(x)), with α and β per kind of sub-layer."""

    model_types = ("minimax",)
    causal_lm = {"minimax": "MiniMaxForCausalLM"}
    DECAYS = ("query_decay", "key_decay", "diagonal_decay")
    """Buffers computed from the slopes (the blocked form's factors): transformers' chunked loop reads
    them, attnspec computes every mode from the slopes."""

    rows = (
        Row(("minimax",),
            "lightning attention layers (the `linear` mixer with `feature_map: silu`, `value_activation: silu`, no "
            "normaliser, a fixed decay per head from ALiBi's slopes kept as a buffer, `transition: {kind: fixed, "
            "init: alibi, learnable: false}`, its slopes read from the checkpoint; an RMSNorm over the whole output "
            "width, `norm_span: full`, and a sigmoid gate) and GQA softmax attention layers (RoPE, `sliding_window`),"
            " each with Mixtral-named experts; every block keeps the normalised input as its skip (`norm_placement: "
            "normed_residual`) with the config's α and β per kind of sub-layer as `skip_scale` and `residual_scale`",
            "`router_jitter_noise` (attnspec's experts take no jitter); activations other than silu"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        types = config.layer_types(layers, ["full_attention" if i % 2 else "linear_attention" for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention or full_attention", unknown)
        if config.number("router_jitter_noise", 0.0):
            raise config.refuse("router_jitter_noise", "attnspec's experts take no multiplicative jitter in training")
        heads, kv_heads, head_dim = config.attention_heads()
        act = config.activation(allowed=("silu",))  # lightning attention's q/k/v activation too
        window = config.count("sliding_window", None)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                     "position": config.rope(head_dim), **({"kv_heads": kv_heads} if kv_heads != heads else {}),
                     **({"window": window} if window is not None else {})}
        lightning = {"kind": "linear", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "feature_map": act,
                     "value_activation": act, "normalize": False, "position": {"kind": "none"},
                     "transition": {"kind": "fixed", "init": "alibi", "learnable": False},
                     "group_norm": True, "norm_span": "full", "output_gate": "sigmoid"}
        moe = {"kind": "moe", "experts": config.count("num_local_experts", 8, limit=limits.MAX_EXPERTS),
               "top_k": config.count("num_experts_per_tok", 2), "hidden": config.count("intermediate_size"),
               "activation": act}
        mlp_alpha, mlp_beta = (config.number(f"mlp_{f}_factor", 1.0) for f in ("alpha", "beta"))
        blocks = []
        for layer_type in types:
            kind = "linear_attn" if layer_type == "linear_attention" else "full_attn"
            alpha, beta = (config.number(f"{kind}_{f}_factor", 1.0) for f in ("alpha", "beta"))
            for field, value in ((f"{kind}_alpha_factor", alpha), (f"{kind}_beta_factor", beta),
                                 ("mlp_alpha_factor", mlp_alpha), ("mlp_beta_factor", mlp_beta)):
                if not 0 < value <= 1e4:
                    raise config.refuse(field, f"must be in (0, 10000] (an attnspec skip or residual scale), "
                                        f"got {shorten(value)}")
            blocks.append({"mixer": lightning if layer_type == "linear_attention" else attention, "mlp": moe,
                           "norm": rmsnorm_node(eps), "norm_placement": "normed_residual",
                           "skip_scale": residual_scales(alpha, mlp_alpha),
                           "residual_scale": residual_scales(beta, mlp_beta)})
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if (any(b.mixer.kind not in ("softmax", "linear") or b.mlp.kind != "moe" for b in blocks)
                or attention is None or attention.position.kind != "rope"):
            raise NotExpressible("minimax has lightning and softmax attention layers (with RoPE), each with experts")
        moe = blocks[0].mlp
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "layer_types": ["linear_attention" if b.mixer.kind == "linear" else "full_attention" for b in blocks],
                  "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                  "head_dim": attention.d_qk, "sliding_window": getattr(attention, "window", None),
                  "rope_parameters": rope_config(attention.position),
                  "hidden_act": ACTIVATION_NAMES[moe.activation],
                  "num_local_experts": moe.experts, "num_experts_per_tok": moe.top_k, "intermediate_size": moe.hidden}
        if attention.position.rotary_fraction != 1.0:
            config["rope_parameters"]["partial_rotary_factor"] = attention.position.rotary_fraction
        for block in blocks:  # α and β of each kind of sub-layer, read off the first block of that kind
            (alpha, beta), (mlp_alpha, mlp_beta) = block.scales()
            kind = "linear_attn" if block.mixer.kind == "linear" else "full_attn"
            config.setdefault(f"{kind}_alpha_factor", alpha)
            config.setdefault(f"{kind}_beta_factor", beta)
            config.setdefault("mlp_alpha_factor", mlp_alpha)
            config.setdefault("mlp_beta_factor", mlp_beta)
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            a, m = f"{theirs}self_attn.", f"{ours}mixer."
            if block.mixer.kind == "linear":  # qkv_proj packs each head's q, k and v together
                mixer = block.mixer
                links += [Link(f"{a}qkv_proj.weight", tuple(f"{m}{n}_proj.weight" for n in "qkv"), groups=mixer.heads),
                          Link(f"{a}slope_rate", (f"{m}transition.nu",), view=(mixer.heads, 1, 1), log=True),
                          rename(f"{a}norm.weight", f"{m}norm_weight"),
                          rename(f"{a}output_gate.weight", f"{m}gate.weight"),
                          rename(f"{a}out_proj.weight", f"{m}out_proj.weight")]
            else:
                links += attention_links(a, m, False)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            links += moe_links(block.mlp, f"{theirs}block_sparse_moe.", f"{ours}mlp.", expert_links=w123_links)
        return links

    def copy_of(self, name: str, spec, config: dict) -> Copy | None:
        """A lightning layer's decay tables: computed from its slopes (:meth:`derived_tensors`), which
        transformers stores beside them and reads as stored."""
        prefix, _, last = name.rpartition(".")
        if last not in self.DECAYS or not prefix.endswith(".self_attn"):
            return None
        slope = f"{prefix}.slope_rate"
        block = config.get("block_size", 256)
        if type(block) is not int or not 1 <= block <= limits.MAX_CHUNK:
            return None
        return Copy(slope, lambda tensor: self.derived_tensors(None, {slope: tensor}, {"block_size": block})[name],
                    rtol=1e-6, what=f"the table its slopes make with `block_size` {block}")

    def derived_tensors(self, spec, tensors: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
        """The blocked form's decay factors of each lightning layer, as MiniMaxLightningAttention computes
        them from its slopes s (H, 1, 1) and ``block_size`` b: exp(-s i) and exp(-s (b - i)) for i = 1..b,
        and exp(-s (i - j)) for i >= j (0 above the diagonal)."""
        import torch

        block = config.get("block_size", 256)
        derived = {}
        for name, slope in tensors.items():
            if not name.endswith(".self_attn.slope_rate"):
                continue
            steps = torch.arange(block, dtype=slope.dtype) + 1
            prefix = name.removesuffix("slope_rate")
            gap = slope * (steps[:, None] - steps[None, :])[None]
            derived[f"{prefix}query_decay"] = torch.exp(-slope * steps[:, None])
            derived[f"{prefix}key_decay"] = torch.exp(-slope * (block - steps[:, None]))
            derived[f"{prefix}diagonal_decay"] = torch.exp(torch.where(gap >= 0, -gap, -math.inf))[None]
        return derived


def residual_scales(mixer: float, mlp: float) -> float | dict:
    """A block's ``skip_scale`` or ``residual_scale``: one number where both sub-layers share it."""
    return mixer if mixer == mlp else {"mixer": mixer, "mlp": mlp}


ARCHITECTURES = (MiniMax(),)
