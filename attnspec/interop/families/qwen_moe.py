"""transformers' ``qwen2_moe`` and ``qwen3_moe`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.errors import shorten
from attnspec.interop.architecture import Link, Row, expanded_blocks, moe_links, softmax_experts
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits



class QwenMoe(LlamaFamily):
    """Qwen2-MoE and Qwen3-MoE: Qwen2's attention (q/k/v biases, ``qkv_bias``) or Qwen3's (QK-norm), and in
    every ``decoder_sparse_step``-th layer not in ``mlp_only_layers`` a sparse MoE block: a softmax router
    over ``num_experts``, its top ``num_experts_per_tok`` (renormalised with ``norm_topk_prob``), SiLU GLU
    experts and, for Qwen2-MoE, one shared GLU expert behind a sigmoid gate; the other layers a dense GLU."""

    ALIASES: dict[str, str] = {}
    model_types = ("qwen2_moe", "qwen3_moe")
    causal_lm = {"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
    export_order = None
    ATTENTION = {"qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}

    rows = (
        Row(("qwen2_moe", "qwen3_moe"),
            "qwen2's attention (biases with `qkv_bias`; a window on the `sliding_attention` layers with "
            "`use_sliding_window`) or qwen3's (QK-norm; a window in every layer with `use_sliding_window`); experts "
            "(`mlp: {kind: moe}`: softmax router, top-k renormalised with `norm_topk_prob`, SiLU GLU experts, "
            "Qwen2-MoE's shared expert behind its sigmoid gate) every `decoder_sparse_step` layers but "
            "`mlp_only_layers`, a dense GLU in the others",
            "`num_experts_per_tok` over `num_experts`; as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        blocks, eps = self.layer_blocks(config, self.ATTENTION[model_type], self._moe_windows(config, model_type,
                                                                                             layers))
        if model_type == "qwen2_moe":
            bias = config.get("qkv_bias", bool, True)
            blocks = [{**b, "mixer": {**b["mixer"], "qkv_bias": bias, "out_bias": False}} for b in blocks]
        field = "num_local_experts" if "num_local_experts" in config.data else "num_experts"  # Qwen3-MoE: the first
        experts = config.get(field, int, 60)
        if experts < 0 or experts > limits.MAX_EXPERTS:
            raise config.refuse(field, f"must be in 0..{limits.MAX_EXPERTS}, got {shorten(experts)}")
        step = config.count("decoder_sparse_step", 1)
        dense_only = config.layer_list("mlp_only_layers", layers)
        if experts:
            moe = softmax_experts(config, experts, config.count("moe_intermediate_size"), 4,
                                  config.get("norm_topk_prob", bool, False))
            if model_type == "qwen2_moe":
                moe.update(shared=1, shared_hidden=config.count("shared_expert_intermediate_size"), shared_gate=True)
            blocks = [{**b, "mlp": moe} if i not in dense_only and (i + 1) % step == 0 else b
                      for i, b in enumerate(blocks)]
        return self.assembled(config, blocks, eps)

    @staticmethod
    def _moe_windows(config: Config, model_type: str, layers: int) -> list[int | None]:
        """Each layer's window: Qwen2-MoE's on its ``sliding_attention`` layers, Qwen3-MoE's on every layer,
        with ``use_sliding_window`` (without it their configs keep a ``sliding_window`` that is not used)."""
        if not config.get("use_sliding_window", bool, False):
            return [None] * layers
        window = config.count("sliding_window", 4096)
        if model_type == "qwen3_moe":
            return [window] * layers
        first_full = config.get("max_window_layers", int, 28)
        default = ["sliding_attention" if (i + 1) % 2 and i < first_full else "full_attention" for i in range(layers)]
        types = config.attention_layer_types(layers, default)
        return [window if t == "sliding_attention" else None for t in types]

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        dense = next((b.mlp for b in blocks if b.mlp.kind != "moe"), None)
        if moe is None:
            raise NotExpressible(f"{model_type} has experts")
        windows = [getattr(b.mixer, "window", None) for b in blocks]
        base = super().config(spec, self.ATTENTION[model_type])
        field = "num_local_experts" if model_type == "qwen3_moe" else "num_experts"
        config = {**base, field: moe.experts, "num_experts_per_tok": moe.top_k,
                  "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize, "decoder_sparse_step": 1,
                  "mlp_only_layers": [i for i, b in enumerate(blocks) if b.mlp.kind != "moe"],
                  "intermediate_size": dense.hidden if dense is not None else moe.hidden,
                  "use_sliding_window": any(windows), "sliding_window": next((w for w in windows if w), 4096)}
        if model_type == "qwen2_moe":
            config.update(qkv_bias=blocks[0].mixer.qkv_bias,
                          shared_expert_intermediate_size=moe.shared_hidden or moe.hidden)
        return config

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        return moe_links(mlp, theirs, ours) if mlp.kind == "moe" else super().mlp_links(mlp, theirs, ours)

ARCHITECTURES = (QwenMoe(),)
