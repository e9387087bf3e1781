"""Reading a transformers ``config.json``: typed, located access to its fields.

Every architecture family (:mod:`attnspec.interop.families`) reads its config through :class:`Config`,
so a bad value is refused the same way everywhere: an :class:`~attnspec.errors.InteropError` naming the
file, the field and (where it applies) the layers. Nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import Any

from attnspec.errors import InteropError, shorten

_MISSING = object()
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
MAX_COUNT = 1 << 40
"""Any count a config states (sizes, heads, ...) before the spec's own limits check it further."""
ROTARY_FRACTION_TYPES = frozenset({
    "bamba", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "gpt_neox", "gpt_neox_japanese", "laguna", "mellum",
    "mimo_v2_flash", "minimax_m2", "nemotron", "persimmon", "phi", "phi3", "qwen3_5_moe_text", "qwen3_5_text",
    "qwen3_next", "recurrent_gemma", "sarvam_moe", "solar_open", "stablelm"})
"""The imported types whose transformers class rotates only ``partial_rotary_factor`` of each head (their
modelling code reads it: ``tests/hf/test_read_as_the_class_reads.py`` holds this set to transformers'
source). Every other class rotates the whole head with its default RoPE, whatever the config says, and
cannot run a scaled RoPE with a partial factor (its inverse frequencies no longer fit the head): there the
factor is ignored as the class ignores it, or refused."""


class NotExpressible(Exception):
    """A spec that this architecture's config cannot state (the reason is the message)."""


class Config:
    """A ``config.json`` being read: typed, located access to its fields."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def refuse(self, field: str, message: str, layers: list[int] | None = None) -> InteropError:
        where = f" (layers {ranges(layers)})" if layers else ""
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

    def number(self, field: str, default: Any = _MISSING, *, positive: bool = False,
               at_most: float | None = None) -> float:
        """A finite real field (an integer of 400 digits is no float); ``default`` (None too) where absent.
        ``positive``: it must also be above 0 (a field attnspec divides by, or takes a root of); ``at_most``:
        no larger (a factor a width is multiplied by, before the product becomes an integer)."""
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
        if at_most is not None and number > at_most:
            raise self.refuse(field, f"must be at most {at_most:g}, got {shorten(value)}")
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

    def attention_layer_types(self, layers: int, default: list[str]) -> list[str]:
        """``layer_types`` (``default`` where absent) of a model whose layers are all attention: each
        ``full_attention`` or ``sliding_attention``, refused by layer otherwise."""
        types = self.layer_types(layers, default)
        unknown = [i for i, t in enumerate(types) if t not in ATTENTION_LAYER_TYPES]
        if unknown:
            raise self.refuse("layer_types", f"{types[unknown[0]]!r}: each layer is full_attention or "
                              "sliding_attention", unknown)
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
        if not all(is_positive(v) for v in (theta, fraction)):
            raise self.refuse(field, "rope_theta and partial_rotary_factor must be positive numbers")
        model_type = self.data.get("model_type")
        if model_type not in ROTARY_FRACTION_TYPES and fraction != 1.0:
            if kind != "default":
                raise self.refuse(f"{field}.partial_rotary_factor", f"transformers' {model_type} rotates "
                                  f"the whole head; its {kind} RoPE with a partial factor cannot run there")
            fraction = 1.0  # the class's default RoPE never reads it: the whole head turns
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
        if kind == "yarn" and parameters.get("factor") is None and is_positive(trained):  # the implied stretch
            parameters = {**parameters, "factor": self.count("max_position_embeddings") / trained}
        for theirs, ours in wanted.items():
            value = parameters.get(theirs)
            if value is None:
                continue
            if not is_positive(value):
                raise self.refuse(f"{field}.{theirs}", f"must be a positive number, got {shorten(value)}")
            node[ours] = int(value) if ours == "original_max_len" else float(value)
        if kind == "yarn":
            node["truncate"] = bool(parameters.get("truncate", True))
            mscale, mscale_all = parameters.get("mscale"), parameters.get("mscale_all_dim")
            if "attention_factor" not in node and mscale and mscale_all:  # DeepSeek's ratio of two mscales
                factor = node["factor"]
                node["attention_factor"] = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        return node

    def attention_heads(self, head_dim_field: str | None = "head_dim",
                        head_dim: int | None = None) -> tuple[int, int, int]:
        """(heads, key/value heads, head width) of the config's attention: ``num_attention_heads``,
        ``num_key_value_heads`` (default: heads) and ``head_dim_field`` (where the config states none, ``head_dim``:
        its config class's default whatever the width, as AFMoE's and Cohere 2 MoE's 128; without either,
        hidden_size / heads), refused by field where the heads do not divide the width or share the key/value
        heads equally."""
        heads = self.count("num_attention_heads")
        kv_heads = self.count("num_key_value_heads", heads)
        width = self.count(head_dim_field, head_dim) if head_dim_field else None
        d_model = self.count("hidden_size")
        if width is None and d_model % heads:
            raise self.refuse("num_attention_heads", f"{heads} heads do not divide hidden_size {d_model}")
        if heads % kv_heads:
            raise self.refuse("num_key_value_heads", f"{heads} heads cannot share {kv_heads} key/value heads equally")
        return heads, kv_heads, width or d_model // heads

    def activation(self, field: str = "hidden_act",
                   allowed: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "relu2", "gelu_10", "mish",
                                               "relu6", "tanh"),
                   default: str = "silu") -> str:
        """The activation ``field`` names (``default`` where absent), as attnspec's name, if one of ``allowed``."""
        value = self.get(field, str, default)
        name = HF_ACTIVATIONS.get(value, value)
        if name not in allowed:
            raise self.refuse(field, f"activation {value!r} has no attnspec equivalent; attnspec has "
                              f"{', '.join(allowed)} here")
        return name


def is_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def yarn_mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts, start = [], None
    for index, n in enumerate(numbers):
        if start is None:
            start = n
        if index + 1 == len(numbers) or numbers[index + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


HF_ACTIVATIONS = {"swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "gelu_accurate": "gelu_tanh", "gelu_python_tanh": "gelu_tanh",
                  "gelu_python": "gelu"}
"""transformers' activation names that are attnspec's under another name (``gelu_new``, ``gelu_fast``,
``gelu_accurate`` and ``gelu_python_tanh`` are the tanh approximation written out, equal to it within float32
rounding; ``gelu_python`` is the exact GELU through erf)."""
ACTIVATION_NAMES = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu",
                    "relu": "relu", "relu2": "relu2", "xielu": "xielu", "gelu_10": "gelu_10", "mish": "mish",
                    "relu6": "relu6", "tanh": "tanh"}
"""attnspec's activation -> the name transformers' configs write."""
