"""transformers' ``llama``, ``mistral``, ``qwen2``, ``qwen3`` model types (and the types that are Llama under
another name) as attnspec specs, and back (what a family states: :mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from typing import Any

from attnspec.interop.architecture import (Architecture, Link, Row, Wrapper, attention_links, block_prefix,
                                           common_fields, compress_layers, expanded_blocks, glu_links, glu_node,
                                           head_node, lm_links, rename, rmsnorm_node, rope_config)
from attnspec.interop.config import ACTIVATION_NAMES, Config, NotExpressible
from attnspec.spec import limits


class LlamaFamily(Architecture):
    """Llama-style decoders: RMSNorm, GQA softmax attention with RoPE, a SiLU GLU MLP. Mistral adds a
    sliding window, Qwen2 q/k/v biases and per-layer windows, Qwen3 QK-norm."""

    ALIASES = {"internlm3": "llama", "iquestcoder": "llama", "exaone": "llama"}
    """Types whose transformers model is another's own class (transformers 5.24's causal-LM mapping names
    LlamaForCausalLM for these) and whose configs hold nothing else: they read and write as that type."""
    model_types = ("llama", "mistral", "qwen2", "qwen3", *ALIASES)
    causal_lm = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", **{alias: "LlamaForCausalLM" for alias in ALIASES}}
    stored_names = {"exaone": ((r"^model\.embed_tokens\.", "transformer.wte."), (r"^model\.layers\.", "transformer.h."),
                               (r"^model\.norm\.", "transformer.ln_f."),
                               (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
                               (r"\.self_attn\.", ".attn.attention."), (r"\.input_layernorm\.", ".ln_1."),
                               (r"\.post_attention_layernorm\.", ".ln_2."), (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
                               (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."), (r"\.mlp\.down_proj\.", ".mlp.c_proj."))}
    """EXAONE 3's checkpoints keep their GPT-2-like names (transformers' conversion_mapping renames them)."""
    config_fields = {"exaone": {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                                "activation_function": "hidden_act"}}
    wrappers = {"got_ocr2": Wrapper("qwen2", {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."},
                                    ("vision_tower.", "multi_modal_projector.")),
                "emu3": Wrapper("llama", {"model.": "text_model.model.", "lm_head.": "text_model.lm_head."},
                                ("vqmodel.",), oracle="Emu3ForConditionalGeneration")}
    """GOT-OCR 2.0 is a Qwen2 reading an image encoder's tokens, Emu3 a Llama reading a VQ model's image tokens
    (left unread; transformers' causal-LM class for emu3 loads none of a release's weights, so its check holds the
    import to Emu3ForConditionalGeneration)."""
    export_order = ("mistral", "qwen3", "qwen2", "llama", *ALIASES)
    """A Llama-family spec with a window is a Mistral, with QK-norm a Qwen3, with q/k/v biases a Qwen2; an
    alias is written only where ``--model-type`` names it (llama states the same spec first)."""

    rows = (
        Row(("llama",),
            "softmax attention (GQA, RoPE `base` = rope_theta with its `rope_type` scaling: linear, llama3, yarn, "
            "dynamic NTK (its base grown with the length a call reaches past `max_position_embeddings`; import with "
            "`--max-len` to run past it: decoding then rotates each new token with its own position's base, as "
            "transformers' `generate` does), biases if `attention_bias`), SiLU GLU MLP (`hidden` = "
            "intermediate_size), RMSNorm",
            "RoPE scaling `longrope` and others; activations other than silu, gelu (exact or tanh: "
            "`gelu_pytorch_tanh`, `gelu_new`), relu, relu2"),
        Row(("mistral",),
            "the same with `window` = sliding_window in every layer",
            "as llama"),
        Row(("qwen2",),
            "q/k/v biases; a window on the layers `layer_types` (or `max_window_layers`) names",
            "as llama"),
        Row(("qwen3",),
            "QK-norm (`qk_norm: rmsnorm`)",
            "as llama"),
        Row(("got_ocr2",),
            "the OCR release's language model: `text_config` and the `language_model.` tensors, as `qwen2`; the "
            "vision tower and projector are not read",
            "images: attnspec models are text models"),
        Row(("emu3",),
            "the release's language model: `text_config` and the `text_model.` tensors, as `llama` (held to "
            "Emu3ForConditionalGeneration: transformers' Emu3ForCausalLM reads none of a release's weights); the VQ "
            "image tokenizer is not read",
            "images: attnspec models are text models"),
        Row(("internlm3", "iquestcoder", "exaone"),
            "as llama: transformers' model of these types is LlamaForCausalLM itself (EXAONE 3's tensors and "
            "config fields under their released names: `transformer.h.N.attn.attention.*`, `num_layers`)",
            "as llama"),
    )

    def spec(self, config: Config, model_type: str) -> dict:
        blocks, eps = self.layer_blocks(config, self.ALIASES.get(model_type, model_type))
        return self.assembled(config, blocks, eps)

    @staticmethod
    def assembled(config: Config, blocks: list[dict], eps: float) -> dict:
        """The spec data of a Llama-shaped model of these blocks (untied head unless the config ties it)."""
        return {**common_fields(config), "layers": compress_layers(blocks), "final_norm": rmsnorm_node(eps),
                "head": head_node(config, False)}

    def layer_blocks(self, config: Config, model_type: str,
                     windows: list[int | None] | None = None) -> tuple[list[dict], float]:
        """Each layer's block data, and the norms' eps (the family's members add their own settings);
        ``windows``: each layer's sliding window where the member decides them itself."""
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads(head_dim=self.HEAD_DIM)
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        mixer: dict[str, Any] = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                                 "qkv_bias": bias or model_type == "qwen2", "out_bias": bias, "norm_eps": eps}
        if kv_heads != heads:
            mixer["kv_heads"] = kv_heads
        if model_type == "qwen3":
            mixer["qk_norm"] = "rmsnorm"
        mixer["position"] = config.rope(head_dim, self.ROTARY_FRACTION)
        windows = self._windows(config, model_type, layers) if windows is None else windows
        mlp = self.layer_mlp(config, model_type)
        return [{"mixer": mixer if window is None else {**mixer, "window": window}, "mlp": mlp,
                 "norm": rmsnorm_node(eps)} for window in windows], eps

    def layer_mlp(self, config: Config, model_type: str) -> dict:
        """Every layer's MLP data (a member with experts puts them in the layers it names afterwards)."""
        return glu_node(config, bias=config.get("mlp_bias", bool, False) if model_type == "llama" else False)

    @staticmethod
    def _windows(config: Config, model_type: str, layers: int) -> list[int | None]:
        """Each layer's sliding window (None: full attention), as transformers decides it."""
        if model_type == "llama":
            return [None] * layers
        window = config.count("sliding_window", None)
        if model_type == "mistral":
            return [window] * layers
        if not config.get("use_sliding_window", bool, False):
            window = None
        first_windowed = config.get("max_window_layers", int, 28)
        default = ["sliding_attention" if window is not None and i >= first_windowed else "full_attention"
                   for i in range(layers)]
        types = config.attention_layer_types(layers, default)
        if window is None and "sliding_attention" in types:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set",
                                [i for i, t in enumerate(types) if t == "sliding_attention"])
        return [window if t == "sliding_attention" else None for t in types]

    def config(self, spec, model_type: str) -> dict:
        model_type = self.ALIASES.get(model_type, model_type)
        blocks = expanded_blocks(spec)
        first = blocks[0].mixer
        if first.kind != "softmax" or first.position is None or first.position.kind != "rope":
            raise NotExpressible("a Llama-family model is softmax attention with RoPE in every block")
        windows = [getattr(block.mixer, "window", None) for block in blocks]
        if model_type == "llama" and any(windows):
            raise NotExpressible("llama has no sliding windows")
        if model_type == "mistral" and (windows[0] is None or len(set(windows)) != 1):
            raise NotExpressible("mistral has one sliding window in every layer")
        if model_type == "qwen3" and first.qk_norm == "none":
            raise NotExpressible("qwen3 has QK-norm")
        mlp = blocks[0].mlp
        config = {**self.shared_fields(spec, first), "attention_bias": first.out_bias}
        if model_type == "llama":
            config["mlp_bias"] = getattr(mlp, "bias", False)  # experts have none
        elif model_type == "mistral":
            config["sliding_window"] = windows[0]
        else:
            window = next((w for w in windows if w is not None), None)
            config.update({"use_sliding_window": window is not None, "sliding_window": window,
                           "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows]})
            if model_type == "qwen2":
                config.pop("attention_bias")
        return config

    def links(self, spec) -> list[Link]:
        links = lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(expanded_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", block_prefix(index)
            mixer = block.mixer
            links += self.projection_links(mixer, f"{theirs}self_attn.", f"{ours}mixer.")
            if mixer.qk_norm not in ("none", "rmsnorm_unweighted"):  # an unweighted norm has no tensor
                links += [rename(f"{theirs}self_attn.{name}.weight", f"{ours}mixer.qk_norm.{stream}")
                          for stream, name in zip("qk", self.QK_NORM_NAMES)]
            links += [rename(f"{theirs}{name}.weight", f"{ours}{norm}.weight")
                      for name, norm in zip(self.NORM_NAMES, ("norm1", "norm2"))]
            links += self.mlp_links(block.mlp, f"{theirs}{self.MLP_NAME}.", f"{ours}mlp.")
        return links

    MLP_NAME = "mlp"
    """A layer's name for its MLP (Llama 4's ``feed_forward``)."""
    NORM_NAMES = ("input_layernorm", "post_attention_layernorm")
    """A layer's names for the norms before its attention and before its MLP (Apertus's ``attention_layernorm``,
    ``feedforward_layernorm``)."""
    QK_NORM_NAMES = ("q_norm", "k_norm")
    """The attention's names for its query and key norms (Hunyuan V1's ``query_layernorm``, ``key_layernorm``)."""

    HEAD_DIM: int | None = None
    """The head width where a config states no ``head_dim`` and its config class's default is a number rather
    than hidden_size / heads (Flint's and Hunyuan V3's 128)."""

    ROTARY_FRACTION = 1.0
    """The rotated fraction of each head where a config states no ``partial_rotary_factor`` (its config
    class's default: a quarter for StableLM, half for Nemotron and GLM-4.5)."""

    def shared_fields(self, spec, mixer) -> dict:
        """The config fields every Llama-shaped type writes alike: widths and counts, the first block's MLP
        activation, and ``mixer``'s heads, norm eps and RoPE (with its partial fraction where it is not the
        type's default)."""
        blocks = expanded_blocks(spec)
        mlp = blocks[0].mlp
        rope = rope_config(mixer.position)
        if mixer.position.rotary_fraction != self.ROTARY_FRACTION:
            rope["partial_rotary_factor"] = mixer.position.rotary_fraction
        return {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden or mlp.expansion * spec.d_model,
                "num_hidden_layers": len(blocks), "num_attention_heads": mixer.heads,
                "num_key_value_heads": mixer.kv_heads or mixer.heads, "head_dim": mixer.d_qk,
                "hidden_act": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": mixer.norm_eps,
                "rope_parameters": rope}

    def projection_links(self, mixer, theirs: str, ours: str) -> list[Link]:
        """The attention's q, k, v and output projections (a member that packs them says how)."""
        return attention_links(theirs, ours, mixer.qkv_bias, mixer.out_bias)

    def mlp_links(self, mlp, theirs: str, ours: str) -> list[Link]:
        """A block's MLP's links (a member with experts adds theirs)."""
        return glu_links(theirs, ours, mlp.bias)


ARCHITECTURES = (LlamaFamily(),)
