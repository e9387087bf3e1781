"""transformers' ``mamba2`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, lm_links, rename, rmsnorm_node)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits


class Mamba2(Architecture):
    """Mamba2: RMSNorm, the Mamba2 mixer (no MLP), written as in specs/mamba2.yaml."""

    model_types = ("mamba2",)
    causal_lm = {"mamba2": "Mamba2ForCausalLM"}

    FIELDS = {"heads": "num_heads", "head_dim": "head_dim", "expand": "expand", "state": "state_size",
              "groups": "n_groups", "conv": "conv_kernel", "conv_bias": "use_conv_bias", "chunk": "chunk_size",
              "bias": "use_bias", "eps": "layer_norm_epsilon"}
    """Where a config states the Mamba2 mixer's sizes (Bamba prefixes them with ``mamba_``)."""

    rows = (
        Row(("mamba2",),
            "linear attention as `specs/mamba2.yaml` (identity features, `mamba` transition with `scale_input`, D "
            "skip, gated norm per group), no MLP; `time_step_limit` as the transition's `dt_min`/`dt_max`",
            "`use_bias`"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("layer_norm_epsilon", 1e-5)
        blocks = [{"mixer": mamba2_mixer(config, self.FIELDS), "mlp": "none", "norm": rmsnorm_node(eps)}] * layers
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixer = blocks[0].mixer
        if mixer.kind != "linear" or mixer.conv.kind != "short" or mixer.heads * mixer.d_v % spec.d_model:
            raise NotExpressible("mamba2 is convolved linear attention with heads * d_v a multiple of d_model")
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks),
                **mamba2_config(mixer, spec.d_model, self.FIELDS), "layer_norm_epsilon": mixer.norm_eps,
                "hidden_act": "silu", "max_position_embeddings": spec.max_len,
                "residual_in_fp32": spec.dtype == "float32", "time_step_limit": time_step_limit(mixer)}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "backbone.embeddings.weight", "backbone.norm_f.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs = f"backbone.layers.{index}."
            links += mamba2_links(block.mixer, f"{theirs}mixer.", block_prefix(index) + "mixer.")
            links.append(rename(f"{theirs}norm.weight", block_prefix(index) + "norm1.weight"))
        return links


def mamba2_mixer(config: Config, fields: dict[str, str], dt_limit: tuple[float, float] | None = None,
                 inner: int | None = None, head_dim: int | None = None) -> dict:
    """transformers' Mamba2 mixer as attnspec's linear attention (``specs/mamba2.yaml``), its sizes read
    from the config's ``fields`` (:attr:`Mamba2.FIELDS` names them), Δ clamped to ``dt_limit`` (else the
    config's ``time_step_limit``); ``inner`` and ``head_dim`` where the config states them otherwise
    (Falcon-H1's ``mamba_d_ssm`` and its "auto" head width)."""
    d_model = config.count("hidden_size")
    eps = config.number(fields["eps"], 1e-5)
    heads, head_dim = config.count(fields["heads"]), head_dim or config.count(fields["head_dim"])
    if heads * head_dim != (inner or config.count(fields["expand"], 2) * d_model):
        raise config.refuse(fields["heads"], f"{fields['heads']} * {fields['head_dim']} must be "
                            f"{fields['expand']} * hidden_size" if inner is None else "the SSM's width")
    if config.get(fields["bias"], bool, False):
        raise config.refuse(fields["bias"], "biases on in_proj/out_proj are not imported (released Mamba2 layers "
                            "have none); attnspec's Mamba2 has no input bias on Δ's projection")
    if dt_limit is None:  # transformers 5 writes infinity as {"__float__": "Infinity"}
        limit = [math.inf if v == {"__float__": "Infinity"} else v
                 for v in config.get("time_step_limit", list, [0.0, math.inf])]
    else:
        limit = list(dt_limit)
    if len(limit) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in limit):
        raise config.refuse("time_step_limit", f"must be [low, high] with 0 <= low <= high, got {shorten(limit)}")
    groups = config.count(fields["groups"], 8)
    if heads % groups:
        raise config.refuse(fields["groups"], f"{heads} heads cannot be split into {groups} groups")
    chunk = config.count(fields["chunk"], 256)
    mixer = {"kind": "linear", "heads": heads, "d_qk": config.count(fields["state"]), "d_v": head_dim,
             "qk_groups": groups, "feature_map": "identity", "normalize": False, "scale": 1.0,
             "transition": {"kind": "mamba", "per": "head", "scale_input": True,
                            **({"dt_min": float(limit[0])} if limit[0] > 0 else {}),
                            **({"dt_max": float(limit[1])} if math.isfinite(limit[1]) else {})},
             "conv": {"kind": "short", "width": config.count(fields["conv"], 4), "projections": ["q", "k", "v"],
                      "activation": config.activation(fields.get("act", "hidden_act"), allowed=("silu",)),
                      "bias": config.get(fields["conv_bias"], bool, True)},
             "skip": True, "group_norm": True, "output_gate": "swish", "gate_before_norm": True, "norm_eps": eps}
    if chunk & (chunk - 1) == 0 and chunk <= 4096:  # a chunk length changes no result, only speed
        mixer["chunk_size"] = chunk
    return mixer


def mamba2_config(mixer, d_model: int, fields: dict[str, str]) -> dict:
    """A Mamba2 mixer's sizes as a config states them under ``fields`` (the inverse of :func:`mamba2_mixer`)."""
    return {fields["heads"]: mixer.heads, fields["head_dim"]: mixer.d_v, fields["expand"]: mixer.heads * mixer.d_v
            // d_model, fields["state"]: mixer.d_qk, fields["groups"]: mixer.qk_groups or mixer.heads,
            fields["conv"]: mixer.conv.width, fields["conv_bias"]: mixer.conv.bias, fields["bias"]: False,
            fields["chunk"]: mixer.chunk_size}


def time_step_limit(mixer) -> list[float]:
    """A Mamba2 mixer's Δ clamp as transformers' ``time_step_limit`` [low, high]."""
    transition = mixer.transition
    return [transition.dt_min or 0.0, transition.dt_max if transition.dt_max is not None else math.inf]


def mamba2_links(mixer, theirs: str, ours: str) -> list[Link]:
    """A Mamba2 mixer's tensors: in_proj rows z | x | B | C | dt; conv1d channels x | B | C."""
    links = [Link(f"{theirs}in_proj.weight", tuple(f"{ours}{n}.weight" for n in
                                                   ("gate", "v_proj", "k_proj", "q_proj", "transition.dt_proj"))),
             Link(f"{theirs}conv1d.weight", tuple(f"{ours}conv.filters.{n}" for n in "vkq"), conv=True),
             rename(f"{theirs}dt_bias", f"{ours}transition.dt_bias"),
             rename(f"{theirs}A_log", f"{ours}transition.A_log"),
             rename(f"{theirs}D", f"{ours}D"),
             rename(f"{theirs}norm.weight", f"{ours}norm_weight"),
             rename(f"{theirs}out_proj.weight", f"{ours}out_proj.weight")]
    if mixer.conv.bias:
        links.append(Link(f"{theirs}conv1d.bias", tuple(f"{ours}conv.biases.{n}" for n in "vkq")))
    return links


ARCHITECTURES = (Mamba2(),)
