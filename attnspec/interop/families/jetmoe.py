"""transformers' ``jetmoe`` model type (JetMoE) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits

LAYER_EPS = 1e-6
"""The eps of JetMoE's layers' RMSNorms, its norm class's default, whatever ``rms_norm_eps`` says (which only the
final norm reads)."""


class JetMoe(Architecture):
    """JetMoE: a mixture of attention experts in every layer (`query_experts`: each token's router chooses
    ``num_experts_per_tok`` of ``num_local_experts`` pairs of query and output projections over shared keys and values
    of ``num_key_value_heads`` heads of ``kv_channels``; RoPE; a bias on the output) and a mixture of GLU experts
    (softmax over the chosen logits, a bias on the output), under RMSNorms."""

    model_types = ("jetmoe",)
    causal_lm = {"jetmoe": "JetMoeForCausalLM"}

    rows = (
        Row(("jetmoe",),
            "a mixture of attention experts in every layer (`query_experts`: the top `num_experts_per_tok` of "
            "`num_local_experts` query and output projections per token, over shared keys and values; `out_bias`) "
            "and of GLU experts (softmax over the chosen logits, `output_bias`); RMSNorms; a tied head by default",
            "activations other than attnspec's; RoPE scalings as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        experts = config.count("num_local_experts", 8, limit=limits.MAX_EXPERTS)
        top_k = config.count("num_experts_per_tok", 2)
        if top_k > experts:
            raise config.refuse("num_experts_per_tok", f"{top_k} experts per token of {experts}")
        heads, width = config.count("num_key_value_heads", 16), config.count("kv_channels", 128)
        mixer = {"kind": "softmax", "heads": heads, "d_qk": width, "d_v": width, "out_bias": True,
                 "position": config.rope(width), "query_experts": {"experts": experts, "top_k": top_k}}
        mlp = {"kind": "moe", "experts": experts, "top_k": top_k, "hidden": config.count("intermediate_size"),
               "activation": config.activation("activation_function"), "scoring": "softmax", "normalize": True,
               "output_bias": True}
        blocks = [{"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(LAYER_EPS)}] * layers
        return {**common_fields(config), "layers": compress_layers(blocks),
                "final_norm": rmsnorm_node(config.number("rms_norm_eps", 1e-6)), "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixer, mlp = blocks[0].mixer, blocks[0].mlp
        if any(b.mixer.kind != "softmax" or b.mixer.query_experts is None or b.mixer != mixer or b.mlp != mlp
               for b in blocks) or mlp.kind != "moe" or mixer.kv_heads not in (None, mixer.heads) \
                or mlp.experts != mixer.query_experts.experts or mlp.top_k != mixer.query_experts.top_k:
            raise NotExpressible("jetmoe has the same attention experts and MLP experts, as many and as many chosen, "
                                 "in every layer")
        experts = mixer.query_experts
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_key_value_heads": mixer.heads,
                "kv_channels": mixer.d_qk, "num_local_experts": experts.experts,
                "num_experts_per_tok": experts.top_k, "intermediate_size": mlp.hidden,
                "activation_function": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": spec.final_norm.eps,
                "rope_parameters": rope_config(mixer.position)}

    def links(self, spec) -> list[Link]:
        links = [rename("model.embed_tokens.weight", "embed.weight"), rename("model.norm.weight", "final_norm.weight")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            experts = block.mlp.experts
            attention, mixer = f"{theirs}self_attention.", f"{ours}mixer."
            links += [Link(f"{attention}kv_proj.weight", (f"{mixer}k_proj.weight", f"{mixer}v_proj.weight")),
                      Link(f"{attention}experts.input_linear.weight", (f"{mixer}q_proj.weight",), stack=experts),
                      Link(f"{attention}experts.output_linear.weight", (f"{mixer}out_proj.weight",), stack=experts,
                           transpose=True, across=True),
                      rename(f"{attention}experts.bias", f"{mixer}out_proj.bias"),
                      rename(f"{attention}experts.router.layer.weight", f"{mixer}router.weight"),
                      # a GLU expert's input rows: the activated half (attnspec's up) then the linear one (its gate)
                      Link(f"{theirs}mlp.input_linear.weight", tuple(f"{ours}mlp.routed.{e}.{name}.weight"
                                                                     for e in range(experts) for name in ("up", "gate")),
                           stack=experts),
                      Link(f"{theirs}mlp.output_linear.weight",
                           tuple(f"{ours}mlp.routed.{e}.down.weight" for e in range(experts)), stack=experts),
                      rename(f"{theirs}mlp.bias", f"{ours}mlp.output_bias"),
                      rename(f"{theirs}mlp.router.layer.weight", f"{ours}mlp.router.weight"),
                      rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
        return links


ARCHITECTURES = (JetMoe(),)
