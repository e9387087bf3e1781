"""transformers' ``gemma4_text`` and ``gemma4_unified_text`` model types as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math

from attnspec.interop.architecture import (Architecture, Link, Row, Wrapper, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, glu_links, head_node, lm_links, rename,
                                           rmsnorm_node)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits
from attnspec.spec.walk import kv_sources

KV_NAMES = {"sliding_attention": "sliding", "full_attention": "full"}
"""The name each layer type's last unshared layer lends its keys and values under (transformers keys them by type)."""


class Gemma4(Architecture):
    """Gemma 4's text model: sandwich norms (RMSNorms of weight w, not Gemma 3's 1 + w), attention with q, k and
    unweighted v norms and the softmax scale 1, windowed layers beside global ones whose heads may be wider and fewer
    (`per_layer_config`), whose values may be their keys' projection (`attention_k_eq_v`) and whose RoPE is
    proportional, the last `num_kv_shared_layers` layers reading the keys and values of the last unshared layer of
    their type (with MLPs twice as wide where `use_double_wide_mlp`), each layer's output times a stored scalar, a
    tanh-GeLU GLU, embeddings times sqrt(d), a tied head with an optional logit soft-cap."""

    model_types = ("gemma4_text", "gemma4_unified_text")
    causal_lm = {"gemma4_text": "Gemma4ForCausalLM", "gemma4_unified_text": "Gemma4UnifiedForCausalLM"}
    wrappers = {"gemma4": Wrapper("gemma4_text", {"model.": "model.language_model."},
                                  ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                                   "model.embed_audio.")),
                "gemma4_unified": Wrapper("gemma4_unified_text", {"model.": "model.language_model."},
                                          ("model.embed_vision.", "model.embed_audio."))}

    rows = (
        Row(("gemma4_text", "gemma4_unified_text"),
            "Gemma 4's text model: sandwich norms of weight w, q/k/v norms and scale 1, windowed and global layers with "
            "their own head widths and key/value heads (`per_layer_config`), values from the keys' projection "
            "(`attention_k_eq_v`: `values_from_keys`), proportional RoPE, cross-layer key/value sharing "
            "(`num_kv_shared_layers`: `lends_kv`/`kv_from`) and `use_double_wide_mlp`, `layer_scalar` (`output_scale`), "
            "embeddings times sqrt(d), a tied head with `final_logit_softcapping`",
            "per-layer input embeddings (`hidden_size_per_layer_input` > 0, the default of `gemma4_text`: its E2B "
            "and E4B releases), the MoE block beside the MLP (`enable_moe_block`), bidirectional attention (`all`)"),
        Row(("gemma4", "gemma4_unified"),
            "the multimodal releases' text models: `text_config` and the `model.language_model.` tensors, as "
            "`gemma4_text` and `gemma4_unified_text`; the vision and audio towers and embedders are not read",
            "images and audio: attnspec models are text models"),
    )

    PER_LAYER_INPUTS = {"gemma4_text": 256, "gemma4_unified_text": 0}
    """`hidden_size_per_layer_input` where the config states none: its config class's default."""

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        if config.get("hidden_size_per_layer_input", int, self.PER_LAYER_INPUTS[model_type]):
            raise config.refuse("hidden_size_per_layer_input", "per-layer input embeddings (a second embedding of "
                                "each token per layer, gated into each layer's output) are not an attnspec part; "
                                "0 imports")
        if config.get("enable_moe_block", bool, False):
            raise config.refuse("enable_moe_block", "a dense MLP and a mixture of experts side by side in each "
                                "layer, each with its own norms, are not an attnspec block; false imports")
        if config.get("use_bidirectional_attention", str, None) == "all":
            raise config.refuse("use_bidirectional_attention", "bidirectional attention is not a causal LM's; unset "
                                "or `vision` (bidirectional over image tokens alone, which text has none of) imports")
        heads, kv_heads, head_dim = config.attention_heads(head_dim=256)
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        window = config.count("sliding_window", 512)
        types = config.attention_layer_types(layers, ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                                      for i in range(layers)])
        types[-1] = "full_attention"  # as transformers' config forces it
        widths = self._per_layer(config, types, heads, kv_heads, head_dim)
        borrows = self._kv_sources(config, types)
        k_eq_v = config.get("attention_k_eq_v", bool, False)
        hidden = config.count("intermediate_size")
        double = config.get("use_double_wide_mlp", bool, False)
        activation = config.activation("hidden_activation", default="gelu_pytorch_tanh")
        lenders = {source for source in borrows if source is not None}
        blocks = []
        for index, (layer_type, (layer_kv, width), source) in enumerate(zip(types, widths, borrows)):
            mixer = {"kind": "softmax", "heads": heads, "d_qk": width, "d_v": width, "qkv_bias": bias, "out_bias": bias,
                     "qk_norm": "rmsnorm", "norm_eps": eps, "scale": 1.0, "position": self._rope(config, layer_type, width),
                     **({"kv_heads": layer_kv} if layer_kv != heads else {}),
                     **({"window": window} if layer_type == "sliding_attention" else {})}
            if source is None:
                mixer["v_norm"] = True
                if k_eq_v and layer_type == "full_attention":
                    mixer["values_from_keys"] = True
                if index in lenders:
                    mixer["lends_kv"] = KV_NAMES[layer_type]
            else:
                mixer["kv_from"] = KV_NAMES[layer_type]
            mlp = {"kind": "glu", "hidden": hidden * (2 if double and source is not None else 1), "bias": False,
                   "activation": activation}
            blocks.append({"mixer": mixer, "mlp": mlp, "norm": rmsnorm_node(eps), "norm_placement": "sandwich",
                           "output_scale": True})
        common = common_fields(config)
        common["input"]["scale"] = math.sqrt(d_model)
        softcap = config.number("final_logit_softcapping", None) if config.data.get("final_logit_softcapping") else None
        head = {**head_node(config, True), **({"softcap": softcap} if softcap else {})}
        return {**common, "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps), "head": head}

    @staticmethod
    def _per_layer(config: Config, types: list[str], heads: int, kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
        """(key/value heads, head width) of each layer: the config's, overridden per layer by `per_layer_config`
        (what transformers 5 writes), or where that is absent, for the global layers by `global_head_dim` and,
        with `attention_k_eq_v`, `num_global_key_value_heads` (a released config's fields)."""
        overrides = config.get("per_layer_config", dict, None)
        if overrides is None:
            wide = config.count("global_head_dim", 512)
            fewer = config.count("num_global_key_value_heads", kv_heads) if config.get("attention_k_eq_v", bool, False) \
                else kv_heads
            return [(fewer, wide) if t == "full_attention" else (kv_heads, head_dim) for t in types]
        found = [(kv_heads, head_dim)] * len(types)
        for key, fields in overrides.items():
            at = f"per_layer_config.{key}"
            if not (isinstance(key, str) and key.isdigit() and int(key) < len(types)) or not isinstance(fields, dict):
                raise config.refuse(at, f"expected a layer index below {len(types)} mapping to fields")
            unknown = sorted(set(fields) - {"head_dim", "num_key_value_heads"})
            if unknown:
                raise config.refuse(f"{at}.{unknown[0]}", "a per-layer field attnspec does not read; head_dim and "
                                    "num_key_value_heads import")
            layer = Config(fields, config.source)
            layer_kv = layer.count("num_key_value_heads", kv_heads, limit=heads)
            if heads % layer_kv:
                raise config.refuse(f"{at}.num_key_value_heads", f"{layer_kv} key/value heads do not divide {heads} heads")
            found[int(key)] = (layer_kv, layer.count("head_dim", head_dim, limit=limits.MAX_HEAD_WIDTH))
        return found

    @staticmethod
    def _kv_sources(config: Config, types: list[str]) -> list[int | None]:
        """For each layer, the layer whose keys and values it reads: the last `num_kv_shared_layers` layers read
        the last unshared layer of their own type's (transformers' `kv_sharing_modes`), the others their own."""
        layers = len(types)
        shared = config.get("num_kv_shared_layers", int, 0)
        if not 0 <= shared < layers:
            raise config.refuse("num_kv_shared_layers", f"must be from 0 to {layers - 1}: with every layer shared, "
                                "the keys and values are another model's (Gemma 4's assistant models)")
        first = layers - shared
        sources: list[int | None] = [None] * layers
        for index in range(first, layers):
            unshared = [i for i in range(first) if types[i] == types[index]]
            if not unshared:
                raise config.refuse("num_kv_shared_layers", f"layer {index} ({types[index]}) shares the keys and "
                                    "values of an earlier unshared layer of its type, and there is none")
            sources[index] = unshared[-1]
        return sources

    @staticmethod
    def _rope(config: Config, layer_type: str, head_dim: int) -> dict:
        """The layer type's RoPE: `default` rotates the whole head (Gemma 4's ignores `partial_rotary_factor`),
        `proportional` the fraction's pairs spread over it; any `factor` stretches it linearly."""
        field = f"rope_parameters.{layer_type}"
        parameters = (config.get("rope_parameters", dict, None) or {}).get(layer_type)
        if not isinstance(parameters, dict):
            theta = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}[layer_type]
            parameters = {"rope_type": "default" if layer_type == "sliding_attention" else "proportional",
                          "rope_theta": theta, "partial_rotary_factor": 0.25}
        layer = Config(parameters, config.source)
        kind = layer.get("rope_type", str, "default")
        if kind not in ("default", "proportional"):
            raise config.refuse(f"{field}.rope_type", f"{kind!r}: Gemma 4's layers import with default or "
                                "proportional RoPE")
        node = {"kind": "rope", "base": layer.number("rope_theta", 10_000.0, positive=True)}
        factor = layer.number("factor", 1.0, positive=True)
        if factor != 1.0:
            node.update(scaling="linear", factor=factor)
        if kind == "proportional":
            fraction = layer.number("partial_rotary_factor", 1.0, positive=True)
            if fraction > 1:  # a share of the head (1e308 would also overflow the channel count below)
                raise config.refuse(f"{field}.partial_rotary_factor", f"is the share of a head its RoPE rotates: at "
                                    f"most 1, got {fraction:g}")
            if int(fraction * head_dim // 2) == 0:
                raise config.refuse(f"{field}.partial_rotary_factor", f"rotates no channel of a {head_dim}-wide head")
            node.update(proportional=True, rotary_fraction=int(fraction * head_dim // 2) * 2 / head_dim)
        return node

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        mixers = [b.mixer for b in blocks]
        if any(m.kind != "softmax" or b.norm_placement != "sandwich" or not b.output_scale or b.mlp.kind != "glu"
               for m, b in zip(mixers, blocks)):
            raise NotExpressible(f"{model_type} is softmax attention and a GLU with sandwich norms and an output scale "
                                 "in every block")
        types = ["full_attention" if m.window is None else "sliding_attention" for m in mixers]
        if types[-1] != "full_attention":
            raise NotExpressible(f"{model_type}'s last layer attends globally")
        shared = sum(m.kv_from is not None for m in mixers)
        first = len(mixers) - shared
        if any(m.kv_from is not None for m in mixers[:first]):
            raise NotExpressible(f"{model_type}'s layers reading another layer's keys and values are its last ones")
        expected = self._kv_sources(Config({"num_kv_shared_layers": shared}, "spec"), types)
        if kv_sources(spec) != expected:
            raise NotExpressible(f"{model_type}'s shared layers read the last unshared layer of their type")
        sliding = next((m for m in mixers if m.window is not None), mixers[0])
        heads, head_dim, kv_heads = sliding.heads, sliding.d_qk, sliding.kv_heads or sliding.heads
        per_layer = {}
        for index, m in enumerate(mixers):
            if m.heads != heads or m.d_qk != m.d_v:
                raise NotExpressible(f"{model_type} has one head count, and values as wide as keys")
            fields = {**({"head_dim": m.d_qk} if m.d_qk != head_dim else {}),
                      **({"num_key_value_heads": m.kv_heads or m.heads} if (m.kv_heads or m.heads) != kv_heads else {})}
            if fields:
                per_layer[str(index)] = fields
        unshared = [m for m in mixers if m.kv_from is None]
        k_eq_v = any(m.values_from_keys for m in unshared)
        if any(m.values_from_keys != (k_eq_v and m.window is None) or not m.v_norm for m in unshared) \
                or any(m.qk_norm != "rmsnorm" or m.scale != 1.0 for m in mixers):
            raise NotExpressible(f"{model_type} normalises q, k and v, scales by 1, and takes values from keys on "
                                 "every global layer or none")
        widths = {b.mlp.hidden for b in blocks[:first]}
        double = any(b.mlp.hidden != next(iter(widths)) for b in blocks[first:])
        if len(widths) > 1 or any(b.mlp.hidden != next(iter(widths)) * (2 if double else 1) for b in blocks[first:]):
            raise NotExpressible(f"{model_type}'s MLPs are one width, or twice it in the shared layers")
        rope = {}
        for layer_type, m in zip(types, mixers):
            position = m.position
            parameters = {"rope_type": "proportional" if position.proportional else "default", "rope_theta": position.base}
            if position.proportional:
                parameters["partial_rotary_factor"] = position.rotary_fraction
            elif position.rotary_fraction != 1.0:
                raise NotExpressible(f"{model_type}'s default RoPE rotates the whole head")
            if position.scaling == "linear":
                parameters["factor"] = position.factor
            elif position.scaling != "none" or position.interleaved or position.reverse:
                raise NotExpressible(f"{model_type}'s RoPE is default or proportional, stretched linearly at most")
            if rope.setdefault(layer_type, parameters) != parameters:
                raise NotExpressible(f"{model_type} has one RoPE per layer type")
        mlp = blocks[0].mlp
        return {"hidden_size": spec.d_model, "intermediate_size": next(iter(widths)), "num_hidden_layers": len(blocks),
                "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
                "per_layer_config": per_layer, "hidden_activation": ACTIVATION_NAMES[mlp.activation],
                "rms_norm_eps": blocks[0].norm.eps, "attention_bias": sliding.qkv_bias, "layer_types": types,
                "sliding_window": next((m.window for m in mixers if m.window is not None), 512),
                "rope_parameters": rope, "attention_k_eq_v": k_eq_v, "num_kv_shared_layers": shared,
                "use_double_wide_mlp": double, "final_logit_softcapping": spec.head.softcap,
                **({"hidden_size_per_layer_input": 0, "enable_moe_block": False} if model_type == "gemma4_text" else {})}

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            mixer = block.mixer
            projections = ["q", "o"] + (["k"] if mixer.kv_from is None else []) \
                + (["v"] if mixer.kv_from is None and not mixer.values_from_keys else [])
            links += [rename(f"{theirs}self_attn.{n}_proj.weight", f"{ours}mixer.{'out' if n == 'o' else n}_proj.weight")
                      for n in projections]
            if mixer.qkv_bias:
                links += [rename(f"{theirs}self_attn.{n}_proj.bias", f"{ours}mixer.{'out' if n == 'o' else n}_proj.bias")
                          for n in projections]
            links += [rename(f"{theirs}self_attn.{n}_norm.weight", f"{ours}mixer.qk_norm.{n}")
                      for n in ("q", "k")[:2 if mixer.kv_from is None else 1]]
            for their_norm, our_norm in (("input_layernorm", "norm1"), ("post_attention_layernorm", "post_norm1"),
                                         ("pre_feedforward_layernorm", "norm2"),
                                         ("post_feedforward_layernorm", "post_norm2")):
                links.append(rename(f"{theirs}{their_norm}.weight", f"{ours}{our_norm}.weight"))
            links += glu_links(f"{theirs}mlp.", f"{ours}mlp.", False)
            links.append(rename(f"{theirs}layer_scalar", f"{ours}output_scale"))
        return links


ARCHITECTURES = (Gemma4(),)
