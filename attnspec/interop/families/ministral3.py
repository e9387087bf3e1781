"""transformers' ``ministral3`` model type (Mistral's Ministral 3) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.errors import shorten
from attnspec.interop.architecture import Row, expanded_blocks
from attnspec.interop.config import Config, NotExpressible, is_positive
from attnspec.interop.families.llama import LlamaFamily


class Ministral3(LlamaFamily):
    """Ministral 3: Mistral's layers (a window in every layer where ``sliding_window`` is set) whose queries,
    after RoPE (YaRN by default), are scaled by 1 + β ln(1 + floor(t / original_max_position_embeddings)), β its
    ``rope_parameters.llama_4_scaling_beta`` (the mixer's `query_scale_beta`, `query_scale_period`)."""

    ALIASES: dict[str, str] = {}
    model_types = ("ministral3",)
    causal_lm = {"ministral3": "Ministral3ForCausalLM"}
    export_order = None
    HEAD_DIM = 128

    rows = (
        Row(("ministral3",),
            "mistral's layers with queries scaled past each `original_max_position_embeddings` positions by "
            "`llama_4_scaling_beta` (`query_scale_beta`, `query_scale_period`)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        for field in ("attention_bias", "mlp_bias"):
            if config.get(field, bool, False):
                raise config.refuse(field, "Ministral 3's layers take no biases")
        blocks, eps = self.layer_blocks(config, "mistral")
        parameters = config.get("rope_parameters", dict, None) or {}
        beta, period = parameters.get("llama_4_scaling_beta"), parameters.get("original_max_position_embeddings")
        if not (isinstance(beta, (int, float)) and not isinstance(beta, bool) and 0 <= beta <= 100) \
                or not (is_positive(period) and float(period).is_integer()):
            raise config.refuse("rope_parameters.llama_4_scaling_beta", "Ministral 3's attention scales its queries "
                                "by `llama_4_scaling_beta` (a number from 0 to 100) per "
                                "`original_max_position_embeddings` (a positive whole number) positions; got "
                                f"{shorten(beta)} and {shorten(period)}")
        scale = {"query_scale_beta": float(beta), "query_scale_period": int(period)} if beta else {}
        return self.assembled(config, [{**b, "mixer": {**b["mixer"], **scale}} for b in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        first = mixers[0]
        if any(m.kind != "softmax" or m != first or m.qk_norm != "none" or m.qkv_bias or m.out_bias
               or getattr(m.position, "kind", None) != "rope" for m in mixers) or blocks[0].mlp.kind != "glu" \
                or blocks[0].mlp.bias:
            raise NotExpressible("ministral3 is the same bias-free softmax attention with RoPE in every block")
        position = first.position
        if first.query_scale_beta and position.scaling in ("llama3", "yarn") \
                and position.original_max_len != first.query_scale_period or first.query_scale_offset:
            raise NotExpressible("ministral3 reads one original_max_position_embeddings for its RoPE scaling and its "
                                 "query scale (counted from t): they must be equal")
        config = {**self.shared_fields(spec, first), "sliding_window": first.window}
        rope = config["rope_parameters"]  # transformers reads both fields whatever β is (β = 0 scales by 1)
        rope.update(llama_4_scaling_beta=first.query_scale_beta,
                    original_max_position_embeddings=first.query_scale_period
                    or rope.get("original_max_position_embeddings", spec.max_len))
        return config


ARCHITECTURES = (Ministral3(),)
