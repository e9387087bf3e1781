"""transformers' ``qwen3_next``, ``qwen3_5_text``, ``qwen3_5_moe_text`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Link, Row, Wrapper, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, glu_node, head_node, lm_links,
                                           moe_links, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Qwen3Next(Architecture):
    """Qwen3-Next: Gated DeltaNet blocks and gated softmax attention blocks (QK-norm, partial RoPE, a
    sigmoid output gate), dense SiLU GLU MLPs, zero-centred RMSNorms (weight stored as w - 1)."""

    model_types = ("qwen3_next",)
    causal_lm = {"qwen3_next": "Qwen3NextForCausalLM"}

    rows = (
        Row(("qwen3_next",),
            "Gated DeltaNet blocks (`delta`, l2norm, `mamba` gate per head, SiLU conv, shared gated norm) and gated "
            "attention blocks (QK-norm, partial RoPE, sigmoid gate) in its `layer_types` order; zero-centred norms "
            "converted (w + 1); its sparse MoE layers as `mlp: {kind: moe}` (softmax router, top-k renormalised with "
            "`norm_topk_prob`, a shared expert behind its sigmoid gate), dense where `mlp_only_layers` says",
            "`num_experts_per_tok` over `num_experts`"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        experts = config.get("num_experts", int, 512)
        if experts < 0 or experts > limits.MAX_EXPERTS:
            raise config.refuse("num_experts", f"must be in 0..{limits.MAX_EXPERTS}, got {shorten(experts)}")
        step = config.count("decoder_sparse_step", 1)
        dense_only = config.layer_list("mlp_only_layers", layers)
        moe = {i for i in range(layers) if i not in dense_only and experts > 0 and (i + 1) % step == 0}
        interval = config.count("full_attention_interval", 4)
        default = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
        types = config.layer_types(layers, default)
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", f"{types[unknown[0]]!r} is not linear_attention or full_attention",
                                unknown)
        heads, kv_heads, head_dim = config.attention_heads()
        bias = config.get("attention_bias", bool, False)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qk_norm": "rmsnorm",
                     "norm_eps": eps, "position": config.rope(head_dim, 0.25), "output_gate": "sigmoid",
                     "qkv_bias": bias, "out_bias": bias}
        if kv_heads != heads:
            attention["kv_heads"] = kv_heads
        delta = self.delta_mixer(config, eps)
        dense = glu_node(config) if len(moe) < layers else None  # an all-MoE config need not state intermediate_size
        experts_mlp = self._experts(config, experts) if moe else None
        blocks = [{"mixer": delta if t == "linear_attention" else attention,
                   "mlp": experts_mlp if i in moe else dense, "norm": rmsnorm_node(eps)} for i, t in enumerate(types)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    @staticmethod
    def delta_mixer(config: Config, eps: float) -> dict:
        """The Gated DeltaNet of its ``linear_*`` fields: l2-normalised q and k (grouped by key heads), a Mamba-style
        gate per head, SiLU short convolutions of q, k and v, and a gated norm of one weight shared by the heads."""
        v_heads, k_heads = config.count("linear_num_value_heads"), config.count("linear_num_key_heads")
        if v_heads % k_heads:
            raise config.refuse("linear_num_key_heads", f"{v_heads} value heads cannot share {k_heads} key heads "
                                "equally")
        delta = {"kind": "delta", "heads": v_heads, "d_qk": config.count("linear_key_head_dim"),
                 "d_v": config.count("linear_value_head_dim"), "feature_map": "l2norm",
                 "transition": {"kind": "mamba", "per": "head"},
                 "conv": {"kind": "short", "width": config.count("linear_conv_kernel_dim", 4),
                          "projections": ["q", "k", "v"], "activation": config.activation(allowed=("silu",))},
                 "group_norm": True, "shared_norm_weight": True, "output_gate": "swish", "norm_eps": eps}
        if k_heads != v_heads:
            delta["qk_groups"] = k_heads
        return delta

    @staticmethod
    def delta_config(delta) -> dict:
        """A Gated DeltaNet's ``linear_*`` fields (the inverse of :meth:`delta_mixer`)."""
        return {"linear_num_value_heads": delta.heads, "linear_num_key_heads": delta.qk_groups or delta.heads,
                "linear_key_head_dim": delta.d_qk, "linear_value_head_dim": delta.d_v,
                "linear_conv_kernel_dim": delta.conv.width}

    @staticmethod
    def delta_links(theirs: str, ours: str) -> list[Link]:
        """A Gated DeltaNet's tensors besides its input projections and its norm."""
        return [Link(f"{theirs}conv1d.weight", tuple(f"{ours}mixer.conv.filters.{n}" for n in "qkv"), conv=True),
                rename(f"{theirs}dt_bias", f"{ours}mixer.transition.dt_bias"),
                rename(f"{theirs}A_log", f"{ours}mixer.transition.A_log"),
                rename(f"{theirs}out_proj.weight", f"{ours}mixer.out_proj.weight")]

    @staticmethod
    def _experts(config: Config, experts: int) -> dict:
        """Qwen3-Next's sparse MoE block: a softmax router, top-k (renormalised with norm_topk_prob), SiLU
        GLU experts, one shared GLU expert behind a sigmoid gate."""
        top_k = config.count("num_experts_per_tok", 10)
        if top_k > experts:
            raise config.refuse("num_experts_per_tok", f"{top_k} experts per token of {experts}")
        return {"kind": "moe", "experts": experts, "top_k": top_k, "hidden": config.count("moe_intermediate_size"),
                "activation": config.activation(allowed=("silu",)), "scoring": "softmax",
                "normalize": config.get("norm_topk_prob", bool, True), "shared": 1,
                "shared_hidden": config.count("shared_expert_intermediate_size"), "shared_gate": True}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        delta = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        if delta is None or attention is None or getattr(attention.position, "kind", None) != "rope" \
                or delta.conv.kind != "short":
            raise NotExpressible("qwen3_next has convolved Gated DeltaNet and rotary softmax attention blocks")
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        mlp = dense or moe
        experts = {"num_experts": 0, "mlp_only_layers": []}
        if moe is not None:
            experts = {"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                       "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                       "shared_expert_intermediate_size": moe.shared_hidden or moe.shared * moe.hidden,
                       "decoder_sparse_step": 1,
                       "mlp_only_layers": [i for i, b in enumerate(blocks) if b.mlp.kind != "moe"]}
        return {**experts, "hidden_size": spec.d_model,
                "intermediate_size": (mlp.hidden or mlp.expansion * spec.d_model) if dense is not None else mlp.hidden,
                "num_hidden_layers": len(blocks), "num_attention_heads": attention.heads,
                "num_key_value_heads": attention.kv_heads or attention.heads, "head_dim": attention.d_qk,
                "hidden_act": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": attention.norm_eps,
                "attention_bias": attention.qkv_bias,
                "rope_parameters": {**rope_config(attention.position),
                                    "partial_rotary_factor": attention.position.rotary_fraction},
                **self.delta_config(delta),
                "layer_types": ["linear_attention" if b.mixer.kind == "delta" else "full_attention" for b in blocks]}

    @staticmethod
    def _projection_links(mixer, theirs: str, ours: str) -> list[Link]:
        """Qwen3-Next packs q, k, v and the gate per key head (in_proj_qkvz), beta and Δ per key head (in_proj_ba)."""
        groups = mixer.qk_groups or mixer.heads
        return [Link(f"{theirs}in_proj_qkvz.weight", tuple(f"{ours}mixer.{n}.weight" for n in
                                                            ("q_proj", "k_proj", "v_proj", "gate")), groups),
                Link(f"{theirs}in_proj_ba.weight", (f"{ours}mixer.beta_proj.weight",
                                                    f"{ours}mixer.transition.dt_proj.weight"), groups)]

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight", offset=1.0)
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            mixer = block.mixer
            if mixer.kind == "delta":
                m = f"{theirs}linear_attn."
                links += self._projection_links(mixer, m, ours)
                links += [rename(f"{m}norm.weight", f"{ours}mixer.norm_weight"), *self.delta_links(m, ours)]
            else:
                a = f"{theirs}self_attn."
                # q_proj holds each head's query then its gate: groups of one head
                links += [Link(f"{a}q_proj.weight", (f"{ours}mixer.q_proj.weight", f"{ours}mixer.gate.weight"),
                               mixer.heads),
                          rename(f"{a}k_proj.weight", f"{ours}mixer.k_proj.weight"),
                          rename(f"{a}v_proj.weight", f"{ours}mixer.v_proj.weight"),
                          rename(f"{a}o_proj.weight", f"{ours}mixer.out_proj.weight"),
                          rename(f"{a}q_norm.weight", f"{ours}mixer.qk_norm.q", 1.0),
                          rename(f"{a}k_norm.weight", f"{ours}mixer.qk_norm.k", 1.0)]
                if mixer.qkv_bias:
                    links += [Link(f"{a}q_proj.bias", (f"{ours}mixer.q_proj.bias", f"{ours}mixer.gate.bias"),
                                   mixer.heads),
                              rename(f"{a}k_proj.bias", f"{ours}mixer.k_proj.bias"),
                              rename(f"{a}v_proj.bias", f"{ours}mixer.v_proj.bias"),
                              rename(f"{a}o_proj.bias", f"{ours}mixer.out_proj.bias")]
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight", 1.0),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight", 1.0)]
            if block.mlp.kind == "moe":
                links += moe_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.", shared="shared_expert")
            else:
                links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


class Qwen35(Qwen3Next):
    """Qwen3.5's text models: Qwen3-Next's layers with the Gated DeltaNet's projections unpacked (q, k, v
    in one matrix, the gate, beta and Δ each their own) and, for the MoE model, a sparse MoE block in
    every layer (top-k always renormalised). Their rotary embedding is multimodal (sections of t, h, w
    positions); for text every section reads the same position, which is plain (partial) RoPE."""

    model_types = ("qwen3_5_text", "qwen3_5_moe_text")
    causal_lm = {"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}
    wrappers = {release: Wrapper(text_type, {"model.": "model.language_model."}, ("model.visual.",))
                for release, text_type in (("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text"))}

    rows = (Row(('qwen3_5_text', 'qwen3_5_moe_text'),
            "Qwen3.5's text models (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`): qwen3_next's layers with the "
            "Gated DeltaNet's projections unpacked, a sparse MoE block in every layer of the MoE model; the "
            'multimodal rotary embedding on text positions is plain partial RoPE',
            'nothing of these; a spec of this shape exports as `qwen3_next` unless `--model-type` names these'),
            Row(('qwen3_5', 'qwen3_5_moe'),
            "the multimodal releases' text model: `text_config` and the `model.language_model.` tensors, as the two "
            'types above; the vision tower is not read (export writes the text type)',
            'images and video: attnspec models are text models'))

    def spec(self, config: Config, model_type: str) -> dict:
        fixed = {"num_experts": 0} if model_type == "qwen3_5_text" else {"decoder_sparse_step": 1,
                                                                          "norm_topk_prob": True}
        for field in fixed:
            if field in config.data:
                raise config.refuse(field, f"a {model_type} config has no {field} (transformers fixes it)")
        return super().spec(Config({**config.data, **fixed}, config.source), model_type)

    def config(self, spec, model_type: str) -> dict:
        config = super().config(spec, model_type)
        if model_type == "qwen3_5_text":
            if config["num_experts"]:
                raise NotExpressible("qwen3_5_text has no mixture of experts (qwen3_5_moe_text has)")
            return {k: v for k, v in config.items() if k not in ("num_experts", "mlp_only_layers")}
        if not config["num_experts"] or config["mlp_only_layers"] or not config["norm_topk_prob"]:
            raise NotExpressible("qwen3_5_moe_text has a renormalised mixture of experts in every layer")
        dropped = ("intermediate_size", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers")
        return {k: v for k, v in config.items() if k not in dropped}

    @staticmethod
    def _projection_links(mixer, theirs: str, ours: str) -> list[Link]:
        return [Link(f"{theirs}in_proj_qkv.weight", tuple(f"{ours}mixer.{n}.weight" for n in
                                                           ("q_proj", "k_proj", "v_proj"))),
                rename(f"{theirs}in_proj_z.weight", f"{ours}mixer.gate.weight"),
                rename(f"{theirs}in_proj_b.weight", f"{ours}mixer.beta_proj.weight"),
                rename(f"{theirs}in_proj_a.weight", f"{ours}mixer.transition.dt_proj.weight")]


ARCHITECTURES = (Qwen3Next(), Qwen35())
