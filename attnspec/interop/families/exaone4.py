"""transformers' ``exaone4`` model type (LG's EXAONE 4.0) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, glu_links, glu_node, moe_links, rope_config
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.deepseek_v3 import DeepseekV3, experts_config
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


class ExaoneMoe(Exaone4):
    """K-EXAONE (``exaone_moe``): EXAONE 4.0's attention (QK-norm per head; windows by ``layer_types``, the
    global layers without positions) in Llama's pre-norm placement, each layer's MLP a GLU or DeepSeek-V3's
    experts (sigmoid scores, correction bias, group-limited, renormalised, scaled, shared experts) as
    ``mlp_layer_types`` says (by default dense in the first ``first_k_dense_replace``)."""

    model_types = ("exaone_moe",)
    causal_lm = {"exaone_moe": "ExaoneMoeForCausalLM"}
    PLACEMENT = "pre"
    config_fields = {"exaone_moe": {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts"}}
    stored_names = {"exaone_moe": ((r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.e_score_correction_bias"),)}
    DEFAULTS = {"num_experts_per_tok": 8, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
                "topk_group": 1, "n_shared_experts": 1}
    """ExaoneMoeConfig's defaults where DeepSeek-V3's experts read another."""

    rows = (
        Row(("exaone_moe",),
            "exaone4's attention in pre-norm blocks, each layer's MLP a GLU or deepseek_v3's experts by "
            "`mlp_layer_types`", "as exaone4 and deepseek_v3"),
    )

    def mlp_nodes(self, config: Config, layers: int) -> list[dict]:
        kinds = config.get("mlp_layer_types", list, None)
        if kinds is None:
            dense = config.get("first_k_dense_replace", int, 1)
            kinds = ["dense" if i < dense else "sparse" for i in range(layers)]
        if len(kinds) != layers or any(kind not in ("dense", "sparse") for kind in kinds):
            raise config.refuse("mlp_layer_types", f"must name `dense` or `sparse` for each of the {layers} layers")
        moe = DeepseekV3.experts(Config({**self.DEFAULTS, **config.data}, config.source)) if "sparse" in kinds else None
        return [glu_node(config) if kind == "dense" else moe for kind in kinds]

    def mlp_config(self, blocks) -> dict:
        mlps = [block.mlp for block in blocks]
        dense = next((m for m in mlps if m.kind == "glu"), None)
        moe = next((m for m in mlps if m.kind == "moe"), None)
        if any(m != (dense if m.kind == "glu" else moe) for m in mlps) or (dense is not None and dense.bias) \
                or (moe is not None and (moe.scoring != "sigmoid" or not moe.score_bias)):
            raise NotExpressible("exaone_moe's layers hold one bias-free GLU or one set of sigmoid-routed experts")
        config = {"mlp_layer_types": ["dense" if m.kind == "glu" else "sparse" for m in mlps]}
        if dense is not None:
            config["intermediate_size"] = dense.hidden
        if moe is not None:
            names = {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts"}
            config.update({names.get(k, k): v for k, v in experts_config(moe).items()})
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind == "moe":
            return moe_links(mlp, theirs, ours, shared="shared_experts")
        return glu_links(theirs, ours, False)


ARCHITECTURES = (Exaone4(), ExaoneMoe())
