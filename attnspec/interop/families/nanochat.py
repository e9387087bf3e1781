"""transformers' ``nanochat`` model type (Karpathy's nanochat) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, attention_links, block_prefix, expanded_blocks, head_node,
                                           rename)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class NanoChat(LlamaFamily):
    """nanochat: every norm an RMSNorm without a weight (`affine: false`: of the embeddings, before each sub-layer,
    at the end), RoPE turning each pair the other way (`reverse`) then an unweighted RMSNorm of each query and key
    head (`qk_norm: rmsnorm_unweighted`, `qk_norm_after_rope`), a plain MLP (``hidden_act``, squared ReLU), and
    logits soft-capped at ``final_logit_softcapping``."""

    ALIASES: dict[str, str] = {}
    model_types = ("nanochat",)
    causal_lm = {"nanochat": "NanoChatForCausalLM"}
    export_order = None

    rows = (
        Row(("nanochat",),
            "weightless RMSNorms (`affine: false`) on the embeddings, each sub-layer and the output; RoPE turning the "
            "other way (`reverse`), then a weightless QK-norm (`rmsnorm_unweighted`, `qk_norm_after_rope`); a plain "
            "MLP; logits soft-capped (`head.softcap`)",
            "as llama"),
    )

    def layer_mlp(self, config: Config, model_type: str) -> dict:
        return {"kind": "mlp", "hidden": config.count("intermediate_size"), "bias": False,
                "activation": config.activation(default="relu2")}

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        norm = {"kind": "rmsnorm", "eps": eps, "affine": False}
        mixer = {**blocks[0]["mixer"], "qk_norm": "rmsnorm_unweighted", "qk_norm_after_rope": True,
                 "position": {**blocks[0]["mixer"]["position"], "reverse": True}}
        data = self.assembled(config, [{**b, "mixer": mixer, "norm": norm} for b in blocks], eps)
        cap = config.number("final_logit_softcapping", 15.0, positive=True) \
            if config.data.get("final_logit_softcapping", 15.0) is not None else None
        data["input"]["norm"] = norm
        return {**data, "final_norm": norm, "head": {**head_node(config, False), **({"softcap": cap} if cap else {})}}

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        mixer, norm = first.mixer, first.norm
        if any(b != first for b in blocks) or norm.kind != "rmsnorm" or norm.affine \
                or spec.final_norm != norm or spec.input.norm != norm or mixer.kind != "softmax" \
                or mixer.qk_norm != "rmsnorm_unweighted" or not mixer.qk_norm_after_rope \
                or getattr(mixer.position, "kind", None) != "rope" or not mixer.position.reverse \
                or mixer.qkv_bias != mixer.out_bias or mixer.window is not None or first.mlp.kind != "mlp" \
                or first.mlp.bias or spec.head.scale not in (None, 1.0):
            raise NotExpressible("nanochat is alike blocks of weightless norms, reversed RoPE with a weightless "
                                 "QK-norm after it, and a plain MLP")
        position = mixer.position.model_copy(update={"reverse": False})
        config = {**self.shared_fields(spec, mixer.model_copy(update={"position": position})),
                  "num_hidden_layers": len(blocks), "attention_bias": mixer.qkv_bias,
                  "hidden_act": ACTIVATION_NAMES[first.mlp.activation], "rms_norm_eps": norm.eps,
                  "final_logit_softcapping": spec.head.softcap}
        config.pop("head_dim", None)  # nanochat's heads are hidden_size / heads wide (its config names no head_dim)
        if mixer.d_qk * mixer.heads != spec.d_model:
            raise NotExpressible("nanochat's heads are hidden_size / num_attention_heads wide")
        return config

    def links(self, spec) -> list[Link]:
        links = [rename("model.embed_tokens.weight", "embed.weight")]
        if not spec.head.tied:
            links.append(rename("lm_head.weight", "head.weight"))
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            links += attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}mlp.fc1.weight", f"{ours}mlp.up.weight"),
                      rename(f"{theirs}mlp.fc2.weight", f"{ours}mlp.down.weight")]
        return links


ARCHITECTURES = (NanoChat(),)
