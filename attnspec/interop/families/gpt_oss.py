"""transformers' ``gpt_oss`` model type (OpenAI's gpt-oss) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, block_prefix, expanded_blocks, expert_counts, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily
from attnspec.spec import limits

QUICK_GELU_ALPHA = 1.702
"""The slope inside the sigmoid of attnspec's `quick_gelu`, x σ(1.702 x): gpt-oss's `swiglu_alpha`."""


class GptOss(LlamaFamily):
    """gpt-oss: GQA attention with biases and a learnt sink logit per head (`sinks`), a window on the
    ``sliding_attention`` layers (every other one by default), YaRN RoPE; in every layer experts routed by a
    biased router (softmax over the top ``num_experts_per_tok`` logits), each a clamped GLU with biases:
    W2 (x σ(α x) at min(W1 x, limit), times clamp(W3 x, ±limit) + 1) + b2, its gate and up projections stored
    fused, transposed and alternating (``experts.gate_up_proj`` (experts, d, 2 hidden))."""

    ALIASES: dict[str, str] = {}
    model_types = ("gpt_oss",)
    causal_lm = {"gpt_oss": "GptOssForCausalLM"}
    export_order = None

    rows = (
        Row(("gpt_oss",),
            "softmax attention with biases and sinks (`sinks: true`), a window on `sliding_attention` layers, YaRN "
            "RoPE; experts in every layer (`router_bias`, `expert_bias`, `activation: quick_gelu`, `glu_limit` = "
            "swiglu_limit: clamped GLU experts)",
            "`swiglu_alpha` other than 1.702; as llama"),
    )

    HEAD_DIM = 64

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        types = config.attention_layer_types(layers, default)
        window = config.count("sliding_window", 128)
        blocks, eps = self.layer_blocks(config, "llama", [window if t == "sliding_attention" else None
                                                          for t in types])
        bias = config.get("attention_bias", bool, True)
        return self.assembled(config, [{**b, "mixer": {**b["mixer"], "sinks": True, "qkv_bias": bias,
                                                       "out_bias": bias}} for b in blocks], eps)

    def layer_mlp(self, config: Config, model_type: str) -> dict:
        alpha = config.number("swiglu_alpha", QUICK_GELU_ALPHA, positive=True)
        if alpha != QUICK_GELU_ALPHA:
            raise config.refuse("swiglu_alpha", f"attnspec's clamped GLU activates with x σ({QUICK_GELU_ALPHA} x) "
                                f"(`quick_gelu`); {QUICK_GELU_ALPHA} imports")
        experts, chosen = expert_counts(config, "num_local_experts", 128, "num_experts_per_tok", 4)
        return {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": config.count("intermediate_size"),
                "scoring": "softmax", "normalize": True, "activation": "quick_gelu", "router_bias": True,
                "expert_bias": True, "glu_limit": config.number("swiglu_limit", 7.0, positive=True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        moe = blocks[0].mlp
        if any(m.kind != "softmax" or not m.sinks or m.qk_norm != "none" or not (m.qkv_bias and m.out_bias)
               for m in mixers) or len({m.window for m in mixers if m.window}) > 1 \
                or any(m.model_copy(update={"window": None}) != mixers[0].model_copy(update={"window": None})
                       for m in mixers):
            raise NotExpressible("gpt_oss is the same biased softmax attention with sinks in every block, with one "
                                 "window on some")
        if any(b.mlp != moe for b in blocks) or moe.kind != "moe" or moe.scoring != "softmax" or not moe.normalize \
                or moe.activation != "quick_gelu" or not (moe.router_bias and moe.expert_bias and moe.gated) \
                or moe.glu_limit is None or moe.shared or moe.score_bias or moe.groups != 1 or moe.routed_scale != 1:
            raise NotExpressible("gpt_oss's experts are softmax-routed by a biased router, biased clamped GLUs of "
                                 "quick_gelu, without shared experts, alike in every block")
        windows = [m.window for m in mixers]
        plain = blocks[0].model_copy(update={"mixer": mixers[0].model_copy(update={"window": None})})
        config = super().config(spec.model_copy(update={"layers": [plain]}), "llama")
        config.pop("mlp_bias", None)
        return {**config, "num_hidden_layers": len(blocks), "attention_bias": True, "hidden_act": "silu",
                "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
                "sliding_window": next((w for w in windows if w), 128), "num_local_experts": moe.experts,
                "num_experts_per_tok": moe.top_k, "intermediate_size": moe.hidden, "swiglu_alpha": QUICK_GELU_ALPHA,
                "swiglu_limit": moe.glu_limit}

    def links(self, spec) -> list[Link]:
        return super().links(spec) + [rename(f"model.layers.{i}.self_attn.sinks", f"{block_prefix(i)}mixer.sinks")
                                      for i in range(len(expanded_blocks(spec)))]

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        routed = [f"{ours}routed.{e}." for e in range(mlp.experts)]
        halves = lambda kind: tuple(f"{r}{n}.{kind}" for r in routed for n in ("up", "gate"))  # noqa: E731
        fused = {"stack": mlp.experts}  # (experts, ...): one expert's tensors would need a leading axis of 1
        return [rename(f"{theirs}router.weight", f"{ours}router.weight"),
                rename(f"{theirs}router.bias", f"{ours}router.bias"),
                Link(f"{theirs}experts.gate_up_proj", halves("weight"), transpose=True, alternate=True, **fused),
                Link(f"{theirs}experts.gate_up_proj_bias", halves("bias"), alternate=True, **fused),
                Link(f"{theirs}experts.down_proj", tuple(f"{r}down.weight" for r in routed), transpose=True, **fused),
                Link(f"{theirs}experts.down_proj_bias", tuple(f"{r}down.bias" for r in routed), **fused)]


ARCHITECTURES = (GptOss(),)
