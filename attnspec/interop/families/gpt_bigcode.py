"""transformers' ``gpt_bigcode`` model type (SantaCoder, StarCoder 1) as attnspec specs, and back (what a family
states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.gpt2 import Gpt2


class GptBigCode(Gpt2):
    """GPTBigCode: GPT-2's model with linear projections (weights not transposed) and, with ``multi_query``
    (the default), one key/value head shared by every query head. ``c_attn`` packs the whole q, then k and v
    for multi-query attention, else each head's q, k and v in turn."""

    model_types = ("gpt_bigcode",)
    causal_lm = {"gpt_bigcode": "GPTBigCodeForCausalLM"}
    export_order = None
    config_fields = {"gpt_bigcode": Gpt2.FIELDS}
    SCALED_BY_LAYER = False
    TRANSPOSED = False

    rows = (
        Row(("gpt_bigcode",),
            "gpt2's model with linear projections and, with `multi_query`, one key/value head (`kv_heads: 1`)",
            "as gpt2"),
    )

    def scaled_by_layer(self, config: Config) -> bool:
        return False

    def kv_heads(self, config: Config, heads: int) -> int:
        return 1 if config.get("multi_query", bool, True) else heads

    def kv_fields(self, mixer) -> dict:
        kv_heads = mixer.kv_heads or mixer.heads
        if kv_heads not in (1, mixer.heads):
            raise NotExpressible("gpt_bigcode has one key/value head or one per head")
        return {"multi_query": kv_heads == 1 and mixer.heads > 1}

    def qkv_link(self, mixer, theirs: str, ours: str, kind: str) -> Link:
        groups = 1 if (mixer.kv_heads or mixer.heads) == 1 and mixer.heads > 1 else mixer.heads
        return Link(f"{theirs}attn.c_attn.{kind}", tuple(f"{ours}mixer.{n}_proj.{kind}" for n in "qkv"), groups=groups)


ARCHITECTURES = (GptBigCode(),)
