"""transformers' ``nemotron`` model type (NVIDIA Nemotron-4, Minitron) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, rename
from attnspec.interop.families.jais2 import Jais2


class Nemotron(Jais2):
    """Nemotron: Jais 2's layers (attention and a plain squared-ReLU MLP under biased LayerNorms) with RoPE on the
    first ``partial_rotary_factor`` of each head (half by default), under "LayerNorm1P"s: their stored weight is
    the weight minus 1 (the links add it back)."""

    model_types = ("nemotron",)
    causal_lm = {"nemotron": "NemotronForCausalLM"}
    EPS_FIELD = "norm_eps"
    ROTARY_FRACTION = 0.5

    rows = (
        Row(("nemotron",),
            "llama's attention (partial RoPE) and a plain squared-ReLU MLP (biases with `mlp_bias`) under biased "
            "LayerNorms whose checkpoint weight is the weight minus 1",
            "as llama"),
    )

    def links(self, spec) -> list[Link]:
        return [rename(link.theirs, link.ours[0], offset=1.0)
                if link.theirs.endswith("layernorm.weight") or link.theirs == "model.norm.weight" else link
                for link in super().links(spec)]


ARCHITECTURES = (Nemotron(),)
