"""transformers' ``zamba2`` model type as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

import math
import re

from attnspec.interop.architecture import (Architecture, Copy, Link, Row, attention_links, block_prefix, common_fields,
                                           compress_layers, expanded_blocks, head_node, lm_links, rename,
                                           rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.mamba2 import mamba2_config, mamba2_links, mamba2_mixer
from attnspec.spec import limits


class Zamba2(Architecture):
    """Zamba2: Mamba2 blocks; at the ``hybrid`` layers each also calls one of ``num_mem_blocks`` shared
    attention blocks (in turn) on [hidden, embeddings] (a `shared` block reading `hidden_and_embeddings`:
    RMSNorm over 2 d_model, attention with head width 2 d_model / heads and scale (head width / 2)^-1/2,
    no residual, RMSNorm, a GLU MLP), maps its output by the layer's own `linear` and adds it to the Mamba2
    block's input before its norm. Each call has its own LoRA adapters on the MLP's fused gate_up and,
    with ``use_shared_attention_adapter``, on q, k and v. The Mamba2 gated norm's eps is 1e-5 and Δ is
    clamped below at ``time_step_min`` (transformers' full-sequence path; its one-token step leaves Δ
    unclamped, which differs only where softplus(Δ) < time_step_min)."""

    model_types = ("zamba2",)
    causal_lm = {"zamba2": "Zamba2ForCausalLM"}
    FIELDS = {"heads": "n_mamba_heads", "head_dim": "mamba_headdim", "expand": "mamba_expand",
              "state": "mamba_d_state", "groups": "mamba_ngroups", "conv": "mamba_d_conv",
              "conv_bias": "use_conv_bias", "chunk": "chunk_size", "bias": "add_bias_linear",
              "eps": "mamba_gated_norm_eps", "act": "mamba_activation"}
    """Where a Zamba2 config states the Mamba2 sizes; the gated norm's eps and the convolution's SiLU are
    fixed in transformers' code (the two names are no config's, so their defaults hold)."""

    rows = (
        Row(("zamba2",),
            "Mamba2 blocks (Δ clamped below at `time_step_min`); each `hybrid` layer calls one of `num_mem_blocks` "
            "**shared blocks** in turn (the spec's `shared:` list, named by the block's `shared: {name: ...}`): "
            "RMSNorm over [hidden, embeddings] (`reads: hidden_and_embeddings`), attention with head width 2 d / "
            "heads and scale (head width / 2)^-1/2 (RoPE with `use_mem_rope`), no residual, RMSNorm, a GLU; the "
            "call's own `linear` as its `projection`, added to the Mamba2 block's input before its norm; each call's "
            "LoRA adapters (`adapter_rank`) on the MLP's fused gate_up and, with `use_shared_attention_adapter`, on "
            "q, k, v. The shared weights are stored once (`shared_blocks.<name>.` in attnspec's state dict, the first"
            " call's layer in transformers')",
            "`add_bias_linear` (as mamba2's bias); attention adapters with fewer key/value heads than heads "
            "(transformers' adapters are 2 d wide, so its own model fails there)"),
    )

    @staticmethod
    def _hybrid_layers(config: Config, layers: int) -> list[int]:
        types = config.get("layers_block_type", list, None)
        if types is None or len(types) != layers or not all(t in ("mamba", "linear_attention", "hybrid")
                                                                for t in types):
            raise config.refuse("layers_block_type", f"must list `linear_attention` or `hybrid` for each of the "
                                f"{layers} layers")
        return [i for i, kind in enumerate(types) if kind == "hybrid"]

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        d_model = config.count("hidden_size")
        hybrid = self._hybrid_layers(config, layers)
        heads = config.count("num_attention_heads")
        kv_heads = config.count("num_key_value_heads", heads)
        if 2 * d_model % heads or heads % kv_heads:
            raise config.refuse("num_attention_heads", f"{heads} heads must divide 2 * hidden_size and share "
                                f"{kv_heads} key/value heads equally")
        head_dim = 2 * d_model // heads
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                     "scale": (head_dim / 2) ** -0.5,
                     "position": config.rope(head_dim) if config.get("use_mem_rope", bool, False) else "none",
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        bias = config.get("add_bias_linear", bool, False)
        mlp = {"kind": "glu", "hidden": config.count("intermediate_size", 4 * d_model),
               "activation": config.activation("hidden_act"), "bias": bias}
        attention_adapters = config.get("use_shared_attention_adapter", bool, False)
        if attention_adapters and kv_heads != heads:
            raise config.refuse("num_key_value_heads", "transformers' q/k/v adapters are 2 * hidden_size wide, so "
                                "with use_shared_attention_adapter the key/value heads must be all the heads")
        memories = min(config.count("num_mem_blocks", 1, limit=limits.MAX_BLOCKS), len(hybrid))
        shared = [{"name": f"memory{b}", "reads": "hidden_and_embeddings", "adapter_rank": config.count("adapter_rank"),
                   "adapt": ["q", "k", "v", "mlp"] if attention_adapters else ["mlp"],
                   "block": {"mixer": attention, "mlp": mlp, "norm": rmsnorm_node(eps), "residual": False}}
                  for b in range(memories)]
        mamba = mamba2_mixer(config, self.FIELDS, dt_limit=(config.number("time_step_min", 0.001), math.inf))
        blocks = [{"mixer": mamba, "mlp": "none", "norm": rmsnorm_node(eps),
                   **({"shared": {"name": f"memory{hybrid.index(i) % memories}"}} if i in hybrid else {})}
                  for i in range(layers)]
        return {**common_fields(config), "shared": shared, "layers": compress_layers(blocks),
                "final_norm": rmsnorm_node(eps), "head": head_node(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        uses = [block.shared.name for block in blocks if block.shared is not None]
        names = [shared.name for shared in spec.shared]
        if (not spec.shared or any(block.mixer.kind != "linear" or not block.mlp.is_identity for block in blocks)
                or uses[:len(names)] != names or any(use != names[j % len(names)] for j, use in enumerate(uses))):
            raise NotExpressible("zamba2 is Mamba2 blocks calling its shared attention blocks in turn")
        first, mamba = spec.shared[0], blocks[0].mixer
        attention, mlp = first.block.mixer, first.block.mlp
        rope = attention.position.kind == "rope"
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                "layers_block_type": ["hybrid" if block.shared is not None else "linear_attention" for block in blocks],
                "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                "intermediate_size": mlp.hidden, "hidden_act": ACTIVATION_NAMES[mlp.activation],
                "add_bias_linear": mlp.bias, "num_mem_blocks": len(names), "adapter_rank": first.adapter_rank,
                "use_shared_attention_adapter": "q" in first.adapt, "use_mem_rope": rope,
                **({"rope_parameters": rope_config(attention.position)} if rope else {}),
                **mamba2_config(mamba, spec.d_model, self.FIELDS), "time_step_min": mamba.transition.dt_min or 0.0,
                "tie_word_embeddings": spec.head.tied}

    def _canonical(self, spec) -> dict[str, int]:
        """Each shared block's name -> the layer whose ``shared_transformer`` holds its weights (its first use)."""
        found: dict[str, int] = {}
        for index, block in enumerate(expanded_blocks(spec)):
            if block.shared is not None:
                found.setdefault(block.shared.name, index)
        return found

    def copy_of(self, name: str, spec, config: dict) -> Copy | None:
        """A later use's ``shared_transformer`` tensor: a copy of the first use's (save_pretrained writes the
        first use alone; a checkpoint written with them all repeats the same numbers, and transformers unties
        a later use whose numbers differ, which a shared block cannot be)."""
        match = re.match(r"model\.layers\.(\d+)\.shared_transformer\.", name)
        blocks = expanded_blocks(spec)
        index = int(match.group(1)) if match is not None and len(match.group(1)) < 6 else -1
        if not 0 <= index < len(blocks) or blocks[index].shared is None:
            return None
        first = self._canonical(spec)[blocks[index].shared.name]
        if first == index:
            return None
        return Copy(f"model.layers.{first}.shared_transformer.{name[match.end():]}", lambda tensor: tensor,
                    what=f"a copy of the shared block's weights in layer {first}, which layer {index} calls")

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        canonical = self._canonical(spec)
        for shared in spec.shared:
            theirs, ours = f"model.layers.{canonical[shared.name]}.shared_transformer.", f"shared_blocks.{shared.name}."
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", False)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight"),
                      Link(f"{theirs}feed_forward.gate_up_proj.weight", (f"{ours}mlp.up.weight", f"{ours}mlp.gate.weight")),
                      rename(f"{theirs}feed_forward.down_proj.weight", f"{ours}mlp.down.weight")]
            if shared.block.mlp.bias:
                links += [Link(f"{theirs}feed_forward.gate_up_proj.bias", (f"{ours}mlp.up.bias", f"{ours}mlp.gate.bias")),
                          rename(f"{theirs}feed_forward.down_proj.bias", f"{ours}mlp.down.bias")]
        use = 0
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            if block.shared is None:
                links += mamba2_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
                links.append(rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"))
                continue
            links += mamba2_links(block.mixer, f"{theirs}mamba_decoder.mamba.", f"{ours}mixer.")
            links += [rename(f"{theirs}mamba_decoder.input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}linear.weight", f"{ours}shared_use.proj.weight")]
            memory = f"model.layers.{canonical[block.shared.name]}.shared_transformer."
            shared = next(s for s in spec.shared if s.name == block.shared.name)
            for target in shared.adapt:
                adapter = (f"{memory}feed_forward.gate_up_proj_adapter_list.{use}." if target == "mlp" else
                           f"{memory}self_attn.linear_{target}_adapter_list.{use}.")
                links += [rename(f"{adapter}0.weight", f"{ours}shared_use.adapters.{target}.down.weight"),
                          rename(f"{adapter}1.weight", f"{ours}shared_use.adapters.{target}.up.weight")]
            use += 1
        return links


ARCHITECTURES = (Zamba2(),)
