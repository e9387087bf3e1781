"""transformers' ``xlstm`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, lm_links, rename, rmsnorm_node)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits


class XLstm(Architecture):
    """xLSTM 7B's architecture: every block an mLSTM layer (the `mlstm` mixer: exponential input gates and
    sigmoid forget gates from their own projections, soft-capped; a LayerNorm per head; a sigmoid output
    gate) then a SiLU GLU, both pre-normed with RMSNorms; logits soft-capped."""

    model_types = ("xlstm",)
    causal_lm = {"xlstm": "xLSTMForCausalLM"}

    rows = (
        Row(("xlstm",),
            "xLSTM 7B's blocks: the `mlstm` mixer (q, k of `qk_dim_factor`, v of `v_dim_factor` of the width, gates "
            "capped at `gate_soft_cap`, `eps`), a SiLU GLU of `ffn_proj_factor` rounded up to "
            "`ffn_round_up_to_multiple_of`, RMSNorms; `output_logit_soft_cap` as the head's `softcap`",
            "`weight_mode: fused` (transformers 5.24 cannot build that model: its initialisation fails), `use_bias` "
            "(biased norms), no `gate_soft_cap` or one over 30; transformers itself decodes only widths that are "
            "multiples of 64 (its cache rounds them up), attnspec any"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        d_model, heads = config.count("hidden_size"), config.count("num_heads")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        if config.count("num_blocks", layers, limit=limits.MAX_BLOCKS) != layers:
            raise config.refuse("num_blocks", "must equal num_hidden_layers (transformers builds num_blocks blocks)")
        if config.count("embedding_dim", d_model) != d_model:
            raise config.refuse("embedding_dim", f"must equal hidden_size {d_model} (no projection joins them)")
        if config.get("weight_mode", str, "single") != "single":
            raise config.refuse("weight_mode", "'fused': transformers 5's own model of it cannot be built (its "
                                "initialisation fails), so no import could be held to it; 'single' imports")
        if config.get("use_bias", bool, False):
            raise config.refuse("use_bias", "biases on the norms: attnspec's RMSNorm and output norm have none")
        widths = {}
        for name, field in (("d_qk", "qk_dim_factor"), ("d_v", "v_dim_factor")):
            width = int(d_model * config.number(field, 0.5 if name == "d_qk" else 1.0, at_most=limits.MAX_EXPANSION))
            if width <= 0 or width % heads:
                raise config.refuse(field, f"hidden_size times it, {width}, must be a positive multiple of "
                                    f"num_heads {heads}")
            widths[name] = width // heads
        cap = config.number("gate_soft_cap", None)
        if cap is None or not 0 < cap <= 30:
            raise config.refuse("gate_soft_cap", "attnspec's mLSTM caps its gates at most at 30 (exp(i) then stays "
                                f"far inside float32 in every mode); got {shorten(cap)}")
        eps = config.number("norm_eps", 1e-6)
        mixer = {"kind": "mlstm", "heads": heads, **widths, "gate_softcap": cap, "eps": config.number("eps", 1e-6),
                 "norm_eps": eps}
        multiple = config.count("ffn_round_up_to_multiple_of", 64)
        factor = config.number("ffn_proj_factor", 2.667, at_most=limits.MAX_EXPANSION)
        hidden = multiple * math.ceil(d_model * factor / multiple)
        block = {"mixer": mixer, "mlp": {"kind": "glu", "hidden": hidden, "activation": "silu", "bias": False},
                 "norm": rmsnorm_node(eps)}
        head = head_node(config, False)
        softcap = config.number("output_logit_soft_cap", None)
        if softcap is not None:
            head["softcap"] = softcap
        return {**common_fields(config), "max_len": config.count("max_position_embeddings", 2048),
                "layers": compress_layers([block] * layers), "final_norm": rmsnorm_node(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixer, mlp = blocks[0].mixer, blocks[0].mlp
        if mixer.kind != "mlstm" or mlp.kind != "glu" or any(b != blocks[0] for b in blocks):
            raise NotExpressible("xlstm is one mLSTM block with a GLU, repeated")
        d = spec.d_model
        return {"hidden_size": d, "embedding_dim": d, "num_hidden_layers": len(blocks), "num_blocks": len(blocks),
                "num_heads": mixer.heads, "qk_dim_factor": mixer.heads * mixer.d_qk / d,
                "v_dim_factor": mixer.heads * mixer.d_v / d, "gate_soft_cap": mixer.gate_softcap, "eps": mixer.eps,
                "norm_eps": spec.final_norm.eps, "ffn_proj_factor": mlp.hidden / d, "ffn_round_up_to_multiple_of": 1,
                "output_logit_soft_cap": spec.head.softcap, "weight_mode": "single", "use_bias": False,
                "max_position_embeddings": spec.max_len}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "backbone.embeddings.weight", "backbone.out_norm.weight")
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"backbone.blocks.{index}.", block_prefix(index)
            a, m = f"{theirs}mlstm_layer.", f"{ours}mixer."
            pairs = [("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("ogate_preact", "gate"),
                     ("out_proj", "out_proj"), ("igate_preact", "igate"), ("fgate_preact", "fgate")]
            links += [rename(f"{a}{t}.weight", f"{m}{o}.weight") for t, o in pairs]
            links += [rename(f"{a}{t}.bias", f"{m}{o}.bias") for t, o in pairs[-2:]]
            links += [rename(f"{a}multihead_norm.weight", f"{m}norm_weight"),
                      rename(f"{theirs}norm_mlstm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}norm_ffn.weight", f"{ours}norm2.weight")]
            # xLSTM's proj_down(silu(proj_up_gate x) * proj_up x) is attnspec's down(act(up x) * gate x)
            f = f"{theirs}ffn."
            links += [rename(f"{f}proj_up_gate.weight", f"{ours}mlp.up.weight"),
                      rename(f"{f}proj_up.weight", f"{ours}mlp.gate.weight"),
                      rename(f"{f}proj_down.weight", f"{ours}mlp.down.weight")]
        return links


ARCHITECTURES = (XLstm(),)
