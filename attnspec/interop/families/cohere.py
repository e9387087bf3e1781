"""transformers' ``cohere`` model type (Cohere Command R) as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import (Link, Row, common_fields, compress_layers, expanded_blocks, head_node,
                                           rope_config)
from attnspec.interop.config import Config, NotExpressible
from attnspec.interop.families.llama import LlamaFamily


class Cohere(LlamaFamily):
    """Command R: Llama's attention (RoPE on interleaved pairs) and GLU MLP side by side on one bias-free
    LayerNorm's output (``parallel: shared_norm``, ``layernorm`` with ``bias: false``), the logits times
    ``logit_scale`` (``head.scale``) from a head tied by default."""

    ALIASES: dict[str, str] = {}
    model_types = ("cohere",)
    causal_lm = {"cohere": "CohereForCausalLM"}
    export_order = None

    rows = (
        Row(("cohere",),
            "llama's attention (interleaved RoPE) and GLU MLP side by side on one bias-free LayerNorm "
            "(`parallel: shared_norm`), `logit_scale` as `head.scale`",
            "LayerNorms of q and k per head (`use_qk_norm`); as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        if config.get("use_qk_norm", bool, False):
            raise config.refuse("use_qk_norm", "LayerNorms of each head's q and k with a weight per head: attnspec's "
                                               "QK-norm is an RMSNorm shared by the heads")
        blocks, _ = self.layer_blocks(config, "llama")
        norm = {"kind": "layernorm", "eps": config.number("layer_norm_eps", 1e-5, positive=True), "bias": False}
        mixer = blocks[0]["mixer"]
        mixer = {**mixer, "position": {**mixer["position"], "interleaved": True}}
        blocks = [{**block, "mixer": mixer, "norm": norm, "parallel": "shared_norm"} for block in blocks]
        head = {**head_node(config, True), "scale": config.number("logit_scale", 0.0625, positive=True)}
        return {**common_fields(config), "layers": compress_layers(self.per_layer(config, blocks)),
                "final_norm": norm, "head": head}

    def per_layer(self, config: Config, blocks: list[dict]) -> list[dict]:
        """The blocks as each layer has them (Command R's are all alike)."""
        return blocks

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        first = blocks[0]
        if any(b.parallel != "shared_norm" or b.norm != first.norm for b in blocks) or spec.final_norm != first.norm \
                or first.norm.kind != "layernorm" or first.norm.bias \
                or not getattr(first.mixer.position, "interleaved", False):
            raise NotExpressible("cohere is parallel blocks on one bias-free LayerNorm with interleaved RoPE")
        config = super().config(spec, "llama")
        for field in ("rms_norm_eps", "mlp_bias"):
            config.pop(field, None)
        return {**config, "layer_norm_eps": first.norm.eps, "logit_scale": spec.head.scale, "use_qk_norm": False}

    def links(self, spec) -> list[Link]:  # one norm a layer: no post_attention_layernorm
        return [link for link in super().links(spec) if ".post_attention_layernorm." not in link.theirs]


class Cohere2(Cohere):
    """Command R7B (``cohere2``): Command R's parallel blocks, each layer windowed with RoPE or global without
    positions (NoPE) by ``layer_types`` (three windowed to one global by default)."""

    model_types = ("cohere2",)
    causal_lm = {"cohere2": "Cohere2ForCausalLM"}
    rows = (
        Row(("cohere2",),
            "cohere's parallel blocks, windowed layers with interleaved RoPE and global ones without positions, by "
            "`layer_types` (`sliding_window_pattern`, 4 by default)",
            "as cohere"),
    )

    def per_layer(self, config: Config, blocks: list[dict]) -> list[dict]:
        window = config.count("sliding_window", 4096)
        pattern = config.count("sliding_window_pattern", 4)
        types = config.attention_layer_types(len(blocks), ["sliding_attention" if (i + 1) % pattern
                                                           else "full_attention" for i in range(len(blocks))])
        layers = []
        for block, layer_type in zip(blocks, types):
            mixer = dict(block["mixer"])
            if layer_type == "sliding_attention":
                mixer["window"] = window
            else:
                mixer["position"] = {"kind": "none"}
            layers.append({**block, "mixer": mixer})
        return layers

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        windows = [block.mixer.window for block in blocks]
        window = next((w for w in windows if w is not None), None)
        rotary = [block.mixer.position is not None and block.mixer.position.kind == "rope" for block in blocks]
        if window is None or any(w not in (None, window) for w in windows) \
                or rotary != [w is not None for w in windows]:
            raise NotExpressible("cohere2 has one window, with RoPE on its windowed layers and none on the others")
        rope_block = blocks[rotary.index(True)]
        shaped = spec.model_copy(update={"layers": [rope_block.model_copy(update={
            "mixer": rope_block.mixer.model_copy(update={"window": None})})] * len(blocks)})
        config = super().config(shaped, "cohere")
        return {**config, "sliding_window": window,
                "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows]}


class CohereCompass(Cohere2):
    """Cohere's Compass text model (``cohere_compass_text``): Command R7B's parallel blocks with RoPE on the layer
    types ``rope_parameters`` gives parameters (pairs in halves, not interleaved: its multimodal RoPE reduces to
    plain RoPE on text) and none on those it maps to null, windows on the ``sliding_attention`` layers, the logits
    times ``logit_scale`` (1 where unset)."""

    model_types = ("cohere_compass_text",)
    causal_lm = {"cohere_compass_text": "CohereCompassForCausalLM"}
    rows = (
        Row(("cohere_compass_text",),
            "cohere2's parallel blocks with RoPE (pairs in halves) per layer type where `rope_parameters` gives it "
            "and none where null, windows on `sliding_attention` layers, `logit_scale` (1 unset)",
            "as cohere"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        parameters = config.get("rope_parameters", dict, None)
        if parameters is None:
            raise config.refuse("rope_parameters", "Compass gives RoPE parameters per layer type (null: no "
                                "positions); a config without them is not one transformers reads")
        return super().spec(Config({**config.data, "logit_scale": config.data.get("logit_scale") or 1.0},
                                   config.source), model_type)

    def per_layer(self, config: Config, blocks: list[dict]) -> list[dict]:
        window = config.count("sliding_window", 4096)
        types = config.attention_layer_types(len(blocks), ["full_attention"] * len(blocks))
        parameters = config.get("rope_parameters", dict)
        head_dim = blocks[0]["mixer"]["d_qk"]
        layers = []
        for block, layer_type in zip(blocks, types):
            rotated = parameters.get(layer_type) is not None
            mixer = {**block["mixer"], "position": config.rope(head_dim, layer_type=layer_type) if rotated
                     else {"kind": "none"}}
            if layer_type == "sliding_attention":
                mixer["window"] = window
            layers.append({**block, "mixer": mixer})
        return layers

    def config(self, spec, model_type: str) -> dict:
        blocks = expanded_blocks(spec)
        windows = [block.mixer.window for block in blocks]
        types = ["full_attention" if w is None else "sliding_attention" for w in windows]
        rope: dict = {}
        for layer_type, block in zip(types, blocks):
            position = block.mixer.position
            here = rope_config(position) if getattr(position, "kind", None) == "rope" else None
            if getattr(position, "interleaved", False) or rope.setdefault(layer_type, here) != here:
                raise NotExpressible("cohere_compass_text has one RoPE (pairs in halves) or none per layer type")
        if len({w for w in windows if w is not None}) > 1:
            raise NotExpressible("cohere_compass_text has one window")
        rotated = next((b for b in blocks if getattr(b.mixer.position, "kind", None) == "rope"), None)
        if rotated is None:
            raise NotExpressible("cohere_compass_text rotates some layer type: a spec without RoPE is no Compass")
        # Command R's checks and fields, from a block as they read it (interleaved; its own RoPE is written above)
        interleaved = rotated.mixer.position.model_copy(update={"interleaved": True})
        shaped = spec.model_copy(update={"layers": [rotated.model_copy(update={"mixer": rotated.mixer.model_copy(
            update={"window": None, "position": interleaved})})] * len(blocks)})
        config = Cohere.config(self, shaped, "cohere")
        return {**config, "sliding_window": next((w for w in windows if w), 4096), "layer_types": types,
                "rope_parameters": rope}


ARCHITECTURES = (Cohere(), Cohere2(), CohereCompass())
