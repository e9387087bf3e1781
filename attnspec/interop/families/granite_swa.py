"""transformers' ``granite_swa`` and ``granitemoe_swa`` model types (Granite, dense and with experts, with sliding
windows and attention sinks) as attnspec specs, and back (what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, common_fields, compress_layers, expanded_blocks,
                                           head_node, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.granite import Granite
from attnspec.interop.families.granitemoe import GraniteMoe
from attnspec.spec import limits


class GraniteSwa(Granite):
    """Granite SWA: Granite's layers and multipliers with, in every layer, attention sinks (a learned logit per
    head in each softmax: the mixer's ``sinks``), a sliding window of ``sliding_window`` positions on the layers
    ``layer_types`` names sliding (three in four by default), and each layer's own RoPE base
    (``layer_rope_theta``; 0 is no position at all, NoPE)."""

    model_types = ("granite_swa",)
    causal_lm = {"granite_swa": "GraniteSWAForCausalLM"}
    TIED = True
    """Whether the config class ties the head by default."""

    rows = (
        Row(("granite_swa",),
            "granite's layers and multipliers with attention sinks (`sinks: true`) in every layer, a window on the "
            "layers `layer_types` names sliding, and each layer's RoPE base from `layer_rope_theta` (0: no position)",
            "RoPE scalings as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        window = config.count("sliding_window", None)
        types = config.attention_layer_types(layers, ["full_attention" if i % 4 == 0 else "sliding_attention"
                                                      for i in range(layers)])
        if window is None and "sliding_attention" in types:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set",
                                [i for i, t in enumerate(types) if t == "sliding_attention"])
        windows = [window if t == "sliding_attention" else None for t in types]
        blocks, eps = self.layer_blocks(config, "llama", windows)
        global_rope = blocks[0]["mixer"]["position"]
        thetas = config.get("layer_rope_theta", list, None) or [global_rope["base"]] * layers
        if len(thetas) != layers or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0
                                            for t in thetas):
            raise config.refuse("layer_rope_theta", f"one RoPE base per layer ({layers}), each 0 (no position) or "
                                                    "positive")
        scale = config.number("attention_multiplier", 1.0, positive=True)
        residual = config.number("residual_multiplier", 1.0)
        blocks = [{**block, "mixer": {**block["mixer"], "scale": scale, "sinks": True,
                                      "position": {**global_rope, "base": float(theta)} if theta else {"kind": "none"}},
                   "mlp": self.mlp_node(config, block["mlp"], model_type),
                   **({"residual_scale": residual} if residual != 1.0 else {})}
                  for block, theta in zip(blocks, thetas)]
        common = common_fields(config)
        common["input"]["scale"] = config.number("embedding_multiplier", 1.0, positive=True)
        head = {**head_node(config, self.TIED), "scale": self.head_scale(config)}
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [block.mixer for block in blocks]
        if any(m.kind != "softmax" or not m.sinks for m in mixers):
            raise NotExpressible("granite_swa has attention sinks in every layer")
        windows = {m.window for m in mixers if m.window is not None}
        ropes = [m.position for m in mixers if m.position.kind == "rope"]
        if len(windows) > 1 or any(m.position.kind not in ("rope", "none") for m in mixers) or not ropes \
                or len({(rope.scaling, rope.rotary_fraction) for rope in ropes}) != 1:
            raise NotExpressible("granite_swa has one window and RoPE (or none) in each layer, at one scaling")
        # Granite's checks and fields, from the same blocks with the first RoPE everywhere and no window
        plain = spec.model_copy(update={"layers": [block.model_copy(update={"mixer": m.model_copy(update={
            "position": ropes[0], "window": None, "sinks": False})}) for block, m in zip(blocks, mixers)]})
        fields = super().config(plain, "granite")
        window = next(iter(windows), None)
        return {**fields, "rope_parameters": rope_config(ropes[0]), "sliding_window": window,
                "layer_types": ["full_attention" if m.window is None else "sliding_attention" for m in mixers],
                "layer_rope_theta": [m.position.base if m.position.kind == "rope" else 0 for m in mixers],
                "tie_word_embeddings": spec.head.tied}

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        return links + [rename(f"model.layers.{index}.self_attn.sinks", f"{block_prefix(index)}mixer.sinks")
                        for index in range(len(expanded_blocks(spec)))]


class GraniteMoeSwa(GraniteSwa):
    """Granite MoE SWA: Granite SWA's attention (sinks, windows, RoPE bases per layer) with Granite MoE's experts
    in every layer (a softmax over the top-k router logits, fused SiLU GLU experts) and, where
    ``shared_intermediate_size`` is set, a shared GLU MLP beside them."""

    model_types = ("granitemoe_swa",)
    causal_lm = {"granitemoe_swa": "GraniteMoeSWAForCausalLM"}
    TIED = False

    rows = (
        Row(("granitemoe_swa",),
            "granite_swa's attention (sinks, windows, per-layer RoPE bases) with granitemoe's experts in every layer "
            "and a shared GLU MLP beside them where `shared_intermediate_size` is set",
            "as granite_swa and granitemoe"),
    )

    def mlp_node(self, config: Config, dense: dict, model_type: str) -> dict:
        return GraniteMoe.mlp_node(self, config, dense, "granitemoeshared")

    def config(self, spec, model_type: str) -> dict:
        moe = expanded_blocks(spec)[0].mlp
        if any(b.mlp != moe for b in expanded_blocks(spec)) or moe.kind != "moe" or not moe.normalize \
                or moe.shared_gate or moe.shared > 1:
            raise NotExpressible("granitemoe_swa has the same renormalised experts in every layer (and at most "
                                 "one shared MLP)")
        config = {**super().config(spec, model_type), "num_local_experts": moe.experts,
                  "num_experts_per_tok": moe.top_k, "intermediate_size": moe.hidden,
                  "shared_intermediate_size": (moe.shared_hidden or moe.hidden) if moe.shared else 0}
        config.pop("mlp_bias", None)
        return config

    EXPERT_NAMES = ("router.weight", "experts.gate_up_proj", "experts.down_proj")
    """Granite MoE's expert tensors under transformers 5's names (:attr:`GraniteMoe.EXPERT_NAMES`)."""

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return GraniteMoe.mlp_links(self, mlp, theirs, ours)


ARCHITECTURES = (GraniteSwa(), GraniteMoeSwa())
