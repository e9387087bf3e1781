"""transformers' ``nemotron`` model type (NVIDIA Nemotron-4, Minitron) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, block_prefix, common_fields, compress_layers, expanded_blocks,
                                           head_node, rename)
from attnspec.interop.architecture import mlp_links as plain_mlp_links
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Nemotron(LlamaFamily):
    """Nemotron: Llama's attention (RoPE on the first ``partial_rotary_factor`` of each head, half by default)
    and a plain squared-ReLU MLP under "LayerNorm1P"s: LayerNorms with biases whose stored weight is the
    weight minus 1 (the links add it back)."""

    ALIASES: dict[str, str] = {}
    model_types = ("nemotron",)
    causal_lm = {"nemotron": "NemotronForCausalLM"}
    export_order = None

    rows = (
        Row(("nemotron",),
            "llama's attention (partial RoPE) and a plain squared-ReLU MLP (biases with `mlp_bias`) under biased "
            "LayerNorms whose checkpoint weight is the weight minus 1",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        fields = dict(config.data)
        if fields.get("rope_parameters") is None and fields.get("partial_rotary_factor") is None:
            fields["partial_rotary_factor"] = 0.5  # NemotronConfig's default
        config = Config(fields, config.source)
        blocks, _ = self.layer_blocks(config, "llama")
        norm = {"kind": "layernorm", "eps": config.number("norm_eps", 1e-5, positive=True)}
        mlp = {**blocks[0]["mlp"], "kind": "mlp", "activation": config.activation(default="relu2")}
        blocks = [{**block, "mlp": mlp, "norm": norm} for block in blocks]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": norm,
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        if any(b.norm != first.norm or b.mlp.kind != "mlp" or b.parallel != "none" for b in blocks) \
                or spec.final_norm != first.norm or first.norm.kind != "layernorm" or not first.norm.bias:
            raise NotExpressible("nemotron is biased LayerNorms and plain MLPs")
        config = super().config(spec, "llama")
        config.pop("rms_norm_eps")
        return {**config, "norm_eps": first.norm.eps}

    def links(self, spec) -> list[Link]:
        links = []
        for link in super().links(spec):
            if link.theirs.endswith("layernorm.weight") or link.theirs == "model.norm.weight":
                stem = link.theirs[:-len("weight")]
                links += [rename(link.theirs, link.ours[0], offset=1.0),
                          rename(f"{stem}bias", link.ours[0][:-len("weight")] + "bias")]
            else:
                links.append(link)
        return links

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return plain_mlp_links(theirs, ours, mlp.bias)


ARCHITECTURES = (Nemotron(),)
