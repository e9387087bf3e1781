"""transformers' ``codegen`` model type (Salesforce CodeGen) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, block_prefix, expanded_blocks
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.gpt2 import Gpt2
from attnspec.interop.families.gptj import GptJ

SHARDS = 4
"""CodeGen's fused ``qkv_proj`` is interleaved across the 4 model-parallel shards it was trained with: each
shard's rows are its quarter of q, then of v, then of k."""


class CodeGen(GptJ):
    """CodeGen: GPT-J's model with q, k and v fused in one ``qkv_proj``, packed by model-parallel shard."""

    model_types = ("codegen",)
    causal_lm = {"codegen": "CodeGenForCausalLM"}
    config_fields = {"codegen": Gpt2.FIELDS}

    rows = (
        Row(("codegen",),
            "gptj's model with q/k/v fused in `qkv_proj`, packed by its 4 model-parallel shards (q, v, k each)",
            "widths not divisible by its 4 shards; as gptj"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.count("hidden_size") % SHARDS:
            raise config.refuse("n_embd", f"CodeGen's fused q/k/v is packed by {SHARDS} shards: n_embd must divide by "
                                          f"{SHARDS}")
        return super().spec(config, model_type)

    def config(self, spec, model_type: str) -> dict:
        if spec.d_model % SHARDS:
            raise NotExpressible(f"codegen's width divides by its {SHARDS} shards")
        return super().config(spec, model_type)

    def links(self, spec) -> list[Link]:
        links = [link for link in super().links(spec) if not any(f"attn.{n}_proj." in link.theirs for n in "qkv")]
        for index in range(len(expanded_blocks(spec))):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            links.append(Link(f"{theirs}attn.qkv_proj.weight", tuple(f"{ours}mixer.{n}_proj.weight" for n in "qvk"),
                              groups=SHARDS))
        return links


ARCHITECTURES = (CodeGen(),)
