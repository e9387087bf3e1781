"""transformers' ``olmo_hybrid`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, glu_node, head_node, lm_links,
                                           rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class OlmoHybrid(Architecture):
    """OLMo hybrid: Gated DeltaNet layers (pre-norm; beta in [0, 2] with ``linear_allow_neg_eigval``) and
    softmax attention layers in OLMo 2's placement, x + norm(f(x)), with QK-norm over the whole projection
    width and RoPE or none; each followed by a SiLU GLU MLP."""

    model_types = ("olmo_hybrid",)
    causal_lm = {"olmo_hybrid": "OlmoHybridForCausalLM"}

    rows = (
        Row(("olmo_hybrid",),
            "Gated DeltaNet layers (beta in [0, 2] with `linear_allow_neg_eigval`) and attention layers in OLMo 2's "
            "placement (`norm_placement: output`, x + norm(f(x))) with QK-norm over the whole projection width "
            "(`qk_norm: rmsnorm_full`), RoPE or none (null `rope_parameters` or theta, as OlmoHybridModel reads them; "
            "transformers 5.24's from_pretrained fills a default RoPE in for null parameters, and import-hf's check "
            "shows that difference), each with a SiLU GLU",
            "a checkpoint saved by transformers 5.24 with keys and values of different widths: it cuts the "
            "convolution into three equal q/k/v parts, which OLMo-core's layout is not (released checkpoints are "
            "exact)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        eps = config.number("rms_norm_eps", 1e-6)
        types = config.layer_types(layers, ["full_attention" if i % 4 == 3 else "linear_attention"
                                            for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention or full_attention", unknown)
        heads, kv_heads, head_dim = config.attention_heads(None)
        bias = config.get("attention_bias", bool, False)
        parameters = config.get("rope_parameters", dict, None)
        # OlmoHybridModel's own test: no RoPE where the parameters or their theta are null (as released).
        # transformers 5.24's config class fills a default RoPE in for null parameters when it loads a
        # config.json, so its from_pretrained differs from its model's intent there; import-hf's check shows it
        rope = parameters is not None and parameters.get("rope_theta") is not None
        attention = {"kind": "softmax", "heads": heads, "qk_norm": "rmsnorm_full", "norm_eps": eps, "qkv_bias": bias,
                     "out_bias": bias, "position": config.rope(head_dim) if rope else {"kind": "none"},
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        v_heads, k_heads = config.count("linear_num_value_heads", heads), config.count("linear_num_key_heads", heads)
        if v_heads % k_heads:
            raise config.refuse("linear_num_key_heads", f"{v_heads} value heads cannot share {k_heads} key heads")
        d_qk = config.count("linear_key_head_dim", int(0.75 * d_model / k_heads))
        delta = {"kind": "delta", "heads": v_heads, "d_qk": d_qk,
                 "d_v": config.count("linear_value_head_dim", 2 * d_qk),
                 "feature_map": "l2norm", "transition": {"kind": "mamba", "per": "head"},
                 "beta": "2sigmoid" if config.get("linear_allow_neg_eigval", bool, True) else "sigmoid",
                 "conv": {"kind": "short", "projections": ["q", "k", "v"],
                          "width": config.count("linear_conv_kernel_dim", 4, limit=limits.MAX_CONV_WIDTH),
                          "activation": config.activation(allowed=("silu",))},
                 "group_norm": True, "shared_norm_weight": True, "output_gate": "swish", "norm_eps": 1e-5,
                 **({"qk_groups": k_heads} if k_heads != v_heads else {})}
        mlp = glu_node(config)
        blocks = [{"mixer": delta, "mlp": mlp, "norm": rmsnorm_node(eps)} if t == "linear_attention" else
                  {"mixer": attention, "mlp": mlp, "norm": rmsnorm_node(eps), "norm_placement": "output"}
                  for t in types]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        delta = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if delta is None or attention is None or any(b.mixer.kind not in ("delta", "softmax") for b in blocks):
            raise NotExpressible("olmo_hybrid has Gated DeltaNet layers and attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "intermediate_size": blocks[0].mlp.hidden, "hidden_act": ACTIVATION_NAMES[blocks[0].mlp.activation],
                  "layer_types": ["linear_attention" if b.mixer.kind == "delta" else "full_attention" for b in blocks],
                  "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                  "attention_bias": attention.qkv_bias, "linear_num_value_heads": delta.heads,
                  "linear_num_key_heads": delta.qk_groups or delta.heads, "linear_key_head_dim": delta.d_qk,
                  "linear_value_head_dim": delta.d_v, "linear_conv_kernel_dim": delta.conv.width,
                  "linear_allow_neg_eigval": delta.beta == "2sigmoid",
                  # no RoPE: a null theta (null parameters would load with a default RoPE filled in)
                  "rope_parameters": rope_config(attention.position) if attention.position.kind == "rope"
                  else {"rope_type": "default", "rope_theta": None}}
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            if block.mixer.kind == "delta":
                a, m = f"{theirs}linear_attn.", f"{ours}mixer."
                links += [rename(f"{a}{n}_proj.weight", f"{m}{n}_proj.weight") for n in "qkv"]
                links += [Link(f"{a}{n}_conv1d.weight", (f"{m}conv.filters.{n}",), conv=True) for n in "qkv"]
                links += [rename(f"{a}a_proj.weight", f"{m}transition.dt_proj.weight"),
                          rename(f"{a}dt_bias", f"{m}transition.dt_bias"),
                          rename(f"{a}A_log", f"{m}transition.A_log"),
                          rename(f"{a}b_proj.weight", f"{m}beta_proj.weight"),
                          rename(f"{a}g_proj.weight", f"{m}gate.weight"),
                          rename(f"{a}o_norm.weight", f"{m}norm_weight"),
                          rename(f"{a}o_proj.weight", f"{m}out_proj.weight")]
                norms = ("attention_layer_norm", "feedforward_layer_norm")  # OLMo-core's names, as saved
            else:
                links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
                links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q"),
                          rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k")]
                norms = ("feedforward_layer_norm", "post_feedforward_layernorm")  # on each sub-layer's output
            links += [rename(f"{theirs}{norms[0]}.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}{norms[1]}.weight", f"{ours}norm2.weight")]
            links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


ARCHITECTURES = (OlmoHybrid(),)
