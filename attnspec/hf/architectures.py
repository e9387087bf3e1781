"""Released architectures in attnspec's terms: for each transformers model type, its config as a spec,
a spec as its config, and the correspondence of their weights.

One :class:`Architecture` per family of model types: the Llama family (``llama``, ``mistral``,
``qwen2``, ``qwen3``), ``qwen3_next`` (Gated DeltaNet and gated attention) and ``mamba2``. Each says

* :meth:`~Architecture.spec`: the spec data computing what transformers' modelling code computes for
  a ``config.json``, or an :class:`InteropError` naming the field (and layers) it cannot express;
* :meth:`~Architecture.config`: the ``config.json`` of a spec, or :class:`NotExpressible`; the caller
  keeps it only if the config's own spec is the spec again (so "native" is decided by one round trip,
  not by a second list of conditions);
* :meth:`~Architecture.links`: which transformers tensor holds which attnspec tensors, as
  :class:`Link` rows read in both directions.

The tests hold every architecture to transformers' own model, logit for logit (tests/hf/).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnspec.errors import InteropError, shorten
from attnspec.spec import limits

_MISSING = object()
MAX_COUNT = 1 << 40
"""Any count a config states (sizes, heads, ...) before the spec's own limits check it further."""


class NotExpressible(Exception):
    """A spec that this architecture's config cannot state (the reason is the message)."""


class Config:
    """A ``config.json`` being read: typed, located access to its fields."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def refuse(self, field: str, message: str, layers: list[int] | None = None) -> InteropError:
        where = f" (layers {_ranges(layers)})" if layers else ""
        return InteropError(f"{self.source}: `{field}`{where}: {message}")

    def get(self, field: str, kind: type | tuple = int, default: Any = _MISSING) -> Any:
        """The field's value, checked to be of ``kind`` (``default`` where absent or null)."""
        value = self.data.get(field)
        if value is None:
            if default is _MISSING:
                raise self.refuse(field, "missing; a config.json written by transformers has it")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.refuse(field, f"expected {names}, got {type(value).__name__}")
        return value

    def count(self, field: str, default: Any = _MISSING, limit: int = MAX_COUNT) -> int:
        """A positive integer field of at most ``limit`` (checked before anything is built from it:
        ``num_hidden_layers: 10**9`` must not become a list of a billion layers)."""
        value = self.get(field, int, default)
        if value is not None and value <= 0:
            raise self.refuse(field, f"must be positive, got {shorten(value)}")
        if value is not None and value > limit:
            raise self.refuse(field, f"{shorten(value)} is over attnspec's limit of {limit:,}")
        return value

    def number(self, field: str, default: Any = _MISSING, *, positive: bool = False) -> float:
        """A finite real field (an integer of 400 digits is no float); ``default`` (None too) where absent.
        ``positive``: it must also be above 0 (a field attnspec divides by, or takes a root of)."""
        value = self.get(field, (int, float), default)
        if value is None:
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise self.refuse(field, f"must be a finite number, got {shorten(value)}")
        if positive and not number > 0:
            raise self.refuse(field, f"must be a positive number, got {shorten(value)}")
        return number

    def layer_list(self, field: str, layers: int) -> set[int]:
        """A list of layer indices (Qwen3-Next's ``mlp_only_layers``), as a set; at most ``layers`` long."""
        values = self.get(field, list, [])
        if len(values) > layers or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise self.refuse(field, f"must list at most {layers} layer indices (integers)")
        return set(values)

    def layer_types(self, layers: int, default: list[str]) -> list[str]:
        types = self.get("layer_types", list, default)
        if len(types) != layers or not all(isinstance(t, str) for t in types):
            raise self.refuse("layer_types", f"must list a type for each of the {layers} layers")
        return types

    def rope(self, head_dim: int, default_fraction: float = 1.0, layer_type: str | None = None) -> dict:
        """The rotary position node: ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling``
        (transformers 4), with its scaling: linear, llama3, yarn and dynamic NTK (its base grown past
        ``max_position_embeddings``) import; the rest are refused by name. Where the parameters are
        given per layer type (Gemma 3's local and global layers), ``layer_type``'s."""
        field = "rope_parameters"
        parameters = self.get("rope_parameters", dict, None)
        if layer_type is not None and parameters is not None and layer_type in parameters:
            field = f"rope_parameters.{layer_type}"
            parameters = parameters[layer_type]
            if not isinstance(parameters, dict):
                raise self.refuse(field, "must be a mapping of the layer type's RoPE parameters")
        if parameters is None:
            field, scaling = "rope_scaling", self.get("rope_scaling", dict, None) or {}
            parameters = {**scaling, "rope_type": scaling.get("rope_type", scaling.get("type", "default")),
                          "rope_theta": self.number("rope_theta", 10000.0),
                          "partial_rotary_factor": self.number("partial_rotary_factor", default_fraction)}
        kind = parameters.get("rope_type", "default")
        if kind not in ("default", "linear", "llama3", "yarn", "dynamic"):
            raise self.refuse(f"{field}.rope_type", f"{shorten(kind)!r} RoPE scaling: it is not an attnspec "
                              "position scheme; default, linear, llama3, yarn and dynamic import")
        theta = parameters.get("rope_theta", 10000.0)
        fraction = parameters.get("partial_rotary_factor", self.number("partial_rotary_factor", default_fraction))
        if not all(_positive(v) for v in (theta, fraction)):
            raise self.refuse(field, "rope_theta and partial_rotary_factor must be positive numbers")
        node: dict[str, Any] = {"kind": "rope", "base": float(theta)}
        if fraction != 1.0:
            node["rotary_fraction"] = float(fraction)
        if kind == "default":
            return node
        node["scaling"] = kind
        wanted = {"factor": "factor", "original_max_position_embeddings": "original_max_len",
                  "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
                  "beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attention_factor"}
        if kind == "dynamic":  # transformers grows the base past max_position_embeddings
            parameters = {**parameters, "original_max_position_embeddings": self.count("max_position_embeddings")}
        trained = parameters.get("original_max_position_embeddings")
        if kind == "yarn" and parameters.get("factor") is None and _positive(trained):  # the implied stretch
            parameters = {**parameters, "factor": self.count("max_position_embeddings") / trained}
        for theirs, ours in wanted.items():
            value = parameters.get(theirs)
            if value is None:
                continue
            if not _positive(value):
                raise self.refuse(f"{field}.{theirs}", f"must be a positive number, got {shorten(value)}")
            node[ours] = int(value) if ours == "original_max_len" else float(value)
        if kind == "yarn":
            node["truncate"] = bool(parameters.get("truncate", True))
            mscale, mscale_all = parameters.get("mscale"), parameters.get("mscale_all_dim")
            if "attention_factor" not in node and mscale and mscale_all:  # DeepSeek's ratio of two mscales
                factor = node["factor"]
                node["attention_factor"] = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        return node

    def attention_heads(self, head_dim_field: str | None = "head_dim") -> tuple[int, int, int]:
        """(heads, key/value heads, head width) of the config's attention: ``num_attention_heads``,
        ``num_key_value_heads`` (default: heads) and ``head_dim_field`` (default, or without one: hidden_size /
        heads), refused by field where the heads do not divide the width or share the key/value heads equally."""
        heads = self.count("num_attention_heads")
        kv_heads = self.count("num_key_value_heads", heads)
        width = self.count(head_dim_field, None) if head_dim_field else None
        d_model = self.count("hidden_size")
        if width is None and d_model % heads:
            raise self.refuse("num_attention_heads", f"{heads} heads do not divide hidden_size {d_model}")
        if heads % kv_heads:
            raise self.refuse("num_key_value_heads", f"{heads} heads cannot share {kv_heads} key/value heads equally")
        return heads, kv_heads, width or d_model // heads

    def activation(self, field: str = "hidden_act",
                   allowed: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "relu2")) -> str:
        value = self.get(field, str, "silu")
        name = HF_ACTIVATIONS.get(value, value)
        if name not in allowed:
            raise self.refuse(field, f"activation {value!r} has no attnspec equivalent; attnspec has "
                              f"{', '.join(allowed)} here")
        return name


HF_ACTIVATIONS = {"swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                  "gelu_fast": "gelu_tanh"}
"""transformers' activation names that are attnspec's under another name (``gelu_new`` and ``gelu_fast``
are the tanh approximation written out, equal to it within float32 rounding)."""
ACTIVATION_NAMES = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "relu2": "relu2"}
"""attnspec's activation -> the name transformers' configs write."""


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _rope_parameters(position) -> dict:
    """A rotary position node as transformers 5's ``rope_parameters``."""
    parameters: dict[str, Any] = {"rope_type": "default" if position.scaling == "none" else position.scaling,
                                  "rope_theta": position.base}
    if position.scaling != "none":
        parameters["factor"] = position.factor
    if position.scaling in ("llama3", "yarn"):  # dynamic's is the config's max_position_embeddings
        parameters["original_max_position_embeddings"] = position.original_max_len
    if position.scaling == "llama3":
        parameters.update(low_freq_factor=position.low_freq_factor, high_freq_factor=position.high_freq_factor)
    if position.scaling == "yarn":
        parameters.update(beta_fast=position.beta_fast, beta_slow=position.beta_slow, truncate=position.truncate)
        if position.attention_factor is not None:
            parameters["attention_factor"] = position.attention_factor
    return parameters


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts, start = [], None
    for index, n in enumerate(numbers):
        if start is None:
            start = n
        if index + 1 == len(numbers) or numbers[index + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def compress_layers(blocks: list[dict]) -> list[dict]:
    """A list of blocks as readable layers: the shortest repeating period as a ``repeat`` group, runs of
    equal blocks inside it as their own groups ([a, a, a, b] * 12 -> repeat 12 of [repeat 3 of a, b])."""
    n = len(blocks)
    for period in range(1, n + 1):
        if n % period == 0 and all(blocks[i] == blocks[i % period] for i in range(n)):
            break
    runs: list[dict] = []
    for block in blocks[:period]:
        if runs and runs[-1]["layers"][0] == block:
            runs[-1]["repeat"] += 1
        else:
            runs.append({"repeat": 1, "layers": [block]})
    inner = [run["layers"][0] if run["repeat"] == 1 else run for run in runs]
    return inner if n == period else [{"repeat": n // period, "layers": inner}]


# --------------------------------------------------------------------------- the weight correspondence


@dataclass(frozen=True)
class Link:
    """One transformers tensor ``theirs`` made of attnspec tensors ``ours``.

    ``theirs`` = the rows of ``ours`` concatenated, interleaved by ``groups`` (group g of each of
    ``ours`` in turn: transformers' per-key-head packing), minus ``offset`` (Qwen3-Next's norms store
    weight - 1), exponentiated where ours is its ``log`` (a fixed transition's log-rate, MiniMax's
    slope), with a middle axis of 1 for a ``conv`` (conv1d's (channels, 1, width)), its rows in
    ``stack`` slices along a leading axis (fused experts: (experts, rows, columns)), or the whole viewed
    as ``view``.
    """

    theirs: str
    ours: tuple[str, ...]
    groups: int = 1
    offset: float = 0.0
    conv: bool = False
    stack: int = 1
    view: tuple[int, ...] | None = None
    log: bool = False

    def join(self, tensors: list[Tensor]) -> Tensor:
        """attnspec -> transformers."""
        parts = [t.chunk(self.groups) for t in tensors]
        joined = torch.cat([part for group in zip(*parts) for part in group]) - self.offset
        if self.log:
            joined = torch.exp(joined)
        if self.view is not None:  # the same numbers in transformers' shape (Kimi's A_log (1, 1, H, 1))
            return joined.reshape(self.view)
        if self.stack > 1:
            joined = joined.reshape(self.stack, -1, *joined.shape[1:])
        return joined.unsqueeze(1) if self.conv else joined

    def split(self, tensor: Tensor, shapes: list[torch.Size]) -> list[Tensor]:
        """transformers -> attnspec, into tensors of ``shapes``."""
        if self.view is not None:
            tensor = tensor.reshape(sum(shape[0] for shape in shapes), *shapes[0][1:])
        if self.stack > 1:
            tensor = tensor.reshape(-1, *tensor.shape[2:])
        if self.conv:
            tensor = tensor.squeeze(1)
        if self.log:
            tensor = torch.log(tensor)
        tensor = tensor + self.offset
        rows = [shape[0] // self.groups for shape in shapes]
        grouped = tensor.reshape(self.groups, sum(rows), *tensor.shape[1:])
        return [part.reshape(shape).contiguous() for part, shape in zip(grouped.split(rows, dim=1), shapes)]


def rename(theirs: str, ours: str, offset: float = 0.0) -> Link:
    return Link(theirs, (ours,), offset=offset)


# --------------------------------------------------------------------------- architectures


class Architecture:
    """A family of transformers model types (see the module docstring)."""

    model_types: tuple[str, ...] = ()
    causal_lm: dict[str, str] = {}
    """model type -> its causal-LM class, the config's ``architectures`` entry."""

    def spec(self, config: Config, model_type: str) -> dict:
        raise NotImplementedError

    def config(self, spec, model_type: str) -> dict:
        raise NotImplementedError

    def links(self, spec) -> list[Link]:
        raise NotImplementedError

    def unused(self, name: str, spec) -> bool:
        """Whether a checkpoint tensor no link reads is one transformers' model also leaves unread (else the
        import refuses it: attnspec imports nothing it would drop)."""
        return False

    def derived_tensors(self, spec, tensors: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
        """Tensors a checkpoint of this type stores that are computed from others (the ones :meth:`unused`
        leaves unread on import), for export: ``tensors`` are the linked ones, ``config`` the config
        written beside them. Empty for most types."""
        return {}

    def weight_scales(self, spec, config: Config) -> dict[str, float]:
        """attnspec tensor -> the constant its checkpoint tensor is multiplied by in transformers' forward
        (μP multipliers inside a layer, folded into the weight they multiply on import; the exported
        config then states 1 for each). Empty for most types."""
        return {}


def _common(config: Config) -> dict:
    """Fields every causal LM here shares: vocabulary, width, max_len, dtype (the checkpoint's own, as its
    config states it: a bfloat16 release stays bfloat16; float32 where it names none attnspec holds)."""
    dtype = config.get("dtype", str, None) or config.get("torch_dtype", str, "float32")
    return {"input": {"kind": "tokens", "vocab_size": config.count("vocab_size")},
            "d_model": config.count("hidden_size"),
            "max_len": config.count("max_position_embeddings", 2048),
            "dtype": dtype if dtype in ("float64", "bfloat16", "float16") else "float32"}


def _head(config: Config, default_tied: bool) -> dict:
    """transformers' LM heads multiply by nothing, tied or not."""
    return {"kind": "lm", "tied": config.get("tie_word_embeddings", bool, default_tied), "scale": 1.0}


def _glu(config: Config, hidden_field: str = "intermediate_size", bias: bool = False) -> dict:
    return {"kind": "glu", "hidden": config.count(hidden_field), "activation": config.activation(),
            "bias": bias}


def _rmsnorm(eps: float) -> dict:
    return {"kind": "rmsnorm", "eps": eps}


def _block_prefix(index: int) -> str:
    return f"blocks.{index}."


def _lm_links(spec, embed: str, final_norm: str, offset: float = 0.0) -> list[Link]:
    links = [rename(embed, "embed.weight"), rename(final_norm, "final_norm.weight", offset)]
    if not spec.head.tied:
        links.append(rename("lm_head.weight", "head.weight"))
    return links


def _mlp_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """transformers' down(act(gate_proj x) * up_proj x) is attnspec's down(act(up x) * gate x)."""
    links = []
    for their_name, our_name in (("gate_proj", "up"), ("up_proj", "gate"), ("down_proj", "down")):
        links.append(rename(f"{theirs}{their_name}.weight", f"{ours}{our_name}.weight"))
        if bias:
            links.append(rename(f"{theirs}{their_name}.bias", f"{ours}{our_name}.bias"))
    return links


def _plain_mlp_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """transformers' down(act(up_proj x)) is attnspec's ``mlp`` kind, down(act(up x))."""
    names = ["up", "down"]
    return [rename(f"{theirs}{n}_proj.{p}", f"{ours}{n}.{p}") for n in names for p in ("weight", "bias")[:1 + bias]]


def _w123_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """Mixtral's expert names: w2(act(w1 x) * w3 x) is attnspec's down(act(up x) * gate x)."""
    pairs = (("w1", "up"), ("w3", "gate"), ("w2", "down"))
    return [rename(f"{theirs}{t}.weight", f"{ours}{o}.weight") for t, o in pairs]


def _moe_links(moe, theirs: str, ours: str, shared: str = "shared_expert", router: str = "gate",
               expert_links=None) -> list[Link]:
    """A sparse MoE block as released checkpoints store it: the ``router`` (and its score correction
    bias), one MLP per expert (``experts.{e}.gate_proj`` ...; no gate_proj for plain experts; Mixtral's
    w1/w2/w3 with ``expert_links``), the shared expert and its gate."""
    plain = _mlp_links if moe.gated else _plain_mlp_links
    links = [rename(f"{theirs}{router}.weight", f"{ours}router.weight")]
    if moe.score_bias:
        links.append(rename(f"{theirs}{router}.e_score_correction_bias", f"{ours}score_bias"))
    for e in range(moe.experts):
        links += (expert_links or plain)(f"{theirs}experts.{e}.", f"{ours}routed.{e}.", False)
    if moe.shared:
        links += plain(f"{theirs}{shared}.", f"{ours}shared.", False)
    if moe.shared_gate:
        links.append(rename(f"{theirs}{shared}_gate.weight", f"{ours}shared_gate.weight"))
    return links


def _blocks(spec) -> list:
    from attnspec.spec.walk import iter_blocks

    return [block for _, block in iter_blocks(spec, expand=True)]


class LlamaFamily(Architecture):
    """Llama-style decoders: RMSNorm, GQA softmax attention with RoPE, a SiLU GLU MLP. Mistral adds a
    sliding window, Qwen2 q/k/v biases and per-layer windows, Qwen3 QK-norm."""

    model_types = ("llama", "mistral", "qwen2", "qwen3")
    causal_lm = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads()
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        mixer: dict[str, Any] = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                                 "qkv_bias": bias or model_type == "qwen2", "out_bias": bias, "norm_eps": eps}
        if kv_heads != heads:
            mixer["kv_heads"] = kv_heads
        if model_type == "qwen3":
            mixer["qk_norm"] = "rmsnorm"
        mixer["position"] = config.rope(head_dim)
        windows = self._windows(config, model_type, layers)
        mlp = _glu(config, bias=config.get("mlp_bias", bool, False) if model_type == "llama" else False)
        blocks = [{"mixer": mixer if window is None else {**mixer, "window": window}, "mlp": mlp,
                   "norm": _rmsnorm(eps)} for window in windows]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

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
        types = config.layer_types(layers, default)
        unknown = [i for i, t in enumerate(types) if t not in ("full_attention", "sliding_attention")]
        if unknown:
            raise config.refuse("layer_types", f"{types[unknown[0]]!r} is not full_attention or sliding_attention",
                                unknown)
        if window is None and "sliding_attention" in types:
            raise config.refuse("sliding_window", "layer_types names sliding layers but no window is set",
                                [i for i, t in enumerate(types) if t == "sliding_attention"])
        return [window if t == "sliding_attention" else None for t in types]

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
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
        config = {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden or mlp.expansion * spec.d_model,
                  "num_hidden_layers": len(blocks), "num_attention_heads": first.heads,
                  "num_key_value_heads": first.kv_heads or first.heads, "head_dim": first.d_qk,
                  "hidden_act": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": first.norm_eps,
                  "rope_parameters": _rope_parameters(first.position), "attention_bias": first.out_bias}
        if first.position.rotary_fraction != 1.0:
            config["rope_parameters"]["partial_rotary_factor"] = first.position.rotary_fraction
        if model_type == "llama":
            config["mlp_bias"] = mlp.bias
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
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            mixer = block.mixer
            for name in ("q", "k", "v"):
                links.append(rename(f"{theirs}self_attn.{name}_proj.weight", f"{ours}mixer.{name}_proj.weight"))
                if mixer.qkv_bias:
                    links.append(rename(f"{theirs}self_attn.{name}_proj.bias", f"{ours}mixer.{name}_proj.bias"))
            links.append(rename(f"{theirs}self_attn.o_proj.weight", f"{ours}mixer.out_proj.weight"))
            if mixer.out_bias:
                links.append(rename(f"{theirs}self_attn.o_proj.bias", f"{ours}mixer.out_proj.bias"))
            if mixer.qk_norm != "none":
                links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q"),
                          rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k")]
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            links += _mlp_links(f"{theirs}mlp.", f"{ours}mlp.", block.mlp.bias)
        return links


class Qwen3Next(Architecture):
    """Qwen3-Next: Gated DeltaNet blocks and gated softmax attention blocks (QK-norm, partial RoPE, a
    sigmoid output gate), dense SiLU GLU MLPs, zero-centred RMSNorms (weight stored as w - 1)."""

    model_types = ("qwen3_next",)
    causal_lm = {"qwen3_next": "Qwen3NextForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        experts = config.get("num_experts", int, 512)
        if experts < 0 or experts > limits.MAX_EXPERTS:
            raise config.refuse("num_experts", f"must be in 0..{limits.MAX_EXPERTS}, got {shorten(experts)}")
        step = config.count("decoder_sparse_step", 1)
        dense_only = config.layer_list("mlp_only_layers", layers)
        moe = {i for i in range(layers) if i not in dense_only and experts > 0 and (i + 1) % step == 0}
        interval = config.count("full_attention_interval", 4)
        default = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
        types = config.layer_types(layers, default)
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", f"{types[unknown[0]]!r} is not linear_attention or full_attention",
                                unknown)
        act = config.activation(allowed=("silu",))
        heads, kv_heads, head_dim = config.attention_heads()
        bias = config.get("attention_bias", bool, False)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qk_norm": "rmsnorm",
                     "norm_eps": eps, "position": config.rope(head_dim, 0.25), "output_gate": "sigmoid",
                     "qkv_bias": bias, "out_bias": bias}
        if kv_heads != heads:
            attention["kv_heads"] = kv_heads
        v_heads, k_heads = config.count("linear_num_value_heads"), config.count("linear_num_key_heads")
        if v_heads % k_heads:
            raise config.refuse("linear_num_key_heads", f"{v_heads} value heads cannot share {k_heads} key heads "
                                "equally")
        delta = {"kind": "delta", "heads": v_heads, "d_qk": config.count("linear_key_head_dim"),
                 "d_v": config.count("linear_value_head_dim"), "feature_map": "l2norm",
                 "transition": {"kind": "mamba", "per": "head"},
                 "conv": {"kind": "short", "width": config.count("linear_conv_kernel_dim", 4),
                          "projections": ["q", "k", "v"], "activation": act},
                 "group_norm": True, "shared_norm_weight": True, "output_gate": "swish", "norm_eps": eps}
        if k_heads != v_heads:
            delta["qk_groups"] = k_heads
        dense = _glu(config) if len(moe) < layers else None  # an all-MoE config need not state intermediate_size
        experts_mlp = self._experts(config, experts) if moe else None
        blocks = [{"mixer": delta if t == "linear_attention" else attention,
                   "mlp": experts_mlp if i in moe else dense, "norm": _rmsnorm(eps)} for i, t in enumerate(types)]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    @staticmethod
    def _experts(config: Config, experts: int) -> dict:
        """Qwen3-Next's sparse MoE block: a softmax router, top-k (renormalised with norm_topk_prob), SiLU
        GLU experts, one shared GLU expert behind a sigmoid gate."""
        top_k = config.count("num_experts_per_tok", 10)
        if top_k > experts:
            raise config.refuse("num_experts_per_tok", f"{top_k} experts per token of {experts}")
        return {"kind": "moe", "experts": experts, "top_k": top_k, "hidden": config.count("moe_intermediate_size"),
                "activation": config.activation(allowed=("silu",)), "scoring": "softmax",
                "normalize": config.get("norm_topk_prob", bool, True), "shared": 1,
                "shared_hidden": config.count("shared_expert_intermediate_size"), "shared_gate": True}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        delta = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        if delta is None or attention is None or getattr(attention.position, "kind", None) != "rope" \
                or delta.conv.kind != "short":
            raise NotExpressible("qwen3_next has convolved Gated DeltaNet and rotary softmax attention blocks")
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        mlp = dense or moe
        experts = {"num_experts": 0, "mlp_only_layers": []}
        if moe is not None:
            experts = {"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                       "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                       "shared_expert_intermediate_size": moe.shared_hidden or moe.shared * moe.hidden,
                       "decoder_sparse_step": 1,
                       "mlp_only_layers": [i for i, b in enumerate(blocks) if b.mlp.kind != "moe"]}
        return {**experts, "hidden_size": spec.d_model,
                "intermediate_size": (mlp.hidden or mlp.expansion * spec.d_model) if dense is not None else mlp.hidden,
                "num_hidden_layers": len(blocks), "num_attention_heads": attention.heads,
                "num_key_value_heads": attention.kv_heads or attention.heads, "head_dim": attention.d_qk,
                "hidden_act": ACTIVATION_NAMES[mlp.activation], "rms_norm_eps": attention.norm_eps,
                "attention_bias": attention.qkv_bias,
                "rope_parameters": {**_rope_parameters(attention.position),
                                    "partial_rotary_factor": attention.position.rotary_fraction},
                "linear_num_value_heads": delta.heads, "linear_num_key_heads": delta.qk_groups or delta.heads,
                "linear_key_head_dim": delta.d_qk, "linear_value_head_dim": delta.d_v,
                "linear_conv_kernel_dim": delta.conv.width,
                "layer_types": ["linear_attention" if b.mixer.kind == "delta" else "full_attention" for b in blocks]}

    @staticmethod
    def _projection_links(mixer, theirs: str, ours: str) -> list[Link]:
        """Qwen3-Next packs q, k, v and the gate per key head (in_proj_qkvz), beta and Δ per key head (in_proj_ba)."""
        groups = mixer.qk_groups or mixer.heads
        return [Link(f"{theirs}in_proj_qkvz.weight", tuple(f"{ours}mixer.{n}.weight" for n in
                                                            ("q_proj", "k_proj", "v_proj", "gate")), groups),
                Link(f"{theirs}in_proj_ba.weight", (f"{ours}mixer.beta_proj.weight",
                                                    f"{ours}mixer.transition.dt_proj.weight"), groups)]

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight", offset=1.0)
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            mixer = block.mixer
            if mixer.kind == "delta":
                m = f"{theirs}linear_attn."
                links += self._projection_links(mixer, m, ours)
                links += [Link(f"{m}conv1d.weight", tuple(f"{ours}mixer.conv.filters.{n}" for n in "qkv"), conv=True),
                          rename(f"{m}dt_bias", f"{ours}mixer.transition.dt_bias"),
                          rename(f"{m}A_log", f"{ours}mixer.transition.A_log"),
                          rename(f"{m}norm.weight", f"{ours}mixer.norm_weight"),
                          rename(f"{m}out_proj.weight", f"{ours}mixer.out_proj.weight")]
            else:
                a = f"{theirs}self_attn."
                # q_proj holds each head's query then its gate: groups of one head
                links += [Link(f"{a}q_proj.weight", (f"{ours}mixer.q_proj.weight", f"{ours}mixer.gate.weight"),
                               mixer.heads),
                          rename(f"{a}k_proj.weight", f"{ours}mixer.k_proj.weight"),
                          rename(f"{a}v_proj.weight", f"{ours}mixer.v_proj.weight"),
                          rename(f"{a}o_proj.weight", f"{ours}mixer.out_proj.weight"),
                          rename(f"{a}q_norm.weight", f"{ours}mixer.qk_norm.q", 1.0),
                          rename(f"{a}k_norm.weight", f"{ours}mixer.qk_norm.k", 1.0)]
                if mixer.qkv_bias:
                    links += [Link(f"{a}q_proj.bias", (f"{ours}mixer.q_proj.bias", f"{ours}mixer.gate.bias"),
                                   mixer.heads),
                              rename(f"{a}k_proj.bias", f"{ours}mixer.k_proj.bias"),
                              rename(f"{a}v_proj.bias", f"{ours}mixer.v_proj.bias"),
                              rename(f"{a}o_proj.bias", f"{ours}mixer.out_proj.bias")]
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight", 1.0),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight", 1.0)]
            if block.mlp.kind == "moe":
                links += _moe_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.", shared="shared_expert")
            else:
                links += _mlp_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


class Mamba2(Architecture):
    """Mamba2: RMSNorm, the Mamba2 mixer (no MLP), written as in specs/mamba2.yaml."""

    model_types = ("mamba2",)
    causal_lm = {"mamba2": "Mamba2ForCausalLM"}

    FIELDS = {"heads": "num_heads", "head_dim": "head_dim", "expand": "expand", "state": "state_size",
              "groups": "n_groups", "conv": "conv_kernel", "conv_bias": "use_conv_bias", "chunk": "chunk_size",
              "bias": "use_bias", "eps": "layer_norm_epsilon"}
    """Where a config states the Mamba2 mixer's sizes (Bamba prefixes them with ``mamba_``)."""

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("layer_norm_epsilon", 1e-5)
        blocks = [{"mixer": mamba2_mixer(config, self.FIELDS), "mlp": "none", "norm": _rmsnorm(eps)}] * layers
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        mixer = blocks[0].mixer
        if mixer.kind != "linear" or mixer.conv.kind != "short" or mixer.heads * mixer.d_v % spec.d_model:
            raise NotExpressible("mamba2 is convolved linear attention with heads * d_v a multiple of d_model")
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks),
                **mamba2_config(mixer, spec.d_model, self.FIELDS), "layer_norm_epsilon": mixer.norm_eps,
                "hidden_act": "silu", "max_position_embeddings": spec.max_len,
                "residual_in_fp32": spec.dtype == "float32", "time_step_limit": time_step_limit(mixer)}

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "backbone.embeddings.weight", "backbone.norm_f.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs = f"backbone.layers.{index}."
            links += mamba2_links(block.mixer, f"{theirs}mixer.", _block_prefix(index) + "mixer.")
            links.append(rename(f"{theirs}norm.weight", _block_prefix(index) + "norm1.weight"))
        return links


def mamba2_mixer(config: Config, fields: dict[str, str], dt_limit: tuple[float, float] | None = None,
                 inner: int | None = None, head_dim: int | None = None) -> dict:
    """transformers' Mamba2 mixer as attnspec's linear attention (``specs/mamba2.yaml``), its sizes read
    from the config's ``fields`` (:attr:`Mamba2.FIELDS` names them), Δ clamped to ``dt_limit`` (else the
    config's ``time_step_limit``); ``inner`` and ``head_dim`` where the config states them otherwise
    (Falcon-H1's ``mamba_d_ssm`` and its "auto" head width)."""
    d_model = config.count("hidden_size")
    eps = config.number(fields["eps"], 1e-5)
    heads, head_dim = config.count(fields["heads"]), head_dim or config.count(fields["head_dim"])
    if heads * head_dim != (inner or config.count(fields["expand"], 2) * d_model):
        raise config.refuse(fields["heads"], f"{fields['heads']} * {fields['head_dim']} must be "
                            f"{fields['expand']} * hidden_size" if inner is None else "the SSM's width")
    if config.get(fields["bias"], bool, False):
        raise config.refuse(fields["bias"], "biases on in_proj/out_proj are not imported (released Mamba2 layers "
                            "have none); attnspec's Mamba2 has no input bias on Δ's projection")
    if dt_limit is None:  # transformers 5 writes infinity as {"__float__": "Infinity"}
        limit = [math.inf if v == {"__float__": "Infinity"} else v
                 for v in config.get("time_step_limit", list, [0.0, math.inf])]
    else:
        limit = list(dt_limit)
    if len(limit) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in limit):
        raise config.refuse("time_step_limit", f"must be [low, high] with 0 <= low <= high, got {shorten(limit)}")
    groups = config.count(fields["groups"], 8)
    if heads % groups:
        raise config.refuse(fields["groups"], f"{heads} heads cannot be split into {groups} groups")
    chunk = config.count(fields["chunk"], 256)
    mixer = {"kind": "linear", "heads": heads, "d_qk": config.count(fields["state"]), "d_v": head_dim,
             "qk_groups": groups, "feature_map": "identity", "normalize": False, "scale": 1.0,
             "transition": {"kind": "mamba", "per": "head", "scale_input": True,
                            **({"dt_min": float(limit[0])} if limit[0] > 0 else {}),
                            **({"dt_max": float(limit[1])} if math.isfinite(limit[1]) else {})},
             "conv": {"kind": "short", "width": config.count(fields["conv"], 4), "projections": ["q", "k", "v"],
                      "activation": config.activation(fields.get("act", "hidden_act"), allowed=("silu",)),
                      "bias": config.get(fields["conv_bias"], bool, True)},
             "skip": True, "group_norm": True, "output_gate": "swish", "gate_before_norm": True, "norm_eps": eps}
    if chunk & (chunk - 1) == 0 and chunk <= 4096:  # a chunk length changes no result, only speed
        mixer["chunk_size"] = chunk
    return mixer


def mamba2_config(mixer, d_model: int, fields: dict[str, str]) -> dict:
    """A Mamba2 mixer's sizes as a config states them under ``fields`` (the inverse of :func:`mamba2_mixer`)."""
    return {fields["heads"]: mixer.heads, fields["head_dim"]: mixer.d_v, fields["expand"]: mixer.heads * mixer.d_v
            // d_model, fields["state"]: mixer.d_qk, fields["groups"]: mixer.qk_groups or mixer.heads,
            fields["conv"]: mixer.conv.width, fields["conv_bias"]: mixer.conv.bias, fields["bias"]: False,
            fields["chunk"]: mixer.chunk_size}


def time_step_limit(mixer) -> list[float]:
    """A Mamba2 mixer's Δ clamp as transformers' ``time_step_limit`` [low, high]."""
    transition = mixer.transition
    return [transition.dt_min or 0.0, transition.dt_max if transition.dt_max is not None else math.inf]


def mamba2_links(mixer, theirs: str, ours: str) -> list[Link]:
    """A Mamba2 mixer's tensors: in_proj rows z | x | B | C | dt; conv1d channels x | B | C."""
    links = [Link(f"{theirs}in_proj.weight", tuple(f"{ours}{n}.weight" for n in
                                                   ("gate", "v_proj", "k_proj", "q_proj", "transition.dt_proj"))),
             Link(f"{theirs}conv1d.weight", tuple(f"{ours}conv.filters.{n}" for n in "vkq"), conv=True),
             rename(f"{theirs}dt_bias", f"{ours}transition.dt_bias"),
             rename(f"{theirs}A_log", f"{ours}transition.A_log"),
             rename(f"{theirs}D", f"{ours}D"),
             rename(f"{theirs}norm.weight", f"{ours}norm_weight"),
             rename(f"{theirs}out_proj.weight", f"{ours}out_proj.weight")]
    if mixer.conv.bias:
        links.append(Link(f"{theirs}conv1d.bias", tuple(f"{ours}conv.biases.{n}" for n in "vkq")))
    return links


class Mamba(Architecture):
    """Mamba and Falcon-Mamba: RMSNorm, the Mamba-1 mixer (no MLP); Falcon-Mamba RMS-normalises Δ's
    low-rank input, B and C without a weight."""

    model_types = ("mamba", "falcon_mamba")
    causal_lm = {"mamba": "MambaForCausalLM", "falcon_mamba": "FalconMambaForCausalLM"}
    FIELDS = {"expand": "expand", "state": "state_size", "conv": "conv_kernel", "conv_bias": "use_conv_bias",
              "bias": "use_bias", "rank": "time_step_rank"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("layer_norm_epsilon", 1e-5)
        norm = ("rms", config.number("mixer_rms_eps", 1e-6)) if model_type == "falcon_mamba" else ("none", eps)
        blocks = [{"mixer": mamba1_mixer(config, self.FIELDS, *norm), "mlp": "none", "norm": _rmsnorm(eps)}] * layers
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        mixer = blocks[0].mixer
        wanted = "rms" if model_type == "falcon_mamba" else "none"
        if mixer.kind != "mamba" or mixer.selection_norm != wanted:
            raise NotExpressible(f"{model_type} is the Mamba-1 mixer with selection_norm {wanted} in every block")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "layer_norm_epsilon":
                  spec.final_norm.eps, **mamba1_config(mixer, spec.d_model, self.FIELDS),
                  "max_position_embeddings": spec.max_len, "residual_in_fp32": spec.dtype == "float32"}
        if model_type == "falcon_mamba":
            config["mixer_rms_eps"] = mixer.norm_eps
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "backbone.embeddings.weight", "backbone.norm_f.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs = f"backbone.layers.{index}."
            links += mamba1_links(block.mixer, f"{theirs}mixer.", _block_prefix(index) + "mixer.")
            links.append(rename(f"{theirs}norm.weight", _block_prefix(index) + "norm1.weight"))
        return links


def mamba1_mixer(config: Config, fields: dict[str, str], selection_norm: str, eps: float) -> dict:
    """transformers' Mamba-1 mixer as attnspec's ``mamba`` mixer, its sizes read from the config's
    ``fields`` (Jamba prefixes them with ``mamba_``)."""
    d_model = config.count("hidden_size")
    rank = config.data.get(fields["rank"], "auto")
    rank = math.ceil(d_model / 16) if rank == "auto" else config.count(fields["rank"])
    bias = config.get(fields["bias"], bool, False)
    return {"kind": "mamba", "d_qk": config.count(fields["state"], 16),
            "d_inner": config.count(fields["expand"], 2) * d_model, "dt_rank": rank,
            "conv": {"kind": "short", "width": config.count(fields["conv"], 4), "projections": ["v"],
                     "activation": config.activation(allowed=("silu",)),
                     "bias": config.get(fields["conv_bias"], bool, True)},
            "selection_norm": selection_norm, **({"norm_eps": eps} if selection_norm != "none" else {}),
            "qkv_bias": bias, "out_bias": bias}


def mamba1_config(mixer, d_model: int, fields: dict[str, str]) -> dict:
    """A ``mamba`` mixer's fields as a config states them (the inverse of :func:`mamba1_mixer`)."""
    if mixer.d_inner % d_model or mixer.conv.kind != "short" or mixer.qkv_bias != mixer.out_bias:
        raise NotExpressible("transformers' Mamba has d_inner a multiple of d_model, a convolution, and biases "
                             "on both projections or neither")
    return {fields["expand"]: mixer.d_inner // d_model, fields["state"]: mixer.d_qk, fields["rank"]: mixer.dt_rank,
            fields["conv"]: mixer.conv.width, fields["conv_bias"]: mixer.conv.bias, fields["bias"]: mixer.qkv_bias,
            "hidden_act": "silu"}


def mamba1_links(mixer, theirs: str, ours: str) -> list[Link]:
    """A Mamba-1 mixer's tensors, under the names transformers gives them."""
    names = ["in_proj.weight", "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D", "out_proj.weight"]
    names += ["in_proj.bias", "out_proj.bias"] if mixer.qkv_bias else []
    links = [rename(f"{theirs}{name}", f"{ours}{name}") for name in names]
    links.append(Link(f"{theirs}conv1d.weight", (f"{ours}conv.filters.v",), conv=True))
    if mixer.conv.bias:
        links.append(rename(f"{theirs}conv1d.bias", f"{ours}conv.biases.v"))
    if mixer.selection_norm == "rmsnorm":
        links += [rename(f"{theirs}{name}_layernorm.weight", f"{ours}selection_weight.{key}")
                  for name, key in (("dt", "dt"), ("b", "B"), ("c", "C"))]
    return links


class Jamba(Architecture):
    """Jamba: Mamba-1 layers (RMSNorms with weights on Δ, B and C) and softmax attention layers without
    positions (GQA) every ``attn_layer_period`` layers, each followed by a SiLU GLU MLP or, every
    ``expert_layer_period`` layers, a mixture of GLU experts (softmax router, top-k not renormalised)."""

    model_types = ("jamba",)
    causal_lm = {"jamba": "JambaForCausalLM"}
    FIELDS = {"expand": "mamba_expand", "state": "mamba_d_state", "conv": "mamba_d_conv",
              "conv_bias": "mamba_conv_bias", "bias": "mamba_proj_bias", "rank": "mamba_dt_rank"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        heads, kv_heads, head_dim = config.attention_heads(None)
        attention = {"kind": "softmax", "heads": heads, "position": {"kind": "none"}}
        if kv_heads != heads:
            attention["kv_heads"] = kv_heads
        mamba = mamba1_mixer(config, self.FIELDS, "rmsnorm", eps)
        experts = config.count("num_experts", 16, limit=limits.MAX_EXPERTS)
        mlp = _glu(config)
        moe = {"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 2),
               "hidden": mlp["hidden"], "activation": mlp["activation"], "normalize": False}
        periods = {}
        for name, default_period, default_offset in (("attn", 8, 4), ("expert", 2, 1)):
            period = config.count(f"{name}_layer_period", default_period)
            offset = config.get(f"{name}_layer_offset", int, default_offset)
            if not 0 <= offset < period:
                raise config.refuse(f"{name}_layer_offset", f"must be from 0 to {name}_layer_period - 1")
            periods[name] = (period, offset)
        blocks = [{"mixer": attention if i % periods["attn"][0] == periods["attn"][1] else mamba,
                   "mlp": moe if experts > 1 and i % periods["expert"][0] == periods["expert"][1] else mlp,
                   "norm": _rmsnorm(eps)} for i in range(layers)]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        n = len(blocks)
        attention = [i for i, b in enumerate(blocks) if b.mixer.kind == "softmax"]
        sparse = [i for i, b in enumerate(blocks) if b.mlp.kind == "moe"]
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "mamba"), None)
        if mamba is None or not attention or any(b.mixer.kind not in ("softmax", "mamba") for b in blocks):
            raise NotExpressible("jamba has Mamba-1 layers and softmax attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": n, "rms_norm_eps": spec.final_norm.eps,
                  "num_attention_heads": blocks[attention[0]].mixer.heads,
                  "num_key_value_heads": blocks[attention[0]].mixer.kv_heads or blocks[attention[0]].mixer.heads,
                  **mamba1_config(mamba, spec.d_model, self.FIELDS),
                  "attn_layer_period": _period(attention, n), "attn_layer_offset": attention[0]}
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = blocks[sparse[0]].mlp if sparse else None
        mlp = dense or moe
        config["intermediate_size"] = mlp.hidden
        config["hidden_act"] = ACTIVATION_NAMES[mlp.activation]
        if moe is None:
            config.update(num_experts=1, expert_layer_period=1, expert_layer_offset=0)
        else:
            config.update(num_experts=moe.experts, num_experts_per_tok=moe.top_k,
                          expert_layer_period=_period(sparse, n), expert_layer_offset=sparse[0])
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            if block.mixer.kind == "mamba":
                links += mamba1_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
            else:
                links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight")]
            if block.mlp.kind == "moe":
                links += _moe_links(block.mlp, f"{theirs}feed_forward.", f"{ours}mlp.", router="router")
            else:
                links += _mlp_links(f"{theirs}feed_forward.", f"{ours}mlp.", block.mlp.bias)
        return links


def _period(indices: list[int], layers: int) -> int:
    """The period p of layer indices i0, i0 + p, i0 + 2p, ... (one index: any period past the last layer)."""
    period = indices[1] - indices[0] if len(indices) > 1 else layers
    if indices != list(range(indices[0], layers, period)):
        raise NotExpressible(f"layers {indices} are not every {period}th layer from layer {indices[0]}")
    return period


def _attention_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """Softmax attention's q, k, v and o projections (``o_proj`` is attnspec's ``out_proj``)."""
    links = [rename(f"{theirs}{n}_proj.weight", f"{ours}{n}_proj.weight") for n in "qkv"]
    links.append(rename(f"{theirs}o_proj.weight", f"{ours}out_proj.weight"))
    if bias:
        links += [rename(f"{theirs}{n}_proj.bias", f"{ours}{n}_proj.bias") for n in "qkv"]
        links.append(rename(f"{theirs}o_proj.bias", f"{ours}out_proj.bias"))
    return links


class Bamba(Architecture):
    """Bamba: Mamba2 layers and softmax attention layers (GQA, partial RoPE) at ``attn_layer_indices``,
    each followed by a SiLU GLU MLP; RMSNorms."""

    model_types = ("bamba",)
    causal_lm = {"bamba": "BambaForCausalLM"}
    FIELDS = {"heads": "mamba_n_heads", "head_dim": "mamba_d_head", "expand": "mamba_expand",
              "state": "mamba_d_state", "groups": "mamba_n_groups", "conv": "mamba_d_conv",
              "conv_bias": "mamba_conv_bias", "chunk": "mamba_chunk_size", "bias": "mamba_proj_bias",
              "eps": "rms_norm_eps"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        attention_layers = config.layer_list("attn_layer_indices", layers)
        heads, kv_heads, head_dim = config.attention_heads(None)
        bias = config.get("attention_bias", bool, False)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                     "out_bias": bias, "position": config.rope(head_dim, 0.5)}
        if kv_heads != heads:
            attention["kv_heads"] = kv_heads
        mamba = mamba2_mixer(config, self.FIELDS)
        mlp = _glu(config, bias=config.get("mlp_bias", bool, False))
        blocks = [{"mixer": attention if i in attention_layers else mamba, "mlp": mlp, "norm": _rmsnorm(eps)}
                  for i in range(layers)]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "linear"), None)
        if attention is None or mamba is None or getattr(attention.position, "kind", None) != "rope":
            raise NotExpressible("bamba has Mamba2 layers and rotary softmax attention layers")
        mlp = blocks[0].mlp
        return {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden or mlp.expansion * spec.d_model,
                "num_hidden_layers": len(blocks), "num_attention_heads": attention.heads,
                "num_key_value_heads": attention.kv_heads or attention.heads, "hidden_act": "silu",
                "rms_norm_eps": mamba.norm_eps, "attention_bias": attention.qkv_bias,
                "mlp_bias": mlp.bias, "rope_parameters": {**_rope_parameters(attention.position),
                                                          "partial_rotary_factor": attention.position.rotary_fraction},
                "attn_layer_indices": [i for i, b in enumerate(blocks) if b.mixer.kind == "softmax"],
                **mamba2_config(mamba, spec.d_model, self.FIELDS), "time_step_limit": time_step_limit(mamba)}

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            if block.mixer.kind == "linear":
                links += mamba2_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
            else:
                links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight")]
            links += _mlp_links(f"{theirs}feed_forward.", f"{ours}mlp.", block.mlp.bias)
        return links


class NemotronH(Architecture):
    """Nemotron-H: one sub-layer per layer, x + f(RMSNorm(x)), f one of Mamba2 (Δ clamped below at
    ``time_step_min``), softmax attention without positions (GQA), a plain MLP (squared ReLU), or a
    mixture of plain experts (sigmoid scores with a correction bias, group-limited, a shared expert):
    ``layers_block_type``. The MLP and expert layers are blocks without a mixer (``mixer: none``)."""

    model_types = ("nemotron_h",)
    causal_lm = {"nemotron_h": "NemotronHForCausalLM"}
    FIELDS = {"heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "expand": "expand", "state": "ssm_state_size",
              "groups": "n_groups", "conv": "conv_kernel", "conv_bias": "use_conv_bias", "chunk": "chunk_size",
              "bias": "use_bias", "eps": "layer_norm_epsilon", "act": "mamba_hidden_act"}
    TYPES = ("linear_attention", "full_attention", "mlp", "moe")

    def spec(self, config: Config, model_type: str) -> dict:
        types = config.get("layers_block_type", list)
        if not 0 < len(types) <= limits.MAX_BLOCKS or any(t not in self.TYPES for t in types):
            raise config.refuse("layers_block_type", f"must list 1 to {limits.MAX_BLOCKS} layers, each one of "
                                f"{', '.join(self.TYPES)}")
        if config.get("num_nextn_predict_layers", int, 0):
            raise config.refuse("num_nextn_predict_layers", "multi-token prediction layers are not imported")
        if config.get("moe_latent_size", int, None) is not None and "moe" in types:
            raise config.refuse("moe_latent_size", "experts in a latent space of their own are not an attnspec "
                                "MLP", [i for i, t in enumerate(types) if t == "moe"])
        eps = config.number("layer_norm_epsilon", 1e-5)
        layers = {}
        if "linear_attention" in types:
            layers["linear_attention"] = mamba2_mixer(config, self.FIELDS, (config.number("time_step_min", 0.001),
                                                                             math.inf)), "none"
        if "full_attention" in types:
            heads, kv_heads, head_dim = config.attention_heads()
            attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                         "position": {"kind": "none"}, **({"kv_heads": kv_heads} if kv_heads != heads else {})}
            layers["full_attention"] = attention, "none"
        act = config.activation("mlp_hidden_act", allowed=("relu2", "relu", "silu", "gelu", "gelu_tanh"))
        bias = config.get("mlp_bias", bool, False)
        if "mlp" in types:
            layers["mlp"] = "none", {"kind": "mlp", "hidden": config.count("intermediate_size"), "activation": act,
                                     "bias": bias}
        if "moe" in types:
            if bias:
                raise config.refuse("mlp_bias", "the shared expert's biases are not imported (experts have none)")
            experts = config.count("n_routed_experts", limit=limits.MAX_EXPERTS)
            groups = config.count("n_group", 1)
            layers["moe"] = "none", {
                "kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 2),
                "hidden": config.count("moe_intermediate_size"), "activation": act, "gated": False,
                "scoring": "sigmoid", "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
                "routed_scale": config.number("routed_scaling_factor", 1.0), "groups": groups,
                "top_groups": config.count("topk_group", 1), "shared": 1,
                "shared_hidden": config.count("moe_shared_expert_intermediate_size")}
        blocks = [{"mixer": layers[t][0], "mlp": layers[t][1], "norm": _rmsnorm(eps)} for t in types]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        types = []
        for block in blocks:
            kind = (block.mixer.kind, block.mlp.kind)
            if kind not in (("linear", "none"), ("softmax", "none"), ("none", "mlp"), ("none", "moe")):
                raise NotExpressible("each nemotron_h layer is one of Mamba2, attention, an MLP or experts")
            types.append({"linear": "linear_attention", "softmax": "full_attention"}.get(kind[0], kind[1]))
        config = {"hidden_size": spec.d_model, "layers_block_type": types, "layer_norm_epsilon": spec.final_norm.eps}
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "linear"), None)
        if mamba is not None:
            config.update(mamba2_config(mamba, spec.d_model, self.FIELDS), mamba_hidden_act="silu",
                          time_step_min=mamba.transition.dt_min or 0.0)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if attention is not None:
            config.update({"num_attention_heads": attention.heads, "head_dim": attention.d_qk,
                           "num_key_value_heads": attention.kv_heads or attention.heads})
        mlp = next((b.mlp for b in blocks if b.mlp.kind == "mlp"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if mlp is not None:
            config.update({"intermediate_size": mlp.hidden, "mlp_bias": mlp.bias})
        if mlp is not None or moe is not None:
            config["mlp_hidden_act"] = ACTIVATION_NAMES[(mlp or moe).activation]
        if moe is not None:
            config.update({"n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                           "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
                           "topk_group": moe.top_groups or moe.groups,
                           "moe_shared_expert_intermediate_size": moe.shared_hidden or moe.hidden})
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "backbone.embeddings.weight", "backbone.norm_f.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"backbone.layers.{index}.", _block_prefix(index)
            if block.mixer.kind == "linear":
                links += mamba2_links(block.mixer, f"{theirs}mixer.", f"{ours}mixer.")
            elif block.mixer.kind == "softmax":
                links += _attention_links(f"{theirs}mixer.", f"{ours}mixer.", False)
            elif block.mlp.kind == "moe":
                links += _moe_links(block.mlp, f"{theirs}mixer.", f"{ours}mlp.", shared="shared_experts")
            else:
                links += _plain_mlp_links(f"{theirs}mixer.", f"{ours}mlp.", block.mlp.bias)
            norm = "norm1" if block.mlp.kind == "none" else "norm2"  # the one norm of a layer: its sub-layer's
            links.append(rename(f"{theirs}norm.weight", f"{ours}{norm}.weight"))
        return links


class GraniteMoeHybrid(Architecture):
    """Granite 4.0-H: Mamba2 layers and softmax attention layers (GQA, RoPE or none, the softmax scale
    ``attention_multiplier``), each followed by experts (softmax over the top-k logits, i.e. renormalised
    top-k; GLU experts stored fused) plus a shared GLU MLP, or by the shared MLP alone; muP
    multipliers on the embeddings (``embedding_multiplier``), every residual branch
    (``residual_multiplier``) and the logits (divided by ``logits_scaling``)."""

    model_types = ("granitemoehybrid",)
    causal_lm = {"granitemoehybrid": "GraniteMoeHybridForCausalLM"}
    FIELDS = {**Bamba.FIELDS, "eps": "rms_norm_eps"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        types = config.layer_types(layers, ["linear_attention"] * layers)
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention (Mamba2) or full_attention", unknown)
        heads, kv_heads, head_dim = config.attention_heads(None)
        bias = config.get("attention_bias", bool, False)
        kind = config.get("position_embedding_type", str, None)
        if kind not in (None, "rope", "nope"):
            raise config.refuse("position_embedding_type", f"{shorten(kind)!r}: rope or none import")
        attention = {"kind": "softmax", "heads": heads, "qkv_bias": bias, "out_bias": bias,
                     "scale": config.number("attention_multiplier", 1.0),
                     "position": config.rope(head_dim) if kind == "rope" else {"kind": "none"},
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        mamba = mamba2_mixer(config, self.FIELDS) if "linear_attention" in types else None
        shared = config.count("shared_intermediate_size")
        experts = config.get("num_local_experts", int, 8)
        if experts < 0 or experts > limits.MAX_EXPERTS:
            raise config.refuse("num_local_experts", f"must be from 0 to {limits.MAX_EXPERTS}")
        act = config.activation()
        mlp = ({"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 2),
                "hidden": config.count("intermediate_size"), "activation": act, "shared": 1, "shared_hidden": shared}
               if experts else {"kind": "glu", "hidden": shared, "activation": act, "bias": False})
        multiplier = config.number("residual_multiplier", 1.0)
        blocks = [{"mixer": mamba if t == "linear_attention" else attention, "mlp": mlp, "norm": _rmsnorm(eps),
                   **({"residual_scale": multiplier} if multiplier != 1.0 else {})} for t in types]
        embedding = config.number("embedding_multiplier", 1.0)
        logits = config.number("logits_scaling", 1.0, positive=True)
        common = _common(config)
        if embedding != 1.0:
            common["input"]["scale"] = embedding
        return {**common, "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": {**_head(config, False), "scale": 1.0 / logits}}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        mamba = next((b.mixer for b in blocks if b.mixer.kind == "linear"), None)
        if any(b.mixer.kind not in ("softmax", "linear") or b.mlp != blocks[0].mlp for b in blocks):
            raise NotExpressible("granitemoehybrid has Mamba2 and attention layers, each with the same MLP")
        mlp = blocks[0].mlp
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "layer_types": ["full_attention" if b.mixer.kind == "softmax" else "linear_attention"
                                  for b in blocks],
                  "embedding_multiplier": spec.input.scale, "residual_multiplier": blocks[0].scales()[0][1],
                  "logits_scaling": 1.0 / spec.head.scale, "hidden_act": ACTIVATION_NAMES[mlp.activation]}
        if mlp.kind == "moe":
            config.update(num_local_experts=mlp.experts, num_experts_per_tok=mlp.top_k, intermediate_size=mlp.hidden,
                          shared_intermediate_size=mlp.shared_hidden or mlp.hidden)
        else:
            config.update(num_local_experts=0, shared_intermediate_size=mlp.hidden)
        if attention is not None:
            rope = attention.position.kind == "rope"
            config.update({"num_attention_heads": attention.heads,
                           "num_key_value_heads": attention.kv_heads or attention.heads,
                           "attention_bias": attention.qkv_bias, "attention_multiplier": attention.scale,
                           "position_embedding_type": "rope" if rope else None,
                           **({"rope_parameters": _rope_parameters(attention.position)} if rope else {})})
        if mamba is not None:
            config.update(mamba2_config(mamba, spec.d_model, self.FIELDS), time_step_limit=time_step_limit(mamba))
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            if block.mixer.kind == "linear":
                links += mamba2_links(block.mixer, f"{theirs}mamba.", f"{ours}mixer.")
            else:
                links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            mlp, shared = block.mlp, f"{ours}mlp." if block.mlp.kind == "glu" else f"{ours}mlp.shared."
            links += [Link(f"{theirs}shared_mlp.input_linear.weight", (f"{shared}up.weight", f"{shared}gate.weight")),
                      rename(f"{theirs}shared_mlp.output_linear.weight", f"{shared}down.weight")]
            if mlp.kind == "moe":  # experts fused: input_linear (E, 2 hidden, d) = each expert's up | gate
                moe, routed = f"{theirs}block_sparse_moe.", [f"{ours}mlp.routed.{e}." for e in range(mlp.experts)]
                links += [rename(f"{moe}router.layer.weight", f"{ours}mlp.router.weight"),
                          Link(f"{moe}input_linear.weight",
                               tuple(f"{r}{n}.weight" for r in routed for n in ("up", "gate")), stack=mlp.experts),
                          Link(f"{moe}output_linear.weight", tuple(f"{r}down.weight" for r in routed),
                               stack=mlp.experts)]
        return links


class Gemma3(Architecture):
    """Gemma 3's text model: sandwich norms (a norm before and after each sub-layer, RMSNorms of
    weight 1 + w), GQA attention with QK-norm, the softmax scale ``query_pre_attn_scalar``^-1/2, sliding
    windows and RoPE bases per layer type (local and global), a tanh-GeLU GLU MLP, embeddings times
    sqrt(hidden_size), a tied head with an optional logit soft-cap. Multimodal Gemma 3 imports its text model."""

    model_types = ("gemma3_text",)
    causal_lm = {"gemma3_text": "Gemma3ForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        heads, kv_heads, head_dim = config.attention_heads()
        for field in ("attn_logit_softcapping", "use_bidirectional_attention"):
            if config.get(field, (int, float, bool), None):
                raise config.refuse(field, "capped attention logits and bidirectional attention are not attnspec's "
                                    "softmax attention; unset imports")
        eps = config.number("rms_norm_eps", 1e-6)
        bias = config.get("attention_bias", bool, False)
        window = config.count("sliding_window", 4096)
        pattern = config.count("sliding_window_pattern", 6)
        types = config.layer_types(layers, ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                            for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("sliding_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is sliding_attention or full_attention", unknown)
        mlp = {"kind": "glu", "hidden": config.count("intermediate_size"), "bias": False,
               "activation": config.activation("hidden_activation")}
        blocks = []
        for layer_type in types:
            mixer = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "qkv_bias": bias,
                     "out_bias": bias, "qk_norm": "rmsnorm", "norm_eps": eps,
                     "scale": config.number("query_pre_attn_scalar", 256, positive=True) ** -0.5,
                     "position": config.rope(head_dim, layer_type=layer_type),
                     **({"kv_heads": kv_heads} if kv_heads != heads else {}),
                     **({"window": window} if layer_type == "sliding_attention" else {})}
            blocks.append({"mixer": mixer, "mlp": mlp, "norm": _rmsnorm(eps), "norm_placement": "sandwich"})
        common = _common(config)
        common["input"]["scale"] = math.sqrt(d_model)
        softcap = config.number("final_logit_softcapping", None) if config.data.get("final_logit_softcapping") else None
        head = {**_head(config, True), **({"softcap": softcap} if softcap else {})}
        return {**common, "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        first = blocks[0].mixer
        if any(b.mixer.kind != "softmax" or b.norm_placement != "sandwich" for b in blocks):
            raise NotExpressible("gemma3 is softmax attention with sandwich norms in every block")
        windows = [b.mixer.window for b in blocks]
        types = ["full_attention" if w is None else "sliding_attention" for w in windows]
        rope = {t: _rope_parameters(b.mixer.position) for t, b in zip(types, blocks)}
        mlp = blocks[0].mlp
        config = {"hidden_size": spec.d_model, "intermediate_size": mlp.hidden, "num_hidden_layers": len(blocks),
                  "num_attention_heads": first.heads, "num_key_value_heads": first.kv_heads or first.heads,
                  "head_dim": first.d_qk, "hidden_activation": ACTIVATION_NAMES[mlp.activation],
                  "rms_norm_eps": first.norm_eps, "attention_bias": first.qkv_bias, "layer_types": types,
                  "sliding_window": next((w for w in windows if w is not None), 4096), "rope_parameters": rope,
                  "query_pre_attn_scalar": first.scale ** -2, "final_logit_softcapping": spec.head.softcap}
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight", 1.0)
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
            links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q", 1.0),
                      rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k", 1.0)]
            for their_norm, our_norm in (("input_layernorm", "norm1"), ("post_attention_layernorm", "post_norm1"),
                                         ("pre_feedforward_layernorm", "norm2"),
                                         ("post_feedforward_layernorm", "post_norm2")):
                links.append(rename(f"{theirs}{their_norm}.weight", f"{ours}{our_norm}.weight", 1.0))
            links += _mlp_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


class Lfm2(Architecture):
    """LFM2: gated short convolutions (``conv`` layers) and softmax attention with QK-norm, RoPE and GQA
    (``full_attention`` layers), each followed by a SiLU GLU MLP (whose width LFM2 derives from
    ``intermediate_size`` when ``block_auto_adjust_ff_dim``); RMSNorms, a tied head."""

    model_types = ("lfm2",)
    causal_lm = {"lfm2": "Lfm2ForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        heads, kv_heads, head_dim = config.attention_heads(None)
        attention_layers = config.layer_list("full_attn_idxs", layers) if "full_attn_idxs" in config.data else None
        types = config.layer_types(layers, ["full_attention" if attention_layers is None or i in attention_layers
                                            else "conv" for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("conv", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is conv or full_attention", unknown)
        eps = config.number("norm_eps", 1e-5)
        bias = config.get("conv_bias", bool, False)
        conv = {"kind": "gated_conv", "qkv_bias": bias, "out_bias": bias,
                "conv": {"kind": "short", "width": config.count("conv_L_cache", 3, limit=limits.MAX_CONV_WIDTH),
                         "projections": ["v"], "bias": bias}}
        attention = {"kind": "softmax", "heads": heads, "qk_norm": "rmsnorm", "norm_eps": eps,
                     "position": config.rope(head_dim), **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        mlp = {"kind": "glu", "hidden": self._hidden(config), "activation": "silu", "bias": False}
        blocks = [{"mixer": conv if t == "conv" else attention, "mlp": mlp, "norm": _rmsnorm(eps)} for t in types]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, True)}

    @staticmethod
    def _hidden(config: Config) -> int:
        """The MLP's width as Lfm2MLP derives it."""
        hidden = config.count("intermediate_size")
        if not config.get("block_auto_adjust_ff_dim", bool, True):
            return hidden
        hidden = int(2 * hidden / 3)
        multiplier = config.number("block_ffn_dim_multiplier", 1.0) if config.data.get(
            "block_ffn_dim_multiplier") is not None else None
        if multiplier is not None:
            multiple = config.count("block_multiple_of", 256)
            hidden = multiple * ((int(multiplier * hidden) + multiple - 1) // multiple)
        if hidden <= 0:
            raise config.refuse("intermediate_size", "the MLP width it implies is not positive")
        return hidden

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        conv = next((b.mixer for b in blocks if b.mixer.kind == "gated_conv"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if any(b.mixer.kind not in ("gated_conv", "softmax") for b in blocks) or conv is None:
            raise NotExpressible("lfm2 has gated convolution layers and attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "norm_eps": spec.final_norm.eps,
                  "layer_types": ["conv" if b.mixer.kind == "gated_conv" else "full_attention" for b in blocks],
                  "intermediate_size": blocks[0].mlp.hidden, "block_auto_adjust_ff_dim": False,
                  "conv_L_cache": conv.conv.width, "conv_bias": conv.qkv_bias}
        if attention is not None:
            config.update({"num_attention_heads": attention.heads,
                           "num_key_value_heads": attention.kv_heads or attention.heads,
                           "rope_parameters": _rope_parameters(attention.position)})
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.embedding_norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            mixer = block.mixer
            if mixer.kind == "gated_conv":
                names = ["in_proj.weight", "out_proj.weight"] + (["in_proj.bias", "out_proj.bias"] if mixer.qkv_bias
                                                                 else [])
                links += [rename(f"{theirs}conv.{name}", f"{ours}mixer.{name}") for name in names]
                links.append(Link(f"{theirs}conv.conv.weight", (f"{ours}mixer.conv.filters.v",), conv=True))
                if mixer.conv.bias:
                    links.append(rename(f"{theirs}conv.conv.bias", f"{ours}mixer.conv.biases.v"))
            else:
                a = f"{theirs}self_attn."
                links += [rename(f"{a}{n}_proj.weight", f"{ours}mixer.{n}_proj.weight") for n in "qkv"]
                links += [rename(f"{a}out_proj.weight", f"{ours}mixer.out_proj.weight"),
                          rename(f"{a}q_layernorm.weight", f"{ours}mixer.qk_norm.q"),
                          rename(f"{a}k_layernorm.weight", f"{ours}mixer.qk_norm.k")]
            links += [rename(f"{theirs}operator_norm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}ffn_norm.weight", f"{ours}norm2.weight")]
            links += [rename(f"{theirs}feed_forward.{t}.weight", f"{ours}mlp.{o}.weight")
                      for t, o in (("w1", "up"), ("w3", "gate"), ("w2", "down"))]
        return links


class DeepseekV3(Architecture):
    """DeepSeek-V3: multi-head latent attention (interleaved RoPE on its decoupled part, YaRN's softmax
    scale) in every layer, GLU MLPs in the first ``first_k_dense_replace`` layers and experts after
    (sigmoid scores with a correction bias, group-limited routing, renormalised top-k times
    ``routed_scaling_factor``, shared experts). transformers runs no multi-token-prediction layer."""

    model_types = ("deepseek_v3",)
    causal_lm = {"deepseek_v3": "DeepseekV3ForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-6)
        attention = mla_mixer(config)
        dense = config.get("first_k_dense_replace", int, 3)
        experts = config.count("n_routed_experts", limit=limits.MAX_EXPERTS)
        shared = config.get("n_shared_experts", int, 1)
        if not 0 <= shared <= limits.MAX_EXPERTS:
            raise config.refuse("n_shared_experts", f"must be from 0 to {limits.MAX_EXPERTS}")
        moe = {"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 8),
               "hidden": config.count("moe_intermediate_size"), "activation": config.activation(),
               "scoring": "sigmoid", "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
               "routed_scale": config.number("routed_scaling_factor", 1.0), "groups": config.count("n_group", 1),
               "top_groups": config.count("topk_group", 1), "shared": shared,
               **({"shared_hidden": shared * config.count("moe_intermediate_size")} if shared else {})}
        blocks = [{"mixer": attention, "mlp": _glu(config) if i < dense else moe, "norm": _rmsnorm(eps)}
                  for i in range(layers)]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        if any(b.mixer.kind != "mla" for b in blocks):
            raise NotExpressible("deepseek_v3 is latent attention in every block")
        dense = next((i for i, b in enumerate(blocks) if b.mlp.kind == "moe"), len(blocks))
        if any(b.mlp.kind != "moe" for b in blocks[dense:]) or any(b.mlp.kind != "glu" for b in blocks[:dense]):
            raise NotExpressible("deepseek_v3 has dense MLPs in its first layers and experts after them")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "first_k_dense_replace": dense, **mla_config(blocks[0].mixer)}
        mlp = blocks[0].mlp if dense else None
        if mlp is not None:
            config["intermediate_size"] = mlp.hidden
        moe = blocks[dense].mlp if dense < len(blocks) else None
        if moe is not None:
            config.update({"n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                           "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
                           "topk_group": moe.top_groups or moe.groups, "n_shared_experts": moe.shared})
        config["hidden_act"] = ACTIVATION_NAMES[(mlp or moe).activation]
        return config

    def unused(self, name: str, spec) -> bool:
        """The multi-token-prediction layers released checkpoints carry past the last layer (transformers
        leaves them unread; so does attnspec)."""
        match = re.match(r"model\.layers\.(\d+)\.", name)
        return match is not None and int(match.group(1)) >= len(_blocks(spec))

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            links += mla_links(block.mixer, f"{theirs}self_attn.", f"{ours}mixer.")
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            if block.mlp.kind == "moe":
                links += _moe_links(block.mlp, f"{theirs}mlp.", f"{ours}mlp.", shared="shared_experts")
            else:
                links += _mlp_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


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
    if position.get("scaling", "none") != "none" and _positive(mscale_all):
        scale *= _yarn_mscale(position["factor"], mscale_all) ** 2
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
    parameters = _rope_parameters(position)
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


class KimiLinear(Architecture):
    """Kimi Linear: KDA layers (the delta rule with a per-channel gate over one A per head, a low-rank
    gate projection and a low-rank sigmoid output gate after a per-head RMSNorm) and latent attention
    without positions (``full_attention``), each followed by a dense GLU MLP or experts (``mlp_layer_types``:
    sigmoid scores, a correction bias, group-limited, renormalised, scaled, shared experts)."""

    model_types = ("kimi_linear",)
    causal_lm = {"kimi_linear": "KimiLinearForCausalLM"}
    STORED = {"model_max_length": "max_position_embeddings", "moe_renormalize": "norm_topk_prob",
              "num_expert_group": "n_group", "num_experts_per_token": "num_experts_per_tok",
              "num_shared_experts": "n_shared_experts"}
    """The names KimiLinearConfig writes (its attribute_map) -> the names read here."""

    def spec(self, config: Config, model_type: str) -> dict:
        config = Config({self.STORED.get(k, k): v for k, v in config.data.items()}, config.source)
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        types = config.layer_types(layers, ["full_attention" if i and i % 4 == 0 else "linear_attention"
                                            for i in range(layers)])
        mlp_types = config.get("mlp_layer_types", list, None) or ["dense"] + ["sparse"] * (layers - 1)
        if len(mlp_types) != layers or any(t not in ("dense", "sparse") for t in mlp_types):
            raise config.refuse("mlp_layer_types", f"must list dense or sparse for each of the {layers} layers")
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention (KDA) or full_attention", unknown)
        heads, head_dim = config.count("linear_num_heads"), config.count("linear_head_dim")
        kda = {"kind": "delta", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "feature_map": "l2norm",
               "transition": {"kind": "mamba", "per": "channel", "rank": head_dim, "shared_a": True},
               "conv": {"kind": "short", "projections": ["q", "k", "v"],
                        "width": config.count("linear_conv_kernel_dim", 4, limit=limits.MAX_CONV_WIDTH),
                        "activation": config.activation(allowed=("silu",))},
               "group_norm": True, "shared_norm_weight": True, "output_gate": "sigmoid", "gate_rank": head_dim,
               "norm_eps": eps}
        attention = {**mla_mixer(config), "position": {"kind": "none"}}
        attention.pop("scale")  # NoPE: the softmax scale is qk_head_dim^-1/2, the default
        experts = config.count("num_experts", 256, limit=limits.MAX_EXPERTS)
        shared = config.get("n_shared_experts", int, 1)
        if not 0 <= shared <= limits.MAX_EXPERTS:
            raise config.refuse("n_shared_experts", f"must be from 0 to {limits.MAX_EXPERTS}")
        moe = {"kind": "moe", "experts": experts, "top_k": config.count("num_experts_per_tok", 8),
               "hidden": config.count("moe_intermediate_size"), "activation": config.activation(),
               "scoring": "sigmoid", "score_bias": True, "normalize": config.get("norm_topk_prob", bool, True),
               "routed_scale": config.number("routed_scaling_factor", 1.0), "groups": config.count("n_group", 1),
               "top_groups": config.count("topk_group", 1), "shared": shared,
               **({"shared_hidden": shared * config.count("moe_intermediate_size")} if shared else {})}
        blocks = [{"mixer": kda if t == "linear_attention" else attention,
                   "mlp": moe if m == "sparse" else _glu(config), "norm": _rmsnorm(eps)}
                  for t, m in zip(types, mlp_types)]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        kda = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "mla"), None)
        if any(b.mixer.kind not in ("delta", "mla") for b in blocks) or kda is None:
            raise NotExpressible("kimi_linear has KDA layers and latent attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "layer_types": ["linear_attention" if b.mixer.kind == "delta" else "full_attention" for b in blocks],
                  "mlp_layer_types": ["sparse" if b.mlp.kind == "moe" else "dense" for b in blocks],
                  "linear_num_heads": kda.heads, "linear_head_dim": kda.d_qk,
                  "linear_conv_kernel_dim": kda.conv.width}
        if attention is not None:
            config.update(mla_config(attention))
        dense = next((b.mlp for b in blocks if b.mlp.kind == "glu"), None)
        moe = next((b.mlp for b in blocks if b.mlp.kind == "moe"), None)
        if dense is not None:
            config["intermediate_size"] = dense.hidden
        if moe is not None:
            config.update({"num_experts": moe.experts, "num_experts_per_tok": moe.top_k,
                           "moe_intermediate_size": moe.hidden, "norm_topk_prob": moe.normalize,
                           "routed_scaling_factor": moe.routed_scale, "n_group": moe.groups,
                           "topk_group": moe.top_groups or moe.groups, "n_shared_experts": moe.shared})
        config["hidden_act"] = ACTIVATION_NAMES[(dense or moe).activation]
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            mixer = block.mixer
            if mixer.kind == "mla":
                links += mla_links(mixer, f"{theirs}self_attn.", f"{ours}mixer.")
            else:
                a, m = f"{theirs}self_attn.", f"{ours}mixer."
                links += [rename(f"{a}{n}_proj.weight", f"{m}{n}_proj.weight") for n in "qkv"]
                links += [Link(f"{a}{n}_conv1d.weight", (f"{m}conv.filters.{n}",), conv=True) for n in "qkv"]
                links += [rename(f"{a}f_a_proj.weight", f"{m}transition.dt_proj.0.weight"),
                          rename(f"{a}f_b_proj.weight", f"{m}transition.dt_proj.1.weight"),
                          rename(f"{a}dt_bias", f"{m}transition.dt_bias"),
                          Link(f"{a}A_log", (f"{m}transition.A_log",), view=(1, 1, mixer.heads, 1)),
                          rename(f"{a}b_proj.weight", f"{m}beta_proj.weight"),
                          rename(f"{a}g_a_proj.weight", f"{m}gate_down.weight"),
                          rename(f"{a}g_b_proj.weight", f"{m}gate.weight"),
                          rename(f"{a}o_norm.weight", f"{m}norm_weight"),
                          rename(f"{a}o_proj.weight", f"{m}out_proj.weight")]
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            mlp = f"{theirs}block_sparse_moe."  # Kimi's checkpoints keep Mixtral's names, dense layers too
            if block.mlp.kind == "moe":
                links += _moe_links(block.mlp, mlp, f"{ours}mlp.", shared="shared_experts", expert_links=_w123_links)
            else:
                links += _mlp_links(mlp, f"{ours}mlp.", False)
        return links


class OlmoHybrid(Architecture):
    """OLMo hybrid: Gated DeltaNet layers (pre-norm; beta in [0, 2] with ``linear_allow_neg_eigval``) and
    softmax attention layers in OLMo 2's placement, x + norm(f(x)), with QK-norm over the whole projection
    width and RoPE or none; each followed by a SiLU GLU MLP."""

    model_types = ("olmo_hybrid",)
    causal_lm = {"olmo_hybrid": "OlmoHybridForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        eps = config.number("rms_norm_eps", 1e-6)
        types = config.layer_types(layers, ["full_attention" if i % 4 == 3 else "linear_attention"
                                            for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention or full_attention", unknown)
        heads, kv_heads, head_dim = config.attention_heads(None)
        bias = config.get("attention_bias", bool, False)
        parameters = config.get("rope_parameters", dict, None)
        rope = parameters is not None and parameters.get("rope_theta") is not None  # released checkpoints: none
        attention = {"kind": "softmax", "heads": heads, "qk_norm": "rmsnorm_full", "norm_eps": eps, "qkv_bias": bias,
                     "out_bias": bias, "position": config.rope(head_dim) if rope else {"kind": "none"},
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        v_heads, k_heads = config.count("linear_num_value_heads", heads), config.count("linear_num_key_heads", heads)
        if v_heads % k_heads:
            raise config.refuse("linear_num_key_heads", f"{v_heads} value heads cannot share {k_heads} key heads")
        d_qk = config.count("linear_key_head_dim", int(0.75 * d_model / k_heads))
        delta = {"kind": "delta", "heads": v_heads, "d_qk": d_qk,
                 "d_v": config.count("linear_value_head_dim", 2 * d_qk),
                 "feature_map": "l2norm", "transition": {"kind": "mamba", "per": "head"},
                 "beta": "2sigmoid" if config.get("linear_allow_neg_eigval", bool, True) else "sigmoid",
                 "conv": {"kind": "short", "projections": ["q", "k", "v"],
                          "width": config.count("linear_conv_kernel_dim", 4, limit=limits.MAX_CONV_WIDTH),
                          "activation": config.activation(allowed=("silu",))},
                 "group_norm": True, "shared_norm_weight": True, "output_gate": "swish", "norm_eps": 1e-5,
                 **({"qk_groups": k_heads} if k_heads != v_heads else {})}
        mlp = _glu(config)
        blocks = [{"mixer": delta, "mlp": mlp, "norm": _rmsnorm(eps)} if t == "linear_attention" else
                  {"mixer": attention, "mlp": mlp, "norm": _rmsnorm(eps), "norm_placement": "output"} for t in types]
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        delta = next((b.mixer for b in blocks if b.mixer.kind == "delta"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if delta is None or attention is None or any(b.mixer.kind not in ("delta", "softmax") for b in blocks):
            raise NotExpressible("olmo_hybrid has Gated DeltaNet layers and attention layers")
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "intermediate_size": blocks[0].mlp.hidden, "hidden_act": ACTIVATION_NAMES[blocks[0].mlp.activation],
                  "layer_types": ["linear_attention" if b.mixer.kind == "delta" else "full_attention" for b in blocks],
                  "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                  "attention_bias": attention.qkv_bias, "linear_num_value_heads": delta.heads,
                  "linear_num_key_heads": delta.qk_groups or delta.heads, "linear_key_head_dim": delta.d_qk,
                  "linear_value_head_dim": delta.d_v, "linear_conv_kernel_dim": delta.conv.width,
                  "linear_allow_neg_eigval": delta.beta == "2sigmoid",
                  "rope_parameters": _rope_parameters(attention.position) if attention.position.kind == "rope"
                  else None}
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            if block.mixer.kind == "delta":
                a, m = f"{theirs}linear_attn.", f"{ours}mixer."
                links += [rename(f"{a}{n}_proj.weight", f"{m}{n}_proj.weight") for n in "qkv"]
                links += [Link(f"{a}{n}_conv1d.weight", (f"{m}conv.filters.{n}",), conv=True) for n in "qkv"]
                links += [rename(f"{a}a_proj.weight", f"{m}transition.dt_proj.weight"),
                          rename(f"{a}dt_bias", f"{m}transition.dt_bias"),
                          rename(f"{a}A_log", f"{m}transition.A_log"),
                          rename(f"{a}b_proj.weight", f"{m}beta_proj.weight"),
                          rename(f"{a}g_proj.weight", f"{m}gate.weight"),
                          rename(f"{a}o_norm.weight", f"{m}norm_weight"),
                          rename(f"{a}o_proj.weight", f"{m}out_proj.weight")]
                norms = ("attention_layer_norm", "feedforward_layer_norm")  # OLMo-core's names, as saved
            else:
                links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.", block.mixer.qkv_bias)
                links += [rename(f"{theirs}self_attn.q_norm.weight", f"{ours}mixer.qk_norm.q"),
                          rename(f"{theirs}self_attn.k_norm.weight", f"{ours}mixer.qk_norm.k")]
                norms = ("feedforward_layer_norm", "post_feedforward_layernorm")  # on each sub-layer's output
            links += [rename(f"{theirs}{norms[0]}.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}{norms[1]}.weight", f"{ours}norm2.weight")]
            links += _mlp_links(f"{theirs}mlp.", f"{ours}mlp.", False)
        return links


class RecurrentGemma(Architecture):
    """RecurrentGemma (Griffin): RG-LRU recurrent blocks and local multi-query attention (partial RoPE, a
    window, a biased output projection) in ``block_types``' cycle, each followed by a biased tanh-GeLU GLU
    MLP of half ``intermediate_size``; RMSNorms of weight 1 + w, embeddings times sqrt(hidden_size)
    rounded to bfloat16 as transformers does, a tied head with a logit soft-cap."""

    model_types = ("recurrent_gemma",)
    causal_lm = {"recurrent_gemma": "RecurrentGemmaForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        layers, d_model = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS), config.count("hidden_size")
        eps = config.number("rms_norm_eps", 1e-6)
        heads, kv_heads, head_dim = config.attention_heads(None)
        cycle = config.get("block_types", list, ["recurrent", "recurrent", "attention"])
        if not cycle or any(t not in ("recurrent", "attention") for t in cycle):
            raise config.refuse("block_types", "must list recurrent and attention blocks")
        width = config.count("lru_width", d_model, limit=limits.MAX_INNER)
        act = config.activation("hidden_activation")
        recurrent = {"kind": "rglru", "heads": heads, "width": width, "activation": act, "qkv_bias": True,
                     "out_bias": True, "conv": {"kind": "short", "width": config.count("conv1d_width", 4,
                                                                                       limit=limits.MAX_CONV_WIDTH),
                                                "projections": ["v"], "bias": True}}
        attention = {"kind": "softmax", "heads": heads, "qkv_bias": config.get("attention_bias", bool, False),
                     "out_bias": True, "window": config.count("attention_window_size", 2048),
                     "position": config.rope(head_dim, 0.5),
                     **({"kv_heads": kv_heads} if kv_heads != heads else {})}
        mlp = {"kind": "glu", "hidden": config.count("intermediate_size") // 2, "activation": act, "bias": True}
        blocks = [{"mixer": recurrent if cycle[i % len(cycle)] == "recurrent" else attention, "mlp": mlp,
                   "norm": _rmsnorm(eps)} for i in range(layers)]
        common = _common(config)
        common["input"]["scale"] = float(torch.tensor(math.sqrt(d_model), dtype=torch.bfloat16))
        head = {**_head(config, True), "softcap": config.number("logits_soft_cap", 30.0)}
        return {**common, "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        recurrent = next((b.mixer for b in blocks if b.mixer.kind == "rglru"), None)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if recurrent is None or attention is None or any(b.mixer.kind not in ("rglru", "softmax") for b in blocks):
            raise NotExpressible("recurrent_gemma has RG-LRU blocks and local attention blocks")
        types = ["recurrent" if b.mixer.kind == "rglru" else "attention" for b in blocks]
        period = next(p for p in range(1, len(types) + 1) if all(types[i] == types[i % p] for i in range(len(types))))
        return {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                "lru_width": recurrent.width, "conv1d_width": recurrent.conv.width,
                "attention_window_size": attention.window, "attention_bias": attention.qkv_bias,
                "intermediate_size": 2 * blocks[0].mlp.hidden,
                "hidden_activation": ACTIVATION_NAMES[recurrent.activation],
                "block_types": types[:period], "logits_soft_cap": spec.head.softcap,
                "rope_parameters": {**_rope_parameters(attention.position),
                                    "partial_rotary_factor": attention.position.rotary_fraction}}

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.final_norm.weight", 1.0)
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            t, m = f"{theirs}temporal_block.", f"{ours}mixer."
            if block.mixer.kind == "rglru":
                names = [f"{n}.{p}" for n in ("linear_x", "linear_y", "linear_out") for p in ("weight", "bias")]
                links += [rename(f"{t}{n}", f"{m}{n}") for n in names]
                gates = [f"{g}_gate_{p}" for g in ("input", "recurrent") for p in ("weight", "bias")]
                lru = ["recurrent_param", *gates]
                links += [rename(f"{t}rg_lru.{n}", f"{m}{n}") for n in lru]
                links += [Link(f"{t}conv_1d.weight", (f"{m}conv.filters.v",), conv=True),
                          rename(f"{t}conv_1d.bias", f"{m}conv.biases.v")]
            else:
                links += _attention_links(t, m, block.mixer.qkv_bias)
                if not block.mixer.qkv_bias:
                    links.append(rename(f"{t}o_proj.bias", f"{m}out_proj.bias"))
            links += [rename(f"{theirs}temporal_pre_norm.weight", f"{ours}norm1.weight", 1.0),
                      rename(f"{theirs}channel_pre_norm.weight", f"{ours}norm2.weight", 1.0)]
            links += _mlp_links(f"{theirs}mlp_block.", f"{ours}mlp.", True)
        return links


class MiniMax(Architecture):
    """MiniMax-01/M1: lightning attention layers (linear attention with SiLU on q, k and v, a fixed decay
    per head from ALiBi's slopes scaled down with depth and stored as buffers, no normaliser, an RMSNorm
    over the whole output width, then a sigmoid output gate) and softmax attention layers (GQA, RoPE, an
    optional window), each followed by a Mixtral-style mixture of GLU experts. Every sub-layer keeps the
    normalised input as its skip, α norm(x) + β f(norm(x)), with α and β per kind of sub-layer."""

    model_types = ("minimax",)
    causal_lm = {"minimax": "MiniMaxForCausalLM"}
    DECAYS = ("query_decay", "key_decay", "diagonal_decay")
    """Buffers computed from the slopes (the blocked form's factors): transformers' chunked loop reads
    them, attnspec computes every mode from the slopes."""

    def spec(self, config: Config, model_type: str) -> dict:
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        eps = config.number("rms_norm_eps", 1e-5)
        types = config.layer_types(layers, ["full_attention" if i % 2 else "linear_attention" for i in range(layers)])
        unknown = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
        if unknown:
            raise config.refuse("layer_types", "each layer is linear_attention or full_attention", unknown)
        if config.number("router_jitter_noise", 0.0):
            raise config.refuse("router_jitter_noise", "attnspec's experts take no multiplicative jitter in training")
        heads, kv_heads, head_dim = config.attention_heads()
        act = config.activation(allowed=("silu",))  # lightning attention's q/k/v activation too
        window = config.count("sliding_window", None)
        attention = {"kind": "softmax", "heads": heads, "d_qk": head_dim, "d_v": head_dim,
                     "position": config.rope(head_dim), **({"kv_heads": kv_heads} if kv_heads != heads else {}),
                     **({"window": window} if window is not None else {})}
        lightning = {"kind": "linear", "heads": heads, "d_qk": head_dim, "d_v": head_dim, "feature_map": act,
                     "value_activation": act, "normalize": False, "position": {"kind": "none"},
                     "transition": {"kind": "fixed", "init": "alibi", "learnable": False},
                     "group_norm": True, "norm_span": "full", "output_gate": "sigmoid"}
        moe = {"kind": "moe", "experts": config.count("num_local_experts", 8, limit=limits.MAX_EXPERTS),
               "top_k": config.count("num_experts_per_tok", 2), "hidden": config.count("intermediate_size"),
               "activation": act}
        mlp_alpha, mlp_beta = (config.number(f"mlp_{f}_factor", 1.0) for f in ("alpha", "beta"))
        blocks = []
        for layer_type in types:
            kind = "linear_attn" if layer_type == "linear_attention" else "full_attn"
            alpha, beta = (config.number(f"{kind}_{f}_factor", 1.0) for f in ("alpha", "beta"))
            for field, value in ((f"{kind}_alpha_factor", alpha), (f"{kind}_beta_factor", beta),
                                 ("mlp_alpha_factor", mlp_alpha), ("mlp_beta_factor", mlp_beta)):
                if not 0 < value <= 1e4:
                    raise config.refuse(field, f"must be in (0, 10000] (an attnspec skip or residual scale), "
                                        f"got {shorten(value)}")
            blocks.append({"mixer": lightning if layer_type == "linear_attention" else attention, "mlp": moe,
                           "norm": _rmsnorm(eps), "norm_placement": "normed_residual",
                           "skip_scale": _scales(alpha, mlp_alpha), "residual_scale": _scales(beta, mlp_beta)})
        return {**_common(config), "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, False)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        attention = next((b.mixer for b in blocks if b.mixer.kind == "softmax"), None)
        if (any(b.mixer.kind not in ("softmax", "linear") or b.mlp.kind != "moe" for b in blocks)
                or attention is None or attention.position.kind != "rope"):
            raise NotExpressible("minimax has lightning and softmax attention layers (with RoPE), each with experts")
        moe = blocks[0].mlp
        config = {"hidden_size": spec.d_model, "num_hidden_layers": len(blocks), "rms_norm_eps": spec.final_norm.eps,
                  "layer_types": ["linear_attention" if b.mixer.kind == "linear" else "full_attention" for b in blocks],
                  "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads or attention.heads,
                  "head_dim": attention.d_qk, "sliding_window": getattr(attention, "window", None),
                  "rope_parameters": _rope_parameters(attention.position),
                  "hidden_act": ACTIVATION_NAMES[moe.activation],
                  "num_local_experts": moe.experts, "num_experts_per_tok": moe.top_k, "intermediate_size": moe.hidden}
        if attention.position.rotary_fraction != 1.0:
            config["rope_parameters"]["partial_rotary_factor"] = attention.position.rotary_fraction
        for block in blocks:  # α and β of each kind of sub-layer, read off the first block of that kind
            (alpha, beta), (mlp_alpha, mlp_beta) = block.scales()
            kind = "linear_attn" if block.mixer.kind == "linear" else "full_attn"
            config.setdefault(f"{kind}_alpha_factor", alpha)
            config.setdefault(f"{kind}_beta_factor", beta)
            config.setdefault("mlp_alpha_factor", mlp_alpha)
            config.setdefault("mlp_beta_factor", mlp_beta)
        return config

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.norm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            a, m = f"{theirs}self_attn.", f"{ours}mixer."
            if block.mixer.kind == "linear":  # qkv_proj packs each head's q, k and v together
                mixer = block.mixer
                links += [Link(f"{a}qkv_proj.weight", tuple(f"{m}{n}_proj.weight" for n in "qkv"), groups=mixer.heads),
                          Link(f"{a}slope_rate", (f"{m}transition.nu",), view=(mixer.heads, 1, 1), log=True),
                          rename(f"{a}norm.weight", f"{m}norm_weight"),
                          rename(f"{a}output_gate.weight", f"{m}gate.weight"),
                          rename(f"{a}out_proj.weight", f"{m}out_proj.weight")]
            else:
                links += _attention_links(a, m, False)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight")]
            links += _moe_links(block.mlp, f"{theirs}block_sparse_moe.", f"{ours}mlp.", expert_links=_w123_links)
        return links

    def unused(self, name: str, spec) -> bool:
        return name.rsplit(".", 1)[-1] in self.DECAYS and ".self_attn." in name

    def derived_tensors(self, spec, tensors: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
        """The blocked form's decay factors of each lightning layer, as MiniMaxLightningAttention computes
        them from its slopes s (H, 1, 1) and ``block_size`` b: exp(-s i) and exp(-s (b - i)) for i = 1..b,
        and exp(-s (i - j)) for i >= j (0 above the diagonal)."""
        block = config.get("block_size", 256)
        derived = {}
        for name, slope in tensors.items():
            if not name.endswith(".self_attn.slope_rate"):
                continue
            steps = torch.arange(block, dtype=slope.dtype) + 1
            prefix = name.removesuffix("slope_rate")
            gap = slope * (steps[:, None] - steps[None, :])[None]
            derived[f"{prefix}query_decay"] = torch.exp(-slope * steps[:, None])
            derived[f"{prefix}key_decay"] = torch.exp(-slope * (block - steps[:, None]))
            derived[f"{prefix}diagonal_decay"] = torch.exp(torch.where(gap >= 0, -gap, -math.inf))[None]
        return derived


class XLstm(Architecture):
    """xLSTM 7B's architecture: every block an mLSTM layer (the `mlstm` mixer: exponential input gates and
    sigmoid forget gates from their own projections, soft-capped; a LayerNorm per head; a sigmoid output
    gate) then a SiLU GLU, both pre-normed with RMSNorms; logits soft-capped."""

    model_types = ("xlstm",)
    causal_lm = {"xlstm": "xLSTMForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        d_model, heads = config.count("hidden_size"), config.count("num_heads")
        layers = config.count("num_hidden_layers", limit=limits.MAX_BLOCKS)
        if config.count("num_blocks", layers, limit=limits.MAX_BLOCKS) != layers:
            raise config.refuse("num_blocks", "must equal num_hidden_layers (transformers builds num_blocks blocks)")
        if config.count("embedding_dim", d_model) != d_model:
            raise config.refuse("embedding_dim", f"must equal hidden_size {d_model} (no projection joins them)")
        if config.get("weight_mode", str, "single") != "single":
            raise config.refuse("weight_mode", "'fused': transformers 5's own model of it cannot be built (its "
                                "initialisation fails), so no import could be held to it; 'single' imports")
        if config.get("use_bias", bool, False):
            raise config.refuse("use_bias", "biases on the norms: attnspec's RMSNorm and output norm have none")
        widths = {}
        for name, field in (("d_qk", "qk_dim_factor"), ("d_v", "v_dim_factor")):
            width = int(d_model * config.number(field, 0.5 if name == "d_qk" else 1.0))
            if width <= 0 or width % heads:
                raise config.refuse(field, f"hidden_size times it, {width}, must be a positive multiple of "
                                    f"num_heads {heads}")
            widths[name] = width // heads
        cap = config.number("gate_soft_cap", None)
        if cap is None or not 0 < cap <= 30:
            raise config.refuse("gate_soft_cap", "attnspec's mLSTM caps its gates at most at 30 (exp(i) then stays "
                                f"far inside float32 in every mode); got {shorten(cap)}")
        eps = config.number("norm_eps", 1e-6)
        mixer = {"kind": "mlstm", "heads": heads, **widths, "gate_softcap": cap, "eps": config.number("eps", 1e-6),
                 "norm_eps": eps}
        multiple = config.count("ffn_round_up_to_multiple_of", 64)
        hidden = multiple * math.ceil(d_model * config.number("ffn_proj_factor", 2.667) / multiple)
        block = {"mixer": mixer, "mlp": {"kind": "glu", "hidden": hidden, "activation": "silu", "bias": False},
                 "norm": _rmsnorm(eps)}
        head = _head(config, False)
        softcap = config.number("output_logit_soft_cap", None)
        if softcap is not None:
            head["softcap"] = softcap
        return {**_common(config), "max_len": config.count("max_position_embeddings", 2048),
                "layers": compress_layers([block] * layers), "final_norm": _rmsnorm(eps), "head": head}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
        mixer, mlp = blocks[0].mixer, blocks[0].mlp
        if mixer.kind != "mlstm" or mlp.kind != "glu" or any(b != blocks[0] for b in blocks):
            raise NotExpressible("xlstm is one mLSTM block with a GLU, repeated")
        d = spec.d_model
        return {"hidden_size": d, "embedding_dim": d, "num_hidden_layers": len(blocks), "num_blocks": len(blocks),
                "num_heads": mixer.heads, "qk_dim_factor": mixer.heads * mixer.d_qk / d,
                "v_dim_factor": mixer.heads * mixer.d_v / d, "gate_soft_cap": mixer.gate_softcap, "eps": mixer.eps,
                "norm_eps": spec.final_norm.eps, "ffn_proj_factor": mlp.hidden / d, "ffn_round_up_to_multiple_of": 1,
                "output_logit_soft_cap": spec.head.softcap, "weight_mode": "single", "use_bias": False,
                "max_position_embeddings": spec.max_len}

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "backbone.embeddings.weight", "backbone.out_norm.weight")
        for index in range(len(_blocks(spec))):
            theirs, ours = f"backbone.blocks.{index}.", _block_prefix(index)
            a, m = f"{theirs}mlstm_layer.", f"{ours}mixer."
            pairs = [("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("ogate_preact", "gate"),
                     ("out_proj", "out_proj"), ("igate_preact", "igate"), ("fgate_preact", "fgate")]
            links += [rename(f"{a}{t}.weight", f"{m}{o}.weight") for t, o in pairs]
            links += [rename(f"{a}{t}.bias", f"{m}{o}.bias") for t, o in pairs[-2:]]
            links += [rename(f"{a}multihead_norm.weight", f"{m}norm_weight"),
                      rename(f"{theirs}norm_mlstm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}norm_ffn.weight", f"{ours}norm2.weight")]
            # xLSTM's proj_down(silu(proj_up_gate x) * proj_up x) is attnspec's down(act(up x) * gate x)
            f = f"{theirs}ffn."
            links += [rename(f"{f}proj_up_gate.weight", f"{ours}mlp.up.weight"),
                      rename(f"{f}proj_up.weight", f"{ours}mlp.gate.weight"),
                      rename(f"{f}proj_down.weight", f"{ours}mlp.down.weight")]
        return links


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
        mlp = _glu(config, bias=config.get("mlp_bias", bool, False))
        blocks = [{"mixer": mixer, "mlp": mlp, "norm": _rmsnorm(eps)}] * layers
        common = _common(config)
        embedding = config.number("embedding_multiplier", 1.0)
        if embedding != 1.0:
            common["input"]["scale"] = embedding
        return {**common, "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": {**_head(config, False), "scale": config.number("lm_head_multiplier", 1.0)}}

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
        for index, block in enumerate(_blocks(spec)):
            m, a = f"{_block_prefix(index)}mixer.branches.0.", f"{_block_prefix(index)}mixer.branches.1."
            scales.update({f"{m}gate.weight": z * s_in, f"{m}v_proj.weight": x * s_in, f"{m}k_proj.weight": b * s_in,
                           f"{m}q_proj.weight": c * s_in, f"{m}transition.dt_proj.weight": dt * s_in,
                           f"{a}q_proj.weight": a_in, f"{a}k_proj.weight": a_in * key, f"{a}v_proj.weight": a_in,
                           f"{a}k_proj.bias": key})
            mlp = f"{_block_prefix(index)}mlp."  # transformers' gate_proj is attnspec's up
            scales.update({f"{mlp}up.weight": gate, f"{mlp}up.bias": gate, f"{mlp}down.weight": down,
                           f"{mlp}down.bias": down})
        return scales

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
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
                  "rope_parameters": _rope_parameters(attention.position),
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
        links = _lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
            mamba = block.mixer.branches[0]
            links += mamba2_links(mamba, f"{theirs}mamba.", f"{ours}mixer.branches.0.")
            if not mamba.group_norm:
                links = [link for link in links if link.theirs != f"{theirs}mamba.norm.weight"]
            if mamba.out_bias:
                links.append(rename(f"{theirs}mamba.out_proj.bias", f"{ours}mixer.branches.0.out_proj.bias"))
            attention = block.mixer.branches[1]
            links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.branches.1.", attention.qkv_bias)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight")]
            links += _mlp_links(f"{theirs}feed_forward.", f"{ours}mlp.", block.mlp.bias)
        return links


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
                   "block": {"mixer": attention, "mlp": mlp, "norm": _rmsnorm(eps), "residual": False}}
                  for b in range(memories)]
        mamba = mamba2_mixer(config, self.FIELDS, dt_limit=(config.number("time_step_min", 0.001), math.inf))
        blocks = [{"mixer": mamba, "mlp": "none", "norm": _rmsnorm(eps),
                   **({"shared": {"name": f"memory{hybrid.index(i) % memories}"}} if i in hybrid else {})}
                  for i in range(layers)]
        return {**_common(config), "shared": shared, "layers": compress_layers(blocks), "final_norm": _rmsnorm(eps),
                "head": _head(config, True)}

    def config(self, spec, model_type: str) -> dict:
        blocks = _blocks(spec)
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
                **({"rope_parameters": _rope_parameters(attention.position)} if rope else {}),
                **mamba2_config(mamba, spec.d_model, self.FIELDS), "time_step_min": mamba.transition.dt_min or 0.0,
                "tie_word_embeddings": spec.head.tied}

    def _canonical(self, spec) -> dict[str, int]:
        """Each shared block's name -> the layer whose ``shared_transformer`` holds its weights (its first use)."""
        found: dict[str, int] = {}
        for index, block in enumerate(_blocks(spec)):
            if block.shared is not None:
                found.setdefault(block.shared.name, index)
        return found

    def unused(self, name: str, spec) -> bool:
        """A later use's ``shared_transformer`` tensors: ties of the first use's (a checkpoint written with
        them repeats the same numbers)."""
        match = re.match(r"model\.layers\.(\d+)\.shared_transformer\.", name)
        return match is not None and int(match.group(1)) not in self._canonical(spec).values()

    def links(self, spec) -> list[Link]:
        links = _lm_links(spec, "model.embed_tokens.weight", "model.final_layernorm.weight")
        canonical = self._canonical(spec)
        for shared in spec.shared:
            theirs, ours = f"model.layers.{canonical[shared.name]}.shared_transformer.", f"shared_blocks.{shared.name}."
            links += _attention_links(f"{theirs}self_attn.", f"{ours}mixer.", False)
            links += [rename(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"),
                      rename(f"{theirs}pre_ff_layernorm.weight", f"{ours}norm2.weight"),
                      Link(f"{theirs}feed_forward.gate_up_proj.weight", (f"{ours}mlp.up.weight", f"{ours}mlp.gate.weight")),
                      rename(f"{theirs}feed_forward.down_proj.weight", f"{ours}mlp.down.weight")]
            if shared.block.mlp.bias:
                links += [Link(f"{theirs}feed_forward.gate_up_proj.bias", (f"{ours}mlp.up.bias", f"{ours}mlp.gate.bias")),
                          rename(f"{theirs}feed_forward.down_proj.bias", f"{ours}mlp.down.bias")]
        use = 0
        for index, block in enumerate(_blocks(spec)):
            theirs, ours = f"model.layers.{index}.", _block_prefix(index)
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


def _scales(mixer: float, mlp: float) -> float | dict:
    """A block's ``skip_scale`` or ``residual_scale``: one number where both sub-layers share it."""
    return mixer if mixer == mlp else {"mixer": mixer, "mlp": mlp}


class Qwen35(Qwen3Next):
    """Qwen3.5's text models: Qwen3-Next's layers with the Gated DeltaNet's projections unpacked (q, k, v
    in one matrix, the gate, beta and Δ each their own) and, for the MoE model, a sparse MoE block in
    every layer (top-k always renormalised). Their rotary embedding is multimodal (sections of t, h, w
    positions); for text every section reads the same position, which is plain (partial) RoPE."""

    model_types = ("qwen3_5_text", "qwen3_5_moe_text")
    causal_lm = {"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}

    def spec(self, config: Config, model_type: str) -> dict:
        fixed = {"num_experts": 0} if model_type == "qwen3_5_text" else {"decoder_sparse_step": 1,
                                                                          "norm_topk_prob": True}
        for field in fixed:
            if field in config.data:
                raise config.refuse(field, f"a {model_type} config has no {field} (transformers fixes it)")
        return super().spec(Config({**config.data, **fixed}, config.source), model_type)

    def config(self, spec, model_type: str) -> dict:
        config = super().config(spec, model_type)
        if model_type == "qwen3_5_text":
            if config["num_experts"]:
                raise NotExpressible("qwen3_5_text has no mixture of experts (qwen3_5_moe_text has)")
            return {k: v for k, v in config.items() if k not in ("num_experts", "mlp_only_layers")}
        if not config["num_experts"] or config["mlp_only_layers"] or not config["norm_topk_prob"]:
            raise NotExpressible("qwen3_5_moe_text has a renormalised mixture of experts in every layer")
        dropped = ("intermediate_size", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers")
        return {k: v for k, v in config.items() if k not in dropped}

    @staticmethod
    def _projection_links(mixer, theirs: str, ours: str) -> list[Link]:
        return [Link(f"{theirs}in_proj_qkv.weight", tuple(f"{ours}mixer.{n}.weight" for n in
                                                           ("q_proj", "k_proj", "v_proj"))),
                rename(f"{theirs}in_proj_z.weight", f"{ours}mixer.gate.weight"),
                rename(f"{theirs}in_proj_b.weight", f"{ours}mixer.beta_proj.weight"),
                rename(f"{theirs}in_proj_a.weight", f"{ours}mixer.transition.dt_proj.weight")]


ARCHITECTURES: dict[str, Architecture] = {}
for _architecture in (LlamaFamily(), Qwen3Next(), Qwen35(), Mamba2(), Bamba(), Mamba(), Jamba(), NemotronH(),
                      GraniteMoeHybrid(), Gemma3(), Lfm2(), DeepseekV3(), KimiLinear(), OlmoHybrid(), RecurrentGemma(),
                      MiniMax(), XLstm(), FalconH1(), Zamba2()):
    ARCHITECTURES.update(dict.fromkeys(_architecture.model_types, _architecture))
EXPORT_ORDER = ("mistral", "qwen3", "qwen2", "llama", "qwen3_next", "mamba2", "bamba", "qwen3_5_text",
                "qwen3_5_moe_text", "mamba", "falcon_mamba", "jamba", "nemotron_h", "granitemoehybrid", "gemma3_text",
                "lfm2", "deepseek_v3", "kimi_linear", "olmo_hybrid", "recurrent_gemma", "minimax",
                "xlstm", "falcon_h1", "zamba2")
"""The native types export-hf tries, most specific first: a Llama-family spec with a window is a
Mistral, with QK-norm a Qwen3, with q/k/v biases a Qwen2; otherwise a Llama."""
