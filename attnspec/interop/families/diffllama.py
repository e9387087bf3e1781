"""transformers' ``diffllama`` model type (Llama with differential attention) as attnspec specs, and back
(what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Link, Row, block_prefix, expanded_blocks, lm_links, rename
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def query_order(heads: int, kv_heads: int) -> tuple[int, ...]:
    """DiffLlama's query head behind each of attnspec's: transformers pairs head p with head p + heads / 2 (their
    keys p // g and p // g + kv_heads / 2, g = heads / kv_heads); attnspec pairs query head 2gi + t with
    2gi + g + t (keys 2i and 2i + 1). Ours m = 2gi + sg + t is theirs s heads / 2 + gi + t."""
    g = heads // kv_heads
    return tuple((m % (2 * g)) // g * (heads // 2) + m // (2 * g) * g + m % g for m in range(heads))


def key_order(kv_heads: int) -> tuple[int, ...]:
    """DiffLlama's key (and value) head behind each of attnspec's: ours 2i + s is theirs s kv_heads / 2 + i, so
    that attnspec's value head i, kv heads 2i and 2i + 1 side by side, is transformers' [v_i; v_(i + kv_heads / 2)]."""
    return tuple(j % 2 * (kv_heads // 2) + j // 2 for j in range(kv_heads))


class DiffLlama(LlamaFamily):
    """DiffLlama: Llama with differential attention (`differential: true`): transformers' pairs of heads (p and
    p + heads / 2) reordered into attnspec's (the q, k and v projections' rows permuted by head on import and back
    on export), λ's four vectors per layer, λ_init by depth, each pair RMS-normalised without a weight."""

    ALIASES: dict[str, str] = {}
    model_types = ("diffllama",)
    causal_lm = {"diffllama": "DiffLlamaForCausalLM"}
    export_order = None

    rows = (
        Row(("diffllama",),
            "llama with differential attention (`differential: true`: each pair of heads attends with the difference "
            "of two softmax maps weighted by a learnt λ, λ_init = 0.8 - 0.6 exp(-0.3 l) by depth; transformers' "
            "pairs, heads p and p + heads / 2, reordered head by head into attnspec's)",
            "an odd `num_key_value_heads` (transformers refuses it too); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, "llama")
        kv_heads = blocks[0]["mixer"].get("kv_heads", blocks[0]["mixer"]["heads"])
        if kv_heads % 2:
            raise config.refuse("num_key_value_heads", f"differential attention pairs key/value heads, and there are "
                                                       f"{kv_heads}: an even number imports")
        return self.assembled(config, [{**block, "mixer": {**block["mixer"], "differential": True}}
                                       for block in blocks], eps)

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        if any(not getattr(b.mixer, "differential", False) or getattr(b.mixer, "window", None) or b.mixer.qk_norm
               != "none" or b.mlp.kind != "glu" for b in blocks):
            raise NotExpressible("diffllama has differential attention without windows or QK-norm and a GLU MLP in "
                                 "every block")
        config = super().config(spec, "llama")
        config.pop("mlp_bias")
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours, mixer = f"model.layers.{index}.self_attn.", f"{block_prefix(index)}mixer.", block.mixer
            kv_heads = mixer.kv_heads or mixer.heads
            orders = {"q": query_order(mixer.heads, kv_heads), "k": key_order(kv_heads), "v": key_order(kv_heads)}
            for stream, order in orders.items():
                links.append(Link(f"{theirs}{stream}_proj.weight", (f"{ours}{stream}_proj.weight",), order=order))
                if mixer.qkv_bias:
                    links.append(Link(f"{theirs}{stream}_proj.bias", (f"{ours}{stream}_proj.bias",), order=order))
            links.append(rename(f"{theirs}o_proj.weight", f"{ours}out_proj.weight"))
            if mixer.out_bias:
                links.append(rename(f"{theirs}o_proj.bias", f"{ours}out_proj.bias"))
            links += [rename(f"{theirs}{name}", f"{ours}lambdas.{name}") for name in LAMBDAS]
            links += [rename(f"model.layers.{index}.{name}.weight", f"{block_prefix(index)}{norm}.weight")
                      for name, norm in zip(self.NORM_NAMES, ("norm1", "norm2"))]
            links += self.mlp_links(block.mlp, f"model.layers.{index}.mlp.", f"{block_prefix(index)}mlp.")
        return links


ARCHITECTURES = (DiffLlama(),)
