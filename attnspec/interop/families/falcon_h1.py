"""transformers' ``falcon_h1`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, glu_node, head_node, lm_links,
                                           rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.bamba import Bamba
from attnspec.interop.families.mamba2 import mamba2_config, mamba2_links, mamba2_mixer, time_step_limit
from attnspec.spec import limits


class FalconH1(Architecture):
    """Falcon-H1: in every block Mamba2 and softmax attention side by side on the normalised input (a
    `parallel` mixer whose branch weights are ``ssm_out_multiplier`` and ``attention_out_multiplier``),
    then a GLU MLP. The μP multipliers inside the layers (``ssm_in_multiplier``, ``ssm_multipliers`` on
    the z, x, B, C and Δ projections, ``attention_in_multiplier``, ``key_multiplier``, ``mlp_multipliers``)
    are folded into the weights they multiply (:meth:`weight_scales`): the same function, but training then
    steps those weights as plain ones, not in μP's parametrisation. ``embedding_multiplier`` and
    ``lm_head_multiplier`` are the spec's input and head scales."""

    model_types = ("falcon_h1",)
    causal_lm = {"falcon_h1": "FalconH1ForCausalLM"}
    FIELDS = {**Bamba.FIELDS, "act": "hidden_act"}
    MULTIPLIERS = {"ssm_in_multiplier": 1, "ssm_multipliers": 5, "attention_in_multiplier": 1,
                   "key_multiplier": 1, "mlp_multipliers": 2}
    """The multipliers folded into weights, and how many numbers each is."""

    rows = (
        Row(("falcon_h1",),
            "Mamba2 (its own SSM width `mamba_d_ssm`, no norm, Mamba2's gated norm, or a norm per group of heads "
            "before the gate: `norm_span: group`) beside GQA attention with RoPE in every block, as one `parallel` "
            "mixer whose `weights` are `ssm_out_multiplier` and `attention_out_multiplier`; a GLU MLP; "
            "`embedding_multiplier` and `lm_head_multiplier` as `input.scale` and `head.scale`; the multipliers "
            "inside the layers (`ssm_in_multiplier`, `ssm_multipliers`, `attention_in_multiplier`, `key_multiplier`, "
            "`mlp_multipliers`) folded into the weights they multiply (the same function; exported back folded, with "
            "those multipliers at 1; training steps the folded weights as plain ones, not in μP's parametrisation)",
            "as mamba2 (`mamba_proj_bias`)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        d_model = config.count("hidden_size")
        heads, kv_heads, head_dim = config.attention_heads()
        self._multipliers(config)  # checked before anything is built
        bias = config.get("attention_bias", bool, False)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                     "out_bias": bias, "position": config.rope(head_dim),
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        inner = config.count("mamba_d_ssm", None) or config.count("mamba_expand", 2) * d_model
        ssm_heads = config.count("mamba_n_heads", 128)
        head = config.data.get("mamba_d_head", "auto")
        mamba = mamba2_mixer(config, self.FIELDS, inner=inner,
                             head_dim=inner // ssm_heads if head == "auto" else config.count("mamba_d_head"))
        mamba["out_bias"] = config.get("projectors_bias", bool, False)
        if not config.get("mamba_rms_norm", bool, False):  # y silu(z), no norm
            mamba.update(group_norm=False, gate_before_norm=False)
        elif config.get("mamba_norm_before_gate", bool, True):  # RMSNorm per group of heads, then the gate
            mamba.update(gate_before_norm=False, norm_span="group")
        weights = [config.number("ssm_out_multiplier", 1.0), config.number("attention_out_multiplier", 1.0)]
        if min(weights) <= 0 or max(weights) > 1e4:
            raise config.refuse("attention_out_multiplier", "the branch multipliers must be in (0, 10000]")
        mixer = {"kind": "parallel", "branches": [mamba, attention],
                 **({"weights": weights} if weights != [1.0, 1.0] else {})}
        mlp = glu_node(config, bias=config.get("mlp_bias", bool, False))
        blocks = [{"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(eps)}] * layers
        common = common_fields(config)
        embedding = config.number("embedding_multiplier", 1.0)
        if embedding != 1.0:
            common["input"]["scale"] = embedding
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": {**head_node(config, False), "scale": config.number("lm_head_multiplier", 1.0)}}

    def _multipliers(self, config: Config) -> dict[str, list[float]]:
        """Each folded multiplier's numbers (1 where the config has none), checked finite and nonzero."""
        found = {}
        for field, count in self.MULTIPLIERS.items():
            value = config.data.get(field)
            numbers = [1.0] * count if value is None else value if isinstance(value, list) else [value]
            if len(numbers) != count or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                and math.isfinite(v) and v != 0 for v in numbers):
                raise config.refuse(field, f"must be {count} finite nonzero number{'s' * (count > 1)}")
            found[field] = [float(v) for v in numbers]
        return found

    def weight_scales(self, spec, config: Config) -> dict[str, float]:
        found = self._multipliers(config)
        s_in, (z, x, b, c, dt) = found["ssm_in_multiplier"][0], found["ssm_multipliers"]
        a_in, key = found["attention_in_multiplier"][0], found["key_multiplier"][0]
        gate, down = found["mlp_multipliers"]
        scales = {}
        for index, block in enumerate(expanded_blocks(spec)):
            m, a = f"{block_prefix(index)}mixer.branches.0.", f"{block_prefix(index)}mixer.branches.1."
            scales.update({f"{m}gate.weight": z * s_in, f"{m}v_proj.weight": x * s_in, f"{m}k_proj.weight": b * s_in,
                           f"{m}q_proj.weight": c * s_in, f"{m}transition.dt_proj.weight": dt * s_in,
                           f"{a}q_proj.weight": a_in, f"{a}k_proj.weight": a_in * key, f"{a}v_proj.weight": a_in,
                           f"{a}k_proj.bias": key})
            mlp = f"{block_prefix(index)}mlp."  # transformers' gate_proj is attnspec's up
            scales.update({f"{mlp}up.weight": gate, f"{mlp}up.bias": gate, f"{mlp}down.weight": down,
                           f"{mlp}down.bias": down})
        return scales

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixer = blocks[0].mixer
        if (mixer.kind != "parallel" or [b.kind for b in mixer.branches] != ["linear", "softmax"]
                or any(b != blocks[0] for b in blocks)):
            raise NotExpressible("falcon_h1 is one block of Mamba2 beside softmax attention, then a GLU, repeated")
        mamba, attention = mixer.branches
        mlp = blocks[0].mlp
        weights = mixer.weights or [1.0, 1.0]
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "intermediate_size": mlp.hidden, "hidden_act": ACTIVATION_NAMES[mlp.activation], "mlp_bias": mlp.bias,
                  "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                  "head_dim": attention.d_qk, "attention_bias": attention.qkv_bias,
                  "rope_parameters": rope_config(attention.position),
                  **mamba2_config(mamba, spec.d_model, self.FIELDS), "mamba_d_ssm": mamba.heads * mamba.d_v,
                  "mamba_expand": 1, "projectors_bias": mamba.out_bias,
                  "mamba_rms_norm": mamba.group_norm, "mamba_norm_before_gate": mamba.norm_span == "group",
                  "time_step_limit": time_step_limit(mamba), "ssm_out_multiplier": weights[0],
                  "attention_out_multiplier": weights[1], "embedding_multiplier": spec.input.scale,
                  "lm_head_multiplier": spec.head.scale,
                  **{field: [1.0] * count if count > 1 else 1.0 for field, count in self.MULTIPLIERS.items()}}
        if attention.position.rotary_fraction != 1.0:
            config["rope_parameters"]["partial_rotary_factor"] = attention.position.rotary_fraction
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            mamba = block.mixer.branches[0]
            links += mamba2_links(mamba, f"{theirs}mamba.", f"{ours}mixer.branches.0.")
            if not mamba.group_norm:
                links = [link for link in links if link.theirs != f"{theirs}mamba.norm.weight"]
            if mamba.out_bias:
                links.append(rename(f"{theirs}mamba.out_proj.bias", f"{ours}mixer.branches.0.out_proj.bias"))
            attention = block.mixer.branches[1]
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.branches.1.", attention.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight")]
            links += glu_links(f"{theirs}feed_forward.", f"{ours}mlp.", block.mlp.bias)
        return links


ARCHITECTURES = (FalconH1(),)
