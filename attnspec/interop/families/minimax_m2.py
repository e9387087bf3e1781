"""transformers' ``minimax_m2`` model type (MiniMax-M2) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from dataclasses import replace

from attnspec.interop.architecture import Link, Row, expanded_blocks, softmax_experts
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.mixtral import Mixtral
from attnspec.spec import limits


class MiniMaxM2(Mixtral):
    """MiniMax-M2: GQA attention with RMSNorms over the whole q and k projections before RoPE (FlexOlmo's
    attention; RoPE on the first ``partial_rotary_factor`` of each head, which released configs state as
    ``rotary_dim``), and Mixtral's experts in every layer routed by sigmoid scores plus a correction bias
    (the choice only), the chosen scores renormalised."""

    model_types = ("minimax_m2",)
    causal_lm = {"minimax_m2": "MiniMaxM2ForCausalLM"}
    config_fields = {"minimax_m2": {"num_experts": "num_local_experts"}}

    rows = (
        Row(("minimax_m2",),
            "GQA attention with QK-norm over whole projections (`qk_norm: rmsnorm_full`) and partial RoPE "
            "(`rotary_dim`), experts in every layer: sigmoid scores, a correction bias, top-k renormalised",
            "`router_jitter_noise`; as llama"),
    )

    def read(self, data: dict, model_type: str, source: str) -> Config:
        config = super().read(data, model_type, source)
        rotary, head_dim = data.get("rotary_dim"), data.get("head_dim")
        if rotary is not None and "partial_rotary_factor" not in data:  # transformers converts it the same way
            if not (isinstance(rotary, int) and isinstance(head_dim, int) and 0 < rotary <= head_dim):
                raise config.refuse("rotary_dim", "must be a whole number from 1 to head_dim")
            return Config({**config.data, "partial_rotary_factor": rotary / head_dim}, source)
        return config

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        if config.number("router_jitter_noise", 0.0):
            raise config.refuse("router_jitter_noise", "attnspec's experts take no jitter; 0 imports")
        experts = config.count("num_local_experts", 256, limit=limits.MAX_EXPERTS)
        moe = {**softmax_experts(config, experts, config.count("intermediate_size"), 8, True),
               "scoring": "sigmoid", "score_bias": True}
        mixer = {**blocks[0]["mixer"], "qk_norm": "rmsnorm_full"}
        return self.assembled(config, [{**block, "mixer": mixer, "mlp": moe} for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        moe, mixer = blocks[0].mlp, blocks[0].mixer
        if any(b.mlp != moe or b.mixer != mixer for b in blocks) or moe.kind != "moe" or moe.scoring != "sigmoid" \
                or not moe.score_bias or not moe.normalize or moe.shared or moe.routed_scale != 1.0:
            raise NotExpressible("minimax_m2 has the same sigmoid-routed, renormalised experts in every layer")
        if mixer.qk_norm != "rmsnorm_full" or mixer.qkv_bias or mixer.out_bias or getattr(mixer, "window", None):
            raise NotExpressible("minimax_m2's attention has whole-projection QK-norm, no biases and no window")
        config = super().config(spec, model_type)
        for field in ("sliding_window", "attention_bias", "mlp_bias"):
            config.pop(field, None)
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        # the correction bias is the MoE block's buffer, not its router's
        return [replace(link, theirs=link.theirs.replace(".gate.e_score_correction_bias", ".e_score_correction_bias"))
                for link in super().mlp_links(mlp, theirs, ours)]


ARCHITECTURES = (MiniMaxM2(),)
