"""transformers' ``ernie4_5_moe`` model type (Baidu's ERNIE 4.5 MoE) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, expanded_blocks, glu_links, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.ernie4_5 import Ernie4_5
from attnspec.spec import limits


class Ernie4_5Moe(Ernie4_5):
    """ERNIE 4.5 MoE: ERNIE 4.5's layers with experts on every ``moe_layer_interval``-th layer from
    ``moe_layer_start_index`` to ``moe_layer_end_index``: a float32 softmax router choosing its top ``moe_k``
    by the scores plus a correction bias, weighting by the scores renormalised, SiLU GLU experts of
    ``moe_intermediate_size`` beside ``moe_num_shared_experts`` shared ones."""

    model_types = ("ernie4_5_moe",)
    causal_lm = {"ernie4_5_moe": "Ernie4_5_MoeForCausalLM"}
    config_fields = {"ernie4_5_moe": {"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok"}}
    """Ernie4_5_MoeConfig's own names for these fields (its ``attribute_map`` read backwards)."""

    rows = (
        Row(("ernie4_5_moe",),
            "ernie4_5's layers with experts on the layers `moe_layer_interval`, `moe_layer_start_index` and "
            "`moe_layer_end_index` name (softmax scores, chosen with a correction bias, renormalised; shared experts)",
            "shared experts with biases (`use_bias` and `moe_num_shared_experts`); as ernie4_5"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.ernie_blocks(config)
        shared = config.get("moe_num_shared_experts", int, 2)
        if shared and config.get("use_bias", bool, False):
            raise config.refuse("use_bias", "ERNIE's shared experts take its biases, which attnspec's shared experts "
                                            "lack; false imports")
        hidden = config.count("moe_intermediate_size")
        moe = {"kind": "moe", "experts": config.count("num_experts", 64, limit=limits.MAX_EXPERTS),
               "top_k": config.count("num_experts_per_tok", 6), "hidden": hidden, "scoring": "softmax",
               "score_bias": True, "normalize": True, "activation": config.activation(allowed=("silu",)),
               "shared": shared, **({"shared_hidden": shared * hidden} if shared else {})}
        start, end = config.get("moe_layer_start_index", int, 1), config.get("moe_layer_end_index", int, -1)
        end = len(blocks) - 1 if end == -1 else end
        interval = config.count("moe_layer_interval", 1)
        return self.assembled(config, [{**block, "mlp": moe if (i + 1) % interval == 0 and start <= i <= end
                                        else block["mlp"]} for i, block in enumerate(blocks)], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        places = [i for i, b in enumerate(blocks) if b.mlp.kind == "moe"]
        moe = blocks[places[0]].mlp if places else None
        if moe is None or any(blocks[i].mlp != moe for i in places) or moe.scoring != "softmax" \
                or not (moe.score_bias and moe.normalize) or moe.groups != 1 or moe.routed_scale != 1.0 \
                or moe.shared_gate:
            raise NotExpressible("ernie4_5_moe has the same softmax experts, chosen with a correction bias, on its "
                                 "MoE layers")
        interval = places[1] - places[0] if len(places) > 1 else places[0] + 1
        if places != list(range(places[0], places[-1] + 1, interval)) or (places[0] + 1) % interval:
            raise NotExpressible("ernie4_5_moe's MoE layers are every interval-th layer of one range")
        config = super().config(spec, model_type)
        return {**config, "moe_num_experts": moe.experts, "moe_k": moe.top_k, "moe_intermediate_size": moe.hidden,
                "moe_num_shared_experts": moe.shared, "moe_layer_start_index": places[0],
                "moe_layer_end_index": places[-1], "moe_layer_interval": interval}

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        if mlp.kind != "moe":
            return glu_links(theirs, ours, mlp.bias)
        links = [rename(f"{theirs}gate.weight", f"{ours}router.weight"),
                 Link(f"{theirs}moe_statics.e_score_correction_bias", (f"{ours}score_bias",), view=(1, mlp.experts))]
        for e in range(mlp.experts):
            links += glu_links(f"{theirs}experts.{e}.", f"{ours}routed.{e}.", False)
        if mlp.shared:
            links += glu_links(f"{theirs}shared_experts.", f"{ours}shared.", False)
        return links


ARCHITECTURES = (Ernie4_5Moe(),)
