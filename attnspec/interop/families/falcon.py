"""transformers' ``falcon`` model type (TII's Falcon) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, head_node, rename, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class Falcon(Architecture):
    """Falcon: RoPE attention (q, k and v packed in ``query_key_value`` as its layout says: per key/value group
    with ``new_decoder_architecture``, all queries then one key and one value with ``multi_query``, per head
    otherwise) and a plain MLP ``ffn_hidden_size`` wide, both with biases where ``bias``, under LayerNorms with
    biases. The block: with ``new_decoder_architecture``, attention and MLP side by side on their own norms
    (``ln_attn``, ``ln_mlp``: ``parallel: own_norms``) or on one (``num_ln_in_parallel_attn: 1``); otherwise side
    by side on one norm (``parallel_attn``: ``parallel: shared_norm``) or one after the other. A tied head by
    default. Falcon-RW's ALiBi (``alibi``) is refused: transformers divides its bias by sqrt(head_dim) before
    the softmax scale, which attnspec's ALiBi does not."""

    model_types = ("falcon",)
    causal_lm = {"falcon": "FalconForCausalLM"}
    config_fields = {"falcon": {"n_embed": "hidden_size", "n_head": "num_attention_heads",
                                "n_layer": "num_hidden_layers"}}

    rows = (
        Row(("falcon",),
            "RoPE attention with q/k/v packed in each of Falcon's three layouts (grouped per key/value head, "
            "multi-query, per head) and a plain MLP, biases with `bias`, under biased LayerNorms; the block side "
            "by side on two norms (`new_decoder_architecture`), on one (`parallel_attn`) or sequential",
            "`alibi` (Falcon-RW: transformers divides the bias by sqrt(head_dim)); RoPE scalings as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("alibi", bool, False):
            raise config.refuse("alibi", "Falcon's ALiBi bias is divided by sqrt(head_dim) before the softmax scale, "
                                         "which attnspec's ALiBi does not do; false (RoPE) imports")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        width, heads = config.count("hidden_size"), config.count("num_attention_heads")
        if width % heads:
            raise config.refuse("num_attention_heads", f"{heads} heads do not divide hidden_size = {width}")
        head_dim = width // heads
        layout = self.layout(config)
        kv_heads = {"grouped": config.count("num_kv_heads", heads), "multi_query": 1, "per_head": heads}[layout]
        if heads % kv_heads:
            raise config.refuse("num_kv_heads", f"{kv_heads} key/value heads do not divide the {heads} heads")
        bias = config.get("bias", bool, False)
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_epsilon", 1e-5, positive=True)}
        mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                 "out_bias": bias, "position": config.rope(head_dim),
                 **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        hidden = config.count("ffn_hidden_size", 4 * width) if config.data.get("ffn_hidden_size") is not None \
            else 4 * width
        block = {"mixer": mixer, "mlp": {"kind": "mlp", "hidden": hidden, "bias": bias,
                                         "activation": config.activation("activation", default="gelu")},
                 "norm": norm, "parallel": self.parallel(config)}
        return {**common_fields(config), "layers": compress_layers([block] * layers), "final_norm": norm,
                "head": head_node(config, True)}

    @staticmethod
    def layout(config: Config) -> str:
        """How ``query_key_value`` packs q, k and v: ``grouped`` (per key/value group: its queries, its key, its
        value), ``multi_query`` (every query, then one key and one value) or ``per_head`` (each head's q, k, v)."""
        if config.get("new_decoder_architecture", bool, False):
            return "grouped"
        return "multi_query" if config.get("multi_query", bool, True) else "per_head"

    @staticmethod
    def parallel(config: Config) -> str:
        """The block's ``parallel`` as transformers' FalconDecoderLayer arranges it."""
        if config.get("new_decoder_architecture", bool, False):
            norms = config.data.get("num_ln_in_parallel_attn") or 2
            if norms not in (1, 2):
                raise config.refuse("num_ln_in_parallel_attn", f"{norms!r}: 1 or 2 norms")
            if norms == 1 and not config.get("parallel_attn", bool, True):
                raise config.refuse("parallel_attn", "transformers' Falcon with one norm in the new decoder "
                                                     "architecture runs only in parallel; true imports")
            return "own_norms" if norms == 2 else "shared_norm"
        return "shared_norm" if config.get("parallel_attn", bool, True) else "none"

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer, mlp = first.mixer, first.mlp
        if any(b != first for b in blocks) or spec.final_norm != first.norm or first.norm.kind != "layernorm" \
                or not first.norm.bias or mlp.kind != "mlp" or mlp.bias != mixer.qkv_bias \
                or mixer.kind != "softmax" or getattr(mixer.position, "kind", None) != "rope" \
                or mixer.qkv_bias != mixer.out_bias or mixer.heads * mixer.d_qk != spec.d_model \
                or mixer.d_qk != mixer.d_v or mixer.qk_norm != "none" or getattr(mixer, "window", None) is not None \
                or mixer.position.interleaved or mixer.position.rotary_fraction != 1.0 \
                or mixer.scale not in (None, mixer.d_qk ** -0.5) or first.norm_placement != "pre":
            raise NotExpressible("falcon is alike blocks of RoPE attention and a plain MLP under biased LayerNorms, "
                                 "biases on all or none")
        kv = mixer.kv_heads or mixer.heads
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                  "ffn_hidden_size": mlp.hidden, "activation": ACTIVATION_NAMES[mlp.activation],
                  "layer_norm_epsilon": first.norm.eps, "bias": mixer.qkv_bias, "alibi": False,
                  "rope_parameters": rope_config(mixer.position), "tie_word_embeddings": spec.head.tied}
        if first.parallel == "own_norms" or (first.parallel == "shared_norm" and kv not in (1, mixer.heads)):
            return {**config, "new_decoder_architecture": True, "num_kv_heads": kv, "parallel_attn": True,
                    "num_ln_in_parallel_attn": 2 if first.parallel == "own_norms" else 1}
        if kv not in (1, mixer.heads):
            raise NotExpressible("falcon's sequential blocks have one key/value head or one per head")
        return {**config, "new_decoder_architecture": False, "multi_query": kv == 1, "num_kv_heads": kv,
                "parallel_attn": first.parallel == "shared_norm"}

    def links(self, spec) -> list[Link]:
        links = [rename("transformer.word_embeddings.weight", "embed.weight")]
        links += [rename(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"transformer.h.{index}.", block_prefix(index)
            mixer = block.mixer
            # per key/value head: its queries, its key, its value (multi-query: one group, all queries first;
            # one key/value head per head: each head's q, k, v in turn)
            groups = mixer.kv_heads or mixer.heads
            kinds = ("weight", "bias") if mixer.qkv_bias else ("weight",)
            links += [Link(f"{theirs}self_attention.query_key_value.{kind}",
                           tuple(f"{ours}mixer.{n}_proj.{kind}" for n in "qkv"), groups=groups) for kind in kinds]
            links += [rename(f"{theirs}self_attention.dense.{kind}", f"{ours}mixer.out_proj.{kind}") for kind in kinds]
            mlp_kinds = ("weight", "bias") if block.mlp.bias else ("weight",)
            links += [rename(f"{theirs}mlp.dense_{t}.{p}", f"{ours}mlp.{o}.{p}")
                      for t, o in (("h_to_4h", "up"), ("4h_to_h", "down")) for p in mlp_kinds]
            norms = {"own_norms": (("ln_attn", "norm1"), ("ln_mlp", "norm2")),
                     "shared_norm": (("input_layernorm", "norm1"),),
                     "none": (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"))}[block.parallel]
            links += [rename(f"{theirs}{t}.{p}", f"{ours}{o}.{p}") for t, o in norms for p in ("weight", "bias")]
        return links


ARCHITECTURES = (Falcon(),)
