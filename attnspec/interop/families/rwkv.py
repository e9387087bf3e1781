"""transformers' ``rwkv`` model type (RWKV-4) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Architecture, Link, Row, block_prefix, common_fields, compress_layers,
                                           expanded_blocks, rename)
from attnspec.interop.config import Config, NotExpressible
from attnspec.spec import limits

FINAL_EPS = 1e-5
"""RWKV's last LayerNorm (``ln_out``) is PyTorch's default, whatever ``layer_norm_epsilon`` says."""


class Rwkv(Architecture):
    """RWKV-4: a LayerNorm of the embeddings (``pre_ln``: ``input.norm``), then per layer its time mixing and its
    channel mixing, each under a LayerNorm with a residual: two attnspec blocks per RWKV layer (the `rwkv` and
    `rwkv_channel` mixers, each looking back one position). transformers' inference rescaling is reproduced exactly:
    with ``rescale_every`` R, layer i's two outputs are multiplied by 2^-(i // R) (transformers divides the
    weights) and the hidden state is halved after every R-th layer (the channel block's `skip_scale` and
    `residual_scale` halved)."""

    model_types = ("rwkv",)
    causal_lm = {"rwkv": "RwkvForCausalLM"}

    rows = (
        Row(("rwkv",),
            "RWKV-4: each layer two blocks, its time mixing (the `rwkv` mixer: token shift, the WKV operator with "
            "its bonus `time_first` and decay `time_decay`, in log space in every mode) and its channel mixing "
            "(`rwkv_channel`), under biased LayerNorms; `pre_ln` as `input.norm`; `rescale_every` as the blocks' "
            "residual scales (exactly transformers' inference)",
            "packed documents (RWKV's mixers do not restart at a document's start)"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS // 2)
        d = config.count("hidden_size")
        eps = config.number("layer_norm_epsilon", 1e-5, positive=True)
        rescale = config.get("rescale_every", int, 6)
        if rescale < 0:
            raise config.refuse("rescale_every", f"must be 0 (none) or positive, got {rescale}")
        norm = {"kind": "layernorm", "eps": eps}
        time = {"kind": "rwkv", "width": config.count("attention_hidden_size", d, limit=limits.MAX_INNER)}
        channel = {"kind": "rwkv_channel", "hidden": config.count("intermediate_size", 4 * d, limit=limits.MAX_INNER)}
        blocks = []
        for i in range(layers):
            scale = 2.0 ** -(i // rescale) if rescale else 1.0
            halved = rescale and (i + 1) % rescale == 0  # transformers halves the hidden state after this layer
            blocks += [{"mixer": time, "mlp": "none", "norm": norm, "residual_scale": scale},
                       {"mixer": channel, "mlp": "none", "norm": norm,
                        "residual_scale": scale / 2 if halved else scale, "skip_scale": 0.5 if halved else 1.0}]
        common = common_fields(config)  # (its dtype: a bfloat16 release stays bfloat16)
        return {**common, "input": {**common["input"], "norm": norm},
                "max_len": config.count("context_length", 1024, limit=limits.MAX_LEN), "layers": compress_layers(blocks),
                "final_norm": {"kind": "layernorm", "eps": FINAL_EPS},
                "head": {"kind": "lm", "tied": config.get("tie_word_embeddings", bool, False), "scale": 1.0}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        kinds = [b.mixer.kind for b in blocks]
        if len(blocks) % 2 or kinds != ["rwkv", "rwkv_channel"] * (len(blocks) // 2) or any(
                b.mlp.kind != "none" or b.norm.kind != "layernorm" or b.norm_placement != "pre" for b in blocks):
            raise NotExpressible("rwkv is a time-mixing block then a channel-mixing block per layer, each under a "
                                 "LayerNorm")
        layers = len(blocks) // 2
        return {"vocab_size": spec.input.vocab_size, "hidden_size": spec.d_model, "num_hidden_layers": layers,
                "attention_hidden_size": blocks[0].mixer.width, "intermediate_size": blocks[1].mixer.hidden,
                "layer_norm_epsilon": blocks[0].norm.eps, "context_length": spec.max_len,
                "rescale_every": self._rescale_every(blocks, layers),
                "tie_word_embeddings": spec.head.tied}

    @staticmethod
    def _rescale_every(blocks: list, layers: int) -> int:
        """The ``rescale_every`` whose scales the blocks hold (0: none), or NotExpressible."""
        scales = [b.scales()[0] for b in blocks]  # (skip, output) of each block's mixer (it has no MLP)
        for rescale in [0] + list(range(1, layers + 1)):
            expected = []
            for i in range(layers):
                scale = 2.0 ** -(i // rescale) if rescale else 1.0
                halved = rescale and (i + 1) % rescale == 0
                expected += [(1.0, scale), (0.5, scale / 2) if halved else (1.0, scale)]
            if scales == expected:
                return rescale
        raise NotExpressible("rwkv's only residual scales are its `rescale_every` halvings")

    def links(self, spec) -> list[Link]:
        d = spec.d_model
        links = [rename("rwkv.embeddings.weight", "embed.weight")]
        links += [rename(f"rwkv.blocks.0.pre_ln.{p}", f"embed_norm.{p}") for p in ("weight", "bias")]
        links += [rename(f"rwkv.ln_out.{p}", f"final_norm.{p}") for p in ("weight", "bias")]
        if not spec.head.tied:
            links.append(rename("head.weight", "head.weight"))
        for index in range(len(expanded_blocks(spec)) // 2):
            theirs = f"rwkv.blocks.{index}."
            time, channel = block_prefix(2 * index), block_prefix(2 * index + 1)
            links += [rename(f"{theirs}{norm}.{p}", f"{ours}norm1.{p}") for norm, ours in
                      (("ln1", time), ("ln2", channel)) for p in ("weight", "bias")]
            links += [rename(f"{theirs}attention.{name}", f"{time}mixer.{name}") for name in
                      ("time_decay", "time_first", "key.weight", "value.weight", "receptance.weight",
                       "output.weight")]
            links += [Link(f"{theirs}attention.time_mix_{name}", (f"{time}mixer.time_mix_{name}",), view=(1, 1, d))
                      for name in ("key", "value", "receptance")]
            links += [rename(f"{theirs}feed_forward.{name}.weight", f"{channel}mixer.{name}.weight")
                      for name in ("key", "receptance", "value")]
            links += [Link(f"{theirs}feed_forward.time_mix_{name}", (f"{channel}mixer.time_mix_{name}",),
                           view=(1, 1, d)) for name in ("key", "receptance")]
        return links


ARCHITECTURES = (Rwkv(),)
