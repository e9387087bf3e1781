"""transformers' ``hunyuan_v1_dense`` and ``hunyuan_v1_moe`` model types (Tencent's Hunyuan V1) as attnspec specs,
and back (what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.errors import shorten
from attnspec.interop.architecture import Link, Row, expanded_blocks, expert_counts, moe_links
from attnspec.interop.config import Config, NotExpressible, is_positive
from attnspec.interop.families.llama import LlamaFamily


class HunYuanV1(LlamaFamily):
    """Hunyuan V1: Llama with an RMSNorm of each query and key head *after* RoPE (``qk_norm_after_rope``), RoPE
    whose base an NTK ``alpha`` stretches once for all lengths (``rope_type: dynamic`` with ``alpha``:
    base * alpha^(d / (d - 2))), and for the MoE type, in every layer, a softmax router whose top
    ``moe_topk`` are renormalised, GLU experts ``intermediate_size`` wide and one ungated shared GLU as wide."""

    ALIASES: dict[str, str] = {}
    model_types = ("hunyuan_v1_dense", "hunyuan_v1_moe")
    causal_lm = {"hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM", "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM"}
    export_order = ("hunyuan_v1_moe", "hunyuan_v1_dense")
    """A spec with experts is the MoE type (the dense type's check refuses them)."""

    QK_NORM_NAMES = ("query_layernorm", "key_layernorm")

    rows = (
        Row(("hunyuan_v1_dense",),
            "llama with QK-norm after RoPE (`qk_norm_after_rope`); `rope_type: dynamic` with an NTK `alpha` is a fixed "
            "base, rope_theta * alpha^(d / (d - 2))",
            "as llama"),
        Row(("hunyuan_v1_moe",),
            "the same with experts in every layer (softmax router, top `moe_topk` renormalised, one ungated shared "
            "GLU)",
            "`num_experts` or `moe_topk` per layer (lists); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        mixer = {**blocks[0]["mixer"], "qk_norm": "rmsnorm", "qk_norm_after_rope": True,
                 "position": self._position(config, blocks[0]["mixer"])}
        blocks = [{**block, "mixer": mixer} for block in blocks]
        if model_type == "hunyuan_v1_moe":
            experts, chosen = expert_counts(config, "num_experts", 1, "moe_topk", 1)
            hidden = config.count("intermediate_size")
            moe = {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": hidden, "scoring": "softmax",
                   "normalize": True, "activation": config.activation(allowed=("silu",)), "shared": 1,
                   "shared_hidden": hidden}
            blocks = [{**block, "mlp": moe} for block in blocks]
        return self.assembled(config, blocks, eps)

    @staticmethod
    def _position(config: Config, mixer: dict) -> dict:
        """RoPE as the rotary embedding builds it: an ``alpha`` in the parameters turns ``dynamic`` scaling
        into a fixed base, rope_theta * alpha^(d / (d - 2)) (transformers' ``ntk_alpha``)."""
        parameters = config.get("rope_parameters", dict, None) or config.get("rope_scaling", dict, None) or {}
        alpha = parameters.get("alpha")
        if alpha is None:
            return mixer["position"]
        field = "rope_parameters.alpha" if "rope_parameters" in config.data else "rope_scaling.alpha"
        kind = parameters.get("rope_type", parameters.get("type"))
        if kind != "dynamic" or not is_positive(alpha):
            raise config.refuse(field, f"an NTK alpha is read with `rope_type: dynamic` and must be a positive "
                                f"number; got {shorten(alpha)} with {shorten(kind)!r}")
        width = mixer["d_qk"]
        theta = parameters.get("rope_theta", config.number("rope_theta", 10000.0))
        return {"kind": "rope", "base": float(theta) * float(alpha) ** (width / (width - 2))}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        first = mixers[0]
        if any(m.kind != "softmax" or m.qk_norm != "rmsnorm" or not m.qk_norm_after_rope or m != first
               for m in mixers):
            raise NotExpressible(f"{model_type} is the same softmax attention in every block, with QK-norm after RoPE")
        if getattr(first, "window", None):
            raise NotExpressible(f"{model_type} has no sliding windows")
        moe = blocks[0].mlp if blocks[0].mlp.kind == "moe" else None
        if (model_type == "hunyuan_v1_moe") != (moe is not None):
            raise NotExpressible(f"{model_type} has {'experts' if moe is None else 'no experts'} in every block")
        if any(b.mlp != blocks[0].mlp for b in blocks):
            raise NotExpressible(f"{model_type} has the same MLP in every block")
        plain = first.model_copy(update={"qk_norm": "none", "qk_norm_after_rope": False})
        shaped = spec.model_copy(update={"layers": [blocks[0].model_copy(update={"mixer": plain})]})
        config = {**super().config(shaped, "llama"), "num_hidden_layers": len(blocks)}
        config.pop("mlp_bias", None)
        if moe is not None:
            if moe.scoring != "softmax" or not moe.normalize or moe.score_bias or moe.groups != 1 \
                    or moe.routed_scale != 1.0 or moe.shared != 1 or moe.shared_gate \
                    or (moe.shared_hidden or moe.hidden) != moe.hidden:
                raise NotExpressible("hunyuan_v1_moe's experts are softmax-routed and renormalised, beside one "
                                     "ungated shared expert as wide as they are")
            config.update(num_experts=moe.experts, moe_topk=moe.top_k, intermediate_size=moe.hidden)
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind == "moe":
            return moe_links(mlp, theirs, ours, shared="shared_mlp", router="gate.wg")
        return super().mlp_links(mlp, theirs, ours)


ARCHITECTURES = (HunYuanV1(),)
