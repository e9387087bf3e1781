"""transformers' ``deepseek_v3`` and ``deepseek_v2`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math
import re

from attnspec.errors import shorten
from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, glu_links, glu_node, head_node, lm_links, moe_links,
                                           rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible, is_positive, yarn_mscale
from attnspec.spec import limits


class DeepseekV3(Architecture):
    """DeepSeek-V3: multi-head latent attention (interleaved RoPE on its decoupled part, YaRN's softmax
    scale) in every layer, GLU MLPs in the first ``first_k_dense_replace`` layers and experts after
    (sigmoid scores with a correction bias, group-limited routing, renormalised top-k times
    ``routed_scaling_factor``, shared experts). transformers runs no multi-token-prediction layer."""

    model_types = ("deepseek_v3",)
    causal_lm = {"deepseek_v3": "DeepseekV3ForCausalLM"}

    rows = (
        Row(("deepseek_v3",),
            "latent attention in every layer (the `mla` mixer: query latent or full query, the shared latent cached "
            "in decoding, interleaved RoPE on the decoupled part, YaRN's mscale in the softmax scale), GLU MLPs in "
            "the first `first_k_dense_replace` layers, then experts (sigmoid, correction bias, group-limited, "
            "renormalised, `routed_scaling_factor`, shared experts)",
            "nothing of these; the multi-token-prediction layer its releases carry past the last layer is left "
            "unread, as transformers leaves it"),
    )

    TIED = False
    """``tie_word_embeddings``' default in the type's config class."""

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        attention = self.attention(config)
        sparse = self.sparse_layers(config, layers)
        moe = self.experts(config) if any(sparse) else None
        blocks = [{"mixer": attention, "mlp": moe if sparse[i] else glu_node(config), "norm": rmsnorm_node(eps),
                   **self.block_fields(config, layers)} for i in range(layers)]
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, self.TIED)}

    def attention(self, config: Config) -> dict:
        """Every layer's latent attention (a member adds its parts: DeepSeek-V3.2's indexer)."""
        return mla_mixer(config)

    def block_fields(self, config: Config, layers: int) -> dict:
        """Block fields a member sets in every block (none for DeepSeek-V3)."""
        return {}

    def sparse_layers(self, config: Config, layers: int) -> list[bool]:
        """Which layers hold experts: all from ``first_k_dense_replace`` on (GLUs before)."""
        dense = config.get("first_k_dense_replace", int, 3)
        return [i >= dense for i in range(layers)]

    def sparse_config(self, sparse: list[bool]) -> dict:
        """The config's statement of which layers hold experts (the inverse of :meth:`sparse_layers`)."""
        dense = sparse.index(True) if any(sparse) else len(sparse)
        if any(not s for s in sparse[dense:]):
            raise NotExpressible(f"{self.model_types[0]} has dense MLPs in its first layers and experts after them")
        return {"first_k_dense_replace": dense}

    @staticmethod
    def experts(config: Config) -> dict:
        """DeepSeek-V3's experts: sigmoid scores with a correction bias, group-limited top-k, renormalised
        (``norm_topk_prob``), times ``routed_scaling_factor``, beside ``n_shared_experts`` shared ones."""
        return {**shared_experts(config), "top_k": config.count("num_experts_per_tok", 8), "scoring": "sigmoid",
                "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
                "routed_scale": config.number("routed_scaling_factor", 1.0), "groups": config.count("n_group", 1),
                "top_groups": config.count("topk_group", 1)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        if any(b.mixer.kind != "mla" for b in blocks):
            raise NotExpressible("deepseek_v3 is latent attention in every block")
        if any(b.mlp.kind not in ("moe", "glu") for b in blocks):
            raise NotExpressible(f"{model_type}'s MLPs are GLUs or experts")
        sparse = [b.mlp.kind == "moe" for b in blocks]
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  **self.sparse_config(sparse), **mla_config(blocks[0].mixer)}
        mlp = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        if mlp is not None:
            config["intermediate_size"] = mlp.hidden
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if moe is not None:
            config.update(experts_config(moe))
        config["hidden_act"] = ACTIVATION_NAMES[(mlp or moe).activation]
        return config

    def unused(self, name: str, spec) -> bool:
        """The multi-token-prediction layers released checkpoints carry past the last layer (transformers
        leaves them unread; so does attnspec)."""
        match = re.match(r"model\.layers\.(\d+)\.", name)
        return match is not None and int(match.group(1)) >= len(expanded_blocks(spec))

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += mla_links(block.mixer, f"{theirs}self_attn.", f"{ours}mixer.")
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            if block.mlp.kind == "moe":
                links += moe_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.", shared="shared_experts")
            else:
                links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


def experts_config(moe) -> dict:
    """An ``moe`` node's fields as DeepSeek's config states them (the inverse of :meth:`DeepseekV3.experts`)."""
    return {"n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
            "norm_topk_prob": moe.normalize, "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
            "topk_group": moe.top_groups or moe.groups, "n_shared_experts": moe.shared}


def shared_experts(config: Config) -> dict:
    """DeepSeek's expert widths: ``n_routed_experts`` of ``moe_intermediate_size``, and the shared experts
    as one MLP ``n_shared_experts`` times as wide."""
    experts = config.count("n_routed_experts", limit=limits.MAX_EXPERTS)
    shared = config.get("n_shared_experts", int, 1)
    if not 0 <= shared <= limits.MAX_EXPERTS:
        raise config.refuse("n_shared_experts", f"must be from 0 to {limits.MAX_EXPERTS}")
    hidden = config.count("moe_intermediate_size")
    return {"kind": "moe", "experts": experts, "hidden": hidden, "activation": config.activation(), "shared": shared,
            **({"shared_hidden": shared * hidden} if shared else {})}


def mla_mixer(config: Config) -> dict:
    """DeepSeek's latent attention as attnspec's ``mla`` mixer: its widths, its RoPE (interleaved with
    ``rope_interleave``) and YaRN's softmax scale (qk_head_dim^-1/2 times mscale(factor, mscale_all_dim)^2)."""
    heads, rope_dim = config.count("num_attention_heads"), config.count("qk_rope_head_dim")
    d_qk = config.count("qk_nope_head_dim") + rope_dim
    bias = config.get("attention_bias", bool, False)
    position = {**config.rope(rope_dim), "interleaved": config.get("rope_interleave", bool, True)}
    scale = d_qk ** -0.5
    parameters = config.get("rope_parameters", dict, None) or config.get("rope_scaling", dict, None) or {}
    mscale_all = parameters.get("mscale_all_dim")
    if position.get("scaling", "none") != "none" and is_positive(mscale_all):
        scale *= yarn_mscale(position["factor"], mscale_all) ** 2
    mixer = {"kind": "mla", "heads": heads, "d_qk": d_qk, "d_v": config.count("v_head_dim"), "rope_dim": rope_dim,
             "kv_rank": config.count("kv_lora_rank", limit=limits.MAX_D_MODEL), "qkv_bias": bias, "out_bias": bias,
             "scale": scale, "position": position}
    if config.data.get("q_lora_rank") is not None:
        mixer["q_rank"] = config.count("q_lora_rank", limit=limits.MAX_D_MODEL)
    return mixer


def mla_config(mixer) -> dict:
    """An ``mla`` mixer's fields as DeepSeek's config states them (the inverse of :func:`mla_mixer`)."""
    config = {"num_attention_heads": mixer.heads, "num_key_value_heads": mixer.heads, "kv_lora_rank": mixer.kv_rank,
              "q_lora_rank": mixer.q_rank, "qk_rope_head_dim": mixer.rope_dim,
              "qk_nope_head_dim": mixer.d_qk - mixer.rope_dim, "v_head_dim": mixer.d_v,
              "attention_bias": mixer.qkv_bias}
    position = mixer.position
    if position.kind != "rope":
        return config
    parameters = rope_config(position)
    ratio = (mixer.scale / mixer.d_qk ** -0.5) ** 0.5  # YaRN's mscale(factor, mscale_all_dim), from the scale
    if position.scaling != "none" and position.factor > 1 and abs(ratio - 1) > 1e-12:
        parameters["mscale_all_dim"] = (ratio - 1) / (0.1 * math.log(position.factor))
    return {**config, "rope_interleave": position.interleaved, "rope_parameters": parameters}


def mla_links(mixer, theirs: str, ours: str) -> list[Link]:
    """A latent attention's tensors under DeepSeek's names."""
    names = {"kv_a_proj_with_mqa.weight": "kv_a_proj.weight", "kv_a_layernorm.weight": "kv_norm",
             "kv_b_proj.weight": "kv_b_proj.weight", "o_proj.weight": "out_proj.weight"}
    if mixer.q_rank is None:
        names["q_proj.weight"] = "q_proj.weight"
    else:
        names.update({"q_a_proj.weight": "q_a_proj.weight", "q_a_layernorm.weight": "q_norm",
                      "q_b_proj.weight": "q_b_proj.weight"})
    if mixer.qkv_bias:
        names["kv_a_proj_with_mqa.bias"] = "kv_a_proj.bias"
        if mixer.q_rank is not None:
            names["q_a_proj.bias"] = "q_a_proj.bias"
    if mixer.out_bias:
        names["o_proj.bias"] = "out_proj.bias"
    return [rename(f"{theirs}{their}", f"{ours}{our}") for their, our in names.items()]


class DeepseekV2(DeepseekV3):
    """DeepSeek-V2: V3's layers with V2's router: softmax scores, the top ``num_experts_per_tok`` (greedy, or with
    ``group_limited_greedy`` from the ``topk_group`` of ``n_group`` groups whose best score is highest) times
    ``routed_scaling_factor``, never renormalised (transformers' V2 router ignores ``norm_topk_prob``)."""

    model_types = ("deepseek_v2",)
    causal_lm = {"deepseek_v2": "DeepseekV2ForCausalLM"}

    rows = (
        Row(("deepseek_v2",),
            "deepseek_v3's layers with V2's experts: softmax scores, greedy top-k (with `topk_method: "
            "group_limited_greedy`, from the `topk_group` groups ranked by their best score: `group_score: max`) "
            "times `routed_scaling_factor`, not renormalised, beside the shared experts; RoPE on the decoupled part "
            "always interleaved",
            "`topk_method` other than greedy and group_limited_greedy; `mlp_bias`"),
    )

    @staticmethod
    def experts(config: Config) -> dict:
        method = config.get("topk_method", str, "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise config.refuse("topk_method", f"{shorten(method)}: greedy and group_limited_greedy import")
        if config.get("mlp_bias", bool, False):
            raise config.refuse("mlp_bias", "DeepSeek-V2's experts take no biases; false imports")
        groups = {"groups": config.count("n_group", limit=limits.MAX_EXPERTS),
                  "top_groups": config.count("topk_group", limit=limits.MAX_EXPERTS), "group_score": "max"} \
            if method == "group_limited_greedy" else {}
        return {**shared_experts(config), "top_k": config.count("num_experts_per_tok", 6), "scoring": "softmax",
                "normalize": False, "routed_scale": config.number("routed_scaling_factor", 1.0), **groups}

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("rope_interleave", bool, True) is not True:
            raise config.refuse("rope_interleave", "DeepSeek-V2 rotates interleaved pairs; true imports")
        return super().spec(config, model_type)

    def config(self, spec, model_type: str) -> dict:
        config = super().config(spec, model_type)
        moe = next((b.mlp for b in expanded_blocks(spec) if b.mlp.kind == "moe"), None)
        if moe is not None and (moe.scoring != "softmax" or moe.normalize or moe.score_bias
                                or (moe.groups != 1 and moe.group_score != "max")):
            raise NotExpressible("deepseek_v2's experts are softmax-scored, greedy (groups ranked by their best) and "
                                 "not renormalised")
        if not config.pop("rope_interleave"):
            raise NotExpressible("deepseek_v2 rotates interleaved pairs")
        if moe is not None and moe.groups != 1:
            return {**config, "topk_method": "group_limited_greedy"}
        return {**config, "topk_method": "greedy", "n_group": None, "topk_group": None}


class SarvamMla(DeepseekV3):
    """Sarvam-105B: DeepSeek-V3's model (transformers runs ``DeepseekV3ForCausalLM`` for it) under its own
    config class, whose defaults differ (one dense layer, routing over all experts at once)."""

    model_types = ("sarvam_mla",)
    causal_lm = {"sarvam_mla": "DeepseekV3ForCausalLM"}
    config_fields = {"sarvam_mla": {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts"}}

    rows = (Row(("sarvam_mla",), "deepseek_v3's model and layers (its config class, DeepSeek-V3's modelling code)",
                "as deepseek_v3; the `deepseek_yarn` RoPE of its original config format"),)

    def sparse_layers(self, config: Config, layers: int) -> list[bool]:
        dense = config.get("first_k_dense_replace", int, 1)
        return [i >= dense for i in range(layers)]


class Glm4MoeLite(DeepseekV3):
    """GLM-4.7-Flash (``glm4_moe_lite``): DeepSeek-V3's latent attention with GLM-4.5's experts (the same
    router: sigmoid scores, correction bias, group-limited, renormalised, scaled), its layers' MLPs named
    one by one in ``mlp_layer_types`` (``dense`` or ``sparse``; the first dense by default)."""

    model_types = ("glm4_moe_lite",)
    causal_lm = {"glm4_moe_lite": "Glm4MoeLiteForCausalLM"}

    rows = (Row(("glm4_moe_lite",), "deepseek_v3's latent attention and experts, each layer's MLP dense or "
                                   "experts by `mlp_layer_types`", "as deepseek_v3"),)

    def sparse_layers(self, config: Config, layers: int) -> list[bool]:
        kinds = config.get("mlp_layer_types", list, None)
        if kinds is None:
            return [i > 0 for i in range(layers)]
        if len(kinds) != layers or any(kind not in ("dense", "sparse") for kind in kinds):
            raise config.refuse("mlp_layer_types", f"must name `dense` or `sparse` for each of the {layers} layers")
        return [kind == "sparse" for kind in kinds]

    def sparse_config(self, sparse: list[bool]) -> dict:
        return {"mlp_layer_types": ["sparse" if s else "dense" for s in sparse]}


class Youtu(DeepseekV3):
    """Youtu-LLM: DeepSeek-V3's latent attention in Llama's layers with dense GLU MLPs throughout, and a
    tied head by default."""

    model_types = ("youtu",)
    causal_lm = {"youtu": "YoutuForCausalLM"}
    TIED = True

    rows = (Row(("youtu",), "deepseek_v3's latent attention with a GLU MLP in every layer; a tied head by default",
                "as deepseek_v3"),)

    def sparse_layers(self, config: Config, layers: int) -> list[bool]:
        return [False] * layers

    def sparse_config(self, sparse: list[bool]) -> dict:
        if any(sparse):
            raise NotExpressible("youtu's MLPs are dense")
        return {}


class MiniCPM3(Youtu):
    """MiniCPM3: DeepSeek-V2's latent attention with RoPE on rotate-half pairs (not interleaved), a GLU in every
    layer, and μP's multipliers: embeddings times ``scale_emb`` (``input.scale``), each residual branch times
    ``scale_depth`` / sqrt(layers) (each block's ``residual_scale``), the last hidden state divided by
    ``hidden_size`` / ``dim_model_base`` before the tied head (``head.scale``, its inverse)."""

    model_types = ("minicpm3",)
    causal_lm = {"minicpm3": "MiniCPM3ForCausalLM"}

    rows = (Row(("minicpm3",), "deepseek_v3's latent attention (RoPE not interleaved) with a GLU in every layer; "
                               "`scale_emb` as `input.scale`, `scale_depth` / sqrt(layers) as each block's "
                               "`residual_scale`, `dim_model_base` / `hidden_size` as `head.scale`",
                "as deepseek_v3"),)

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width = config.count("hidden_size")
        fields = {"rope_interleave": False, "v_head_dim": width // config.count("num_attention_heads"),
                  **{k: v for k, v in config.data.items() if v is not None}}
        data = super().spec(Config(fields, config.source), model_type)
        base = config.count("dim_model_base", 256) if config.data.get("dim_model_base") is not None else width
        data["input"]["scale"] = config.number("scale_emb", 12, positive=True)
        return {**data, "head": {**data["head"], "scale": base / width}}

    def block_fields(self, config: Config, layers: int) -> dict:
        depth = config.number("scale_depth", 1.4, positive=True) if config.data.get("scale_depth") is not None \
            else math.sqrt(layers)  # None: transformers' sqrt(layers), no multiplier
        return {"residual_scale": depth / math.sqrt(layers)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        if len({block.scales() for block in blocks}) != 1:
            raise NotExpressible("minicpm3 multiplies every block's residual branches alike")
        (skip, residual), (mlp_skip, mlp_residual) = blocks[0].scales()
        if skip != 1.0 or mlp_skip != 1.0 or residual != mlp_residual or blocks[0].mixer.position.interleaved:
            raise NotExpressible("minicpm3 scales both residual branches alike, keeps the skip and rotates "
                                 "rotate-half pairs")
        base = spec.head.scale * spec.d_model
        if abs(base - round(base)) > 1e-9 * base:
            raise NotExpressible("minicpm3's head scale is a whole dim_model_base over hidden_size")
        config = super().config(spec, model_type)
        for field in ("rope_interleave", "first_k_dense_replace"):
            config.pop(field, None)
        return {**config, "scale_emb": spec.input.scale, "scale_depth": residual * math.sqrt(len(blocks)),
                "dim_model_base": round(base), "tie_word_embeddings": spec.head.tied}




class DeepseekV32(Glm4MoeLite):
    """DeepSeek-V3.2: DeepSeek-V3's model with DeepSeek Sparse Attention in every layer (latent attention whose
    queries read the keys a lightning indexer chooses: the `mla` mixer's `indexer`), each layer's MLP named in
    ``mlp_layer_types`` (by default the first ``first_k_dense_replace`` dense)."""

    model_types = ("deepseek_v32",)
    causal_lm = {"deepseek_v32": "DeepseekV32ForCausalLM"}

    rows = (Row(("deepseek_v32",),
                "deepseek_v3's layers with DeepSeek Sparse Attention (`indexer`: `index_n_heads` heads of "
                "`index_head_dim` scoring the earlier keys, each query reading its `index_topk` best; the indexer's "
                "keys cached beside the latent in decoding), each layer's MLP dense or experts by `mlp_layer_types`",
                "no `q_lora_rank` (the indexer reads the query's latent); RoPE not interleaved; as deepseek_v3"),)

    def sparse_layers(self, config: Config, layers: int) -> list[bool]:
        if config.get("mlp_layer_types", list, None) is not None:
            return super().sparse_layers(config, layers)
        return DeepseekV3.sparse_layers(self, config, layers)

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("rope_interleave", bool, True) is not True:
            raise config.refuse("rope_interleave", "DeepSeek-V3.2 rotates interleaved pairs; true imports")
        if config.data.get("q_lora_rank") is None:
            raise config.refuse("q_lora_rank", "DeepSeek Sparse Attention's indexer reads the query's latent: set it")
        return super().spec(config, model_type)

    def attention(self, config: Config) -> dict:
        indexer = {"heads": config.count("index_n_heads", self.INDEX_HEADS),
                   "d_head": config.count("index_head_dim", 128),
                   "topk": config.count("index_topk", 2048, limit=limits.MAX_LEN), "interleaved": self.INTERLEAVED}
        return {**super().attention(config), "indexer": indexer}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        indexer = getattr(blocks[0].mixer, "indexer", None)
        if (indexer is None or any(getattr(b.mixer, "indexer", None) != indexer for b in blocks)
                or indexer.rope_dim not in (None, blocks[0].mixer.rope_dim) or indexer.interleaved != self.INTERLEAVED):
            raise NotExpressible("deepseek_v32 has one indexer, turning the main attention's RoPE channels, in every "
                                 "layer")
        config = super().config(spec, model_type)
        if not config.pop("rope_interleave", True):
            raise NotExpressible("deepseek_v32 rotates interleaved pairs")
        return {**config, "index_n_heads": indexer.heads, "index_head_dim": indexer.d_head,
                "index_topk": indexer.topk}

    INDEX_HEADS = 64
    """``index_n_heads``' default in the type's config class."""
    INTERLEAVED = False
    """The indexer's RoPE turns interleaved pairs (GLM-MoE-DSA's) rather than halves."""

    def links(self, spec) -> list[Link]:
        links = super().links(spec)
        for index, _ in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.self_attn.indexer.", f"{block_prefix(index)}mixer.indexer."
            links += [rename(f"{theirs}{name}", f"{ours}{name}") for name in
                      ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")]
        return links


class GlmMoeDsa(DeepseekV32):
    """GLM-5 (``glm_moe_dsa``): DeepSeek-V3.2's model whose indexer turns interleaved RoPE pairs; a layer that reuses
    an earlier layer's choice of keys (``indexer_types`` naming it ``shared``) is refused."""

    model_types = ("glm_moe_dsa",)
    causal_lm = {"glm_moe_dsa": "GlmMoeDsaForCausalLM"}
    INDEX_HEADS = 32
    INTERLEAVED = True

    rows = (Row(("glm_moe_dsa",),
                "deepseek_v32's model, the indexer's RoPE on interleaved pairs (`interleaved: true`)",
                "layers reusing an earlier layer's choice of keys (`indexer_types` `shared`, or an `index_topk_freq` "
                "above 1): attnspec's blocks choose their own; as deepseek_v32"),)

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        kinds = config.get("indexer_types", list, None) or ["full"] * layers
        if len(kinds) != layers or any(kind != "full" for kind in kinds):
            shared = [i for i, kind in enumerate(kinds) if kind != "full"]
            raise config.refuse("indexer_types", "a layer reusing an earlier layer's choice of keys (`shared`) is not "
                                "an attnspec block, which chooses its own: every layer `full` imports", shared)
        return super().spec(config, model_type)

    def config(self, spec, model_type: str) -> dict:
        return {**super().config(spec, model_type), "indexer_types": ["full"] * len(expanded_blocks(spec))}


ARCHITECTURES = (DeepseekV3(), DeepseekV2(), SarvamMla(), Glm4MoeLite(), Youtu(), MiniCPM3(), DeepseekV32(),
                 GlmMoeDsa())
