"""transformers' ``granitemoe`` and ``granitemoeshared`` model types (IBM Granite 3 MoE) as attnspec specs,
and back (what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, rename, softmax_experts
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.granite import Granite
from attnspec.spec import limits


class GraniteMoe(Granite):
    """Granite MoE: Granite's layers and multipliers with experts in every layer: a router whose top
    ``num_experts_per_tok`` logits are softmaxed (a softmax renormalised over the top-k), SiLU GLU experts
    stored fused (``input_linear`` (E, 2 hidden, d): each expert's activated half first), and for
    ``granitemoeshared`` a shared GLU MLP of ``shared_intermediate_size`` beside them."""

    model_types = ("granitemoe", "granitemoeshared")
    causal_lm = {"granitemoe": "GraniteMoeForCausalLM", "granitemoeshared": "GraniteMoeSharedForCausalLM"}

    rows = (
        Row(("granitemoe", "granitemoeshared"),
            "granite's layers and multipliers with experts in every layer (`mlp: {kind: moe}`: softmax over the "
            "top-k router logits, fused SiLU GLU experts) and, for `granitemoeshared`, a shared GLU MLP beside them",
            "as granite"),
    )

    def mlp_node(self, config: Config, dense: dict, model_type: str) -> dict:
        experts = config.count("num_local_experts", 8, limit=limits.MAX_EXPERTS)
        moe = softmax_experts(config, experts, dense["hidden"], 2, True, dense["activation"])
        shared = config.get("shared_intermediate_size", int, 0) if model_type == "granitemoeshared" else 0
        if shared:  # 0: no shared MLP (the config's default)
            shared = config.count("shared_intermediate_size")
        return {**moe, "shared": 1, "shared_hidden": shared} if shared else moe

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        moe = blocks[0].mlp
        if any(b.mlp.kind != "moe" or b.mlp != moe for b in blocks) or not moe.normalize or moe.shared_gate:
            raise NotExpressible(f"{model_type} has the same renormalised experts in every layer")
        if bool(moe.shared) != (model_type == "granitemoeshared") or moe.shared > 1:
            raise NotExpressible("granitemoeshared has one shared MLP beside its experts, granitemoe none")
        config = {**super().config(spec, model_type), "num_local_experts": moe.experts,
                  "num_experts_per_tok": moe.top_k, "intermediate_size": moe.hidden}
        config.pop("mlp_bias", None)
        if moe.shared:
            config["shared_intermediate_size"] = moe.shared_hidden or moe.hidden
        return config

    EXPERT_NAMES = ("router.layer.weight", "input_linear.weight", "output_linear.weight")
    """The router's, the experts' stacked input (E, 2 hidden, d: each expert's activated half first) and output
    tensors, under ``block_sparse_moe.``."""

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        layer, routed = theirs.removesuffix("mlp."), [f"{ours}routed.{e}." for e in range(mlp.experts)]
        moe = f"{layer}block_sparse_moe."
        router, inputs, outputs = self.EXPERT_NAMES
        links = [rename(f"{moe}{router}", f"{ours}router.weight"),
                 Link(f"{moe}{inputs}", tuple(f"{r}{n}.weight" for r in routed for n in ("up", "gate")),
                      stack=mlp.experts),
                 Link(f"{moe}{outputs}", tuple(f"{r}down.weight" for r in routed), stack=mlp.experts)]
        if mlp.shared:
            links += [Link(f"{layer}shared_mlp.input_linear.weight", (f"{ours}shared.up.weight",
                                                                      f"{ours}shared.gate.weight")),
                      rename(f"{layer}shared_mlp.output_linear.weight", f"{ours}shared.down.weight")]
        return links


ARCHITECTURES = (GraniteMoe(),)
