"""transformers' ``mamba``, ``falcon_mamba`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, lm_links, rename, rmsnorm_node)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits


class Mamba(Architecture):
    """Mamba and Falcon-Mamba: RMSNorm, the Mamba-1 mixer (no MLP); Falcon-Mamba RMS-normalises Δ's
    low-rank input, B and C without a weight."""

    model_types = ("mamba", "falcon_mamba")
    causal_lm = {"mamba": "MambaForCausalLM", "falcon_mamba": "FalconMambaForCausalLM"}
    FIELDS = {"expand": "expand", "state": "state_size", "conv": "conv_kernel", "conv_bias": "use_conv_bias",
              "bias": "use_bias", "rank": "time_step_rank"}

    rows = (
        Row(("mamba", "falcon_mamba"),
            "the `mamba` mixer (Mamba-1's selective scan, `specs/mamba.yaml`: `d_inner`, state `d_qk`, `dt_rank`, the"
            " convolution of x, biases with `use_bias`), no MLP; Falcon-Mamba's weightless RMS norms on Δ, B, C as "
            "`selection_norm: rms`",
            "activations other than silu"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("layer_norm_epsilon", 1e-5)
        norm = ("rms", config.number("mixer_rms_eps", 1e-6)) if model_type == "falcon_mamba" else ("none", eps)
        mixer = mamba1_mixer(config, self.FIELDS, *norm)
        blocks = [{"mixer": mixer, "mlp": "none", "norm": rmsnorm_node(eps)}] * layers
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixer = blocks[0].mixer
        wanted = "rms" if model_type == "falcon_mamba" else "none"
        if mixer.kind != "mamba" or mixer.selection_norm != wanted:
            raise NotExpressible(f"{model_type} is the Mamba-1 mixer with selection_norm {wanted} in every block")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "layer_norm_epsilon":
                  spec.final_norm.eps, **mamba1_config(mixer, spec.d_model, self.FIELDS),
                  "max_position_embeddings": spec.max_len, "residual_in_fp32": spec.dtype == "float32"}
        if model_type == "falcon_mamba":
            config["mixer_rms_eps"] = mixer.norm_eps
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "backbone.embeddings.weight", "backbone.norm_f.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs = f"backbone.layers.{index}."
            links += mamba1_links(block.mixer, f"{theirs}mixer.", block_prefix(index) + "mixer.")
            links.append(rename(f"{theirs}norm.weight", block_prefix(index) + "norm1.weight"))
        return links


def mamba1_mixer(config: Config, fields: dict[str, str], selection_norm: str, eps: float) -> dict:
    """transformers' Mamba-1 mixer as attnspec's ``mamba`` mixer, its sizes read from the config's
    ``fields`` (Jamba prefixes them with ``mamba_``)."""
    d_model = config.count("hidden_size")
    rank = config.data.get(fields["rank"], "auto")
    rank = math.ceil(d_model / 16) if rank == "auto" else config.count(fields["rank"])
    bias = config.get(fields["bias"], bool, False)
    return {"kind": "mamba", "d_qk": config.count(fields["state"], 16),
            "d_inner": config.count(fields["expand"], 2) * d_model, "dt_rank": rank,
            "conv": {"kind": "short", "width": config.count(fields["conv"], 4), "projections": ["v"],
                     "activation": config.activation(allowed=("silu",)),
                     "bias": config.get(fields["conv_bias"], bool, True)},
            "selection_norm": selection_norm, **({"norm_eps": eps} if selection_norm != "none" else {}),
            "qkv_bias": bias, "out_bias": bias}


def mamba1_config(mixer, d_model: int, fields: dict[str, str]) -> dict:
    """A ``mamba`` mixer's fields as a config states them (the inverse of :func:`mamba1_mixer`)."""
    if mixer.d_inner % d_model or mixer.conv.kind != "short" or mixer.qkv_bias != mixer.out_bias:
        raise NotExpressible("transformers' Mamba has d_inner a multiple of d_model, a convolution, and biases "
                             "on both projections or neither")
    return {fields["expand"]: mixer.d_inner // d_model, fields["state"]: mixer.d_qk, fields["rank"]: mixer.dt_rank,
            fields["conv"]: mixer.conv.width, fields["conv_bias"]: mixer.conv.bias, fields["bias"]: mixer.qkv_bias,
            "hidden_act": "silu"}


def mamba1_links(mixer, theirs: str, ours: str) -> list[Link]:
    """A Mamba-1 mixer's tensors, under the names transformers gives them."""
    names = ["in_proj.weight", "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D", "out_proj.weight"]
    names += ["in_proj.bias", "out_proj.bias"] if mixer.qkv_bias else []
    links = [rename(f"{theirs}{name}", f"{ours}{name}") for name in names]
    links.append(Link(f"{theirs}conv1d.weight", (f"{ours}conv.filters.v",), conv=True))
    if mixer.conv.bias:
        links.append(rename(f"{theirs}conv1d.bias", f"{ours}conv.biases.v"))
    if mixer.selection_norm == "rmsnorm":
        links += [rename(f"{theirs}{name}_layernorm.weight", f"{ours}selection_weight.{key}")
                  for name, key in (("dt", "dt"), ("b", "B"), ("c", "C"))]
    return links


ARCHITECTURES = (Mamba(),)
