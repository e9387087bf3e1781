"""The shared machinery of every architecture family: :class:`Architecture` (what a family states),
:class:`Link` (which transformers tensor holds which attnspec tensors, read both ways) and the spec
pieces and link rows many families share.

A family (one module of :mod:`attnspec.interop.families`) says, for each of its transformers model
types:

* :meth:`~Architecture.spec`: the spec data computing what transformers' modelling code computes for
  a ``config.json``, or an :class:`~attnspec.errors.InteropError` naming the field (and layers) it
  cannot express;
* :meth:`~Architecture.config`: the ``config.json`` of a spec, or :class:`NotExpressible`; the caller
  keeps it only if the config's own spec is the spec again (so "native" is decided by one round trip,
  not by a second list of conditions);
* :meth:`~Architecture.links`: the :class:`Link` rows of its weights.

The tests hold every family to transformers' own model, logit for logit (tests/hf/). Nothing here
imports torch at import time: the registry (and so the CLI's help) reads the families without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from attnspec.interop.config import Config

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def rope_config(position) -> dict:
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


@dataclass(frozen=True)
class Link:
    """One transformers tensor ``theirs`` made of attnspec tensors ``ours``.

    ``theirs`` = the rows of ``ours`` concatenated, interleaved by ``groups`` (group g of each of
    ``ours`` in turn: transformers' per-key-head packing), minus ``offset`` (Qwen3-Next's norms store
    weight - 1), exponentiated where ours is its ``log`` (a fixed transition's log-rate, MiniMax's
    slope), with a middle axis of 1 for a ``conv`` (conv1d's (channels, 1, width)), its rows in
    ``stack`` slices along a leading axis (fused experts: (experts, rows, columns)), or the whole viewed
    as ``view``; its last two axes ``transpose``-d (GPT-2's ``Conv1D`` stores (in, out), a linear map's
    transpose; Aria's fused experts (experts, in, out)); after ``lead`` rows that no attnspec tensor holds
    (OPT's position table starts at row 2: they are dropped on import and written as zeros on export,
    which nothing reads); with ``alternate``, the two halves of each slice's rows taken in turn, row by row
    (GPT-OSS's fused experts: gate and up projections alternate); with ``flat``, the ``stack`` slices (after their
    transpose) stored end to end as rows, (stack * rows, columns) (DBRX's w2: each expert's down projection
    transposed, one under another); with ``order``, ours' rows in len(order) equal blocks are theirs' blocks
    ``order[b]`` for b in turn (a head layout of transformers' own: DiffLlama's pairs of heads); with ``across``,
    ours are read transposed first, their columns the rows above (JetMoE's experts' output projections, side by side
    in attnspec's one output projection, one (d, width) slice each in transformers').
    """

    theirs: str
    ours: tuple[str, ...]
    groups: int = 1
    offset: float = 0.0
    conv: bool = False
    stack: int = 1
    view: tuple[int, ...] | None = None
    log: bool = False
    transpose: bool = False
    lead: int = 0
    alternate: bool = False
    flat: bool = False
    order: tuple[int, ...] | None = None
    across: bool = False

    @property
    def plain(self) -> bool:
        """One attnspec tensor that is the transformers tensor itself (a rename)."""
        return (len(self.ours) == 1 and self.groups == 1 and self.offset == 0.0 and not self.conv and self.stack == 1
                and self.view is None and not self.log and not self.transpose and not self.lead and not self.alternate
                and not self.flat and self.order is None and not self.across)

    def join(self, tensors: list[Tensor]) -> Tensor:
        """attnspec -> transformers."""
        import torch

        if self.plain:  # a rename (a scalar, such as xIELU's β, has no rows to chunk); a copy, as the others are
            return tensors[0].clone()
        if self.across:
            tensors = [t.transpose(0, 1) for t in tensors]
        parts = [t.chunk(self.groups) for t in tensors]
        joined = torch.cat([part for group in zip(*parts) for part in group]) - self.offset
        if self.log:
            joined = torch.exp(joined)
        if self.order is not None:  # our block b is their block order[b]
            inverse = sorted(range(len(self.order)), key=self.order.__getitem__)
            joined = joined.unflatten(0, (len(self.order), -1))[list(inverse)].flatten(0, 1)
        if self.view is not None:  # the same numbers in transformers' shape (Kimi's A_log (1, 1, H, 1))
            return joined.reshape(self.view)
        if self.stack > 1:
            joined = joined.reshape(self.stack, -1, *joined.shape[1:])
        if self.alternate:  # [a_0 .. a_n, b_0 .. b_n] -> [a_0, b_0, a_1, b_1 ..] within each slice
            axis = 1 if self.stack > 1 else 0
            joined = joined.unflatten(axis, (2, -1)).transpose(axis, axis + 1).flatten(axis, axis + 1)
        if self.transpose:
            joined = joined.transpose(-2, -1)
        elif self.conv:
            joined = joined.unsqueeze(1)
        if self.flat:
            joined = joined.reshape(-1, joined.shape[-1])
        if self.lead:  # rows of theirs that no attnspec tensor holds
            joined = torch.cat([joined.new_zeros(self.lead, *joined.shape[1:]), joined])
        return joined

    def split(self, tensor: Tensor, shapes: list[torch.Size]) -> list[Tensor]:
        """transformers -> attnspec, into tensors of ``shapes``."""
        import torch

        if self.across:  # the parts as ours transposed, then each turned back
            from dataclasses import replace

            flipped = [torch.Size((shape[1], shape[0], *shape[2:])) for shape in shapes]
            return [part.transpose(0, 1).contiguous() for part in replace(self, across=False).split(tensor, flipped)]

        tensor = tensor[self.lead:]
        if self.order is not None:
            tensor = tensor.unflatten(0, (len(self.order), -1))[list(self.order)].flatten(0, 1)
        if self.flat and self.stack > 1:
            tensor = tensor.reshape(self.stack, -1, tensor.shape[-1])
        if self.transpose:
            tensor = tensor.transpose(-2, -1)
        if self.view is not None:
            tensor = tensor.reshape(sum(shape[0] for shape in shapes), *shapes[0][1:])
        if self.alternate:
            axis = 1 if self.stack > 1 else 0
            tensor = tensor.unflatten(axis, (-1, 2)).transpose(axis, axis + 1).flatten(axis, axis + 1)
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


@dataclass(frozen=True)
class Wrapper:
    """A multimodal model type whose text model is one of a family's types: its config holds the text
    model's in ``text_config`` and its tensors carry other prefixes."""

    text_type: str
    """The text model's own model type (the one imported, and written back by export-hf)."""
    prefixes: dict[str, str]
    """The text model's own tensor-name prefix -> the one the multimodal release stores it under."""
    foreign: tuple[str, ...]
    """Prefixes of the release's tensors that are not the text model's (a vision tower): left unread."""
    unapplied: tuple[str, ...] = ()
    """Fields of the text config the multimodal model does not apply (Gemma 3's logit soft-cap is
    Gemma3ForCausalLM's alone)."""
    oracle: str | None = None
    """The transformers class import-hf's check holds the import to, where AutoModelForCausalLM's class for the
    type does not read a release's weights (Emu3ForCausalLM leaves every one of them unloaded)."""

    def stored_name(self, name: str) -> str:
        """A text model's tensor name as the release stores it."""
        own = next((prefix for prefix in self.prefixes if name.startswith(prefix)), None)
        return name if own is None else self.prefixes[own] + name[len(own):]


@dataclass(frozen=True)
class Copy:
    """A stored tensor attnspec's model holds as a function of another (:meth:`Architecture.copy_of`)."""

    source: str
    """The stored tensor it follows from."""
    compute: Callable[[Tensor], Tensor]
    """source tensor -> this tensor (as stored: its dtype)."""
    rtol: float = 0.0
    """0: it must equal what ``compute`` gives; else its relative tolerance (a table transformers computes
    in float32 in another order)."""
    what: str = "a copy"
    """What it is, for the error ("a copy of ..."; ``source`` follows it in parentheses)."""


@dataclass(frozen=True)
class Row:
    """One row of docs/huggingface.md's table of imported types: what these types import as, and what of them
    is refused (a located error, nothing written)."""

    types: tuple[str, ...]
    imported_as: str
    refused: str = ""


class Architecture:
    """A family of transformers model types (see the module docstring)."""

    model_types: tuple[str, ...] = ()
    causal_lm: dict[str, str] = {}
    """model type -> its causal-LM class, the config's ``architectures`` entry."""
    export_order: tuple[str, ...] | None = None
    """The order export-hf tries this family's types in, most specific first (default: ``model_types``)."""
    wrappers: dict[str, Wrapper] = {}
    """Multimodal model types whose text model is one of ``model_types``."""
    rows: tuple[Row, ...] = ()
    """The guide's rows for ``model_types`` and ``wrappers`` (each type in exactly one row; a test holds
    the guide's table to them)."""
    stored_names: dict[str, tuple[tuple[str, str], ...]] = {}
    """model type -> the renames, in order, from transformers' tensor names (the ones :meth:`links` gives)
    to the names its checkpoints store: ``(regex, replacement)`` pairs, transformers' ``WeightRenaming``
    of the type read backwards (transformers renames a checkpoint's names on load and back on save)."""
    config_fields: dict[str, dict[str, str]] = {}
    """model type -> a released config's own field names -> transformers' (its config class's
    ``attribute_map``): a config.json written with the released names reads as transformers reads it."""

    def read(self, data: dict, model_type: str, source: str) -> Config:
        """``data`` (a config.json's fields) to read as ``model_type``: its released field names
        (:attr:`config_fields`) also under transformers' names where those are absent."""
        for released, field in self.config_fields.get(model_type, {}).items():
            if released in data and field not in data:
                data = {**data, field: data[released]}
        return Config(data, source)

    def stored_links(self, spec, model_type: str) -> list[Link]:
        """:meth:`links` with each transformers tensor named as ``model_type``'s checkpoints store it."""
        import re
        from dataclasses import replace

        renames = self.stored_names.get(model_type, ())
        links = self.links(spec)
        for pattern, replacement in renames:
            links = [replace(link, theirs=re.sub(pattern, replacement, link.theirs)) for link in links]
        return links

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

    def copy_of(self, name: str, spec, config: dict) -> Copy | None:
        """How a checkpoint tensor no link reads follows from another stored one in attnspec's model (a later
        use of a shared block's weights; a table computed from a linked tensor), or None. transformers
        reads such a tensor as stored, so the import compares it with what attnspec's model computes
        and refuses a difference (:func:`attnspec.interop.convert.converted_tensors`). ``config``: the
        checkpoint's config.json."""
        return None

    def derived_tensors(self, spec, tensors: dict[str, Tensor], config: dict) -> dict[str, Tensor]:
        """Tensors a checkpoint of this type stores that are computed from others (the ones :meth:`copy_of`
        finds on import), for export: ``tensors`` are the linked ones, ``config`` the config written beside
        them. Empty for most types."""
        return {}

    def weight_scales(self, spec, config: Config) -> dict[str, float]:
        """attnspec tensor -> the constant its checkpoint tensor is multiplied by in transformers' forward
        (μP multipliers inside a layer, folded into the weight they multiply on import; the exported
        config then states 1 for each). Empty for most types."""
        return {}


def common_fields(config: Config) -> dict:
    """Fields every causal LM here shares: vocabulary, width, max_len, dtype (the checkpoint's own, as its
    config states it: a bfloat16 release stays bfloat16; float32 where it names none attnspec holds)."""
    dtype = config.get("dtype", str, None) or config.get("torch_dtype", str, "float32")
    return {"input": {"kind": "tokens", "vocab_size": config.count("vocab_size")},
            "d_model": config.count("hidden_size"),
            "max_len": config.count("max_position_embeddings", 2048),
            "dtype": dtype if dtype in ("float64", "bfloat16", "float16") else "float32"}


NEVER_TIED_TYPES = frozenset({"kimi_linear", "nemotron_h", "xlstm"})
"""The imported types whose transformers class never ties its head to the embedding (it declares no
``_tied_weights_keys``; ``tests/hf/test_read_as_the_class_reads.py`` holds this set to transformers): their
stored ``lm_head.weight`` is the head, whatever ``tie_word_embeddings`` says."""


def head_node(config: Config, default_tied: bool) -> dict:
    """transformers' LM heads multiply by nothing, tied or not (tied as the config says where the type's class
    ties: :data:`NEVER_TIED_TYPES` never do)."""
    tied = config.get("tie_word_embeddings", bool, default_tied)
    return {"kind": "lm", "tied": tied and config.data.get("model_type") not in NEVER_TIED_TYPES, "scale": 1.0}


def glu_node(config: Config, hidden_field: str = "intermediate_size", bias: bool = False) -> dict:
    return {"kind": "glu", "hidden": config.count(hidden_field), "activation": config.activation(),
            "bias": bias}


def softmax_experts(config: Config, experts: int, hidden: int, top_k: int, normalize: bool,
                    activation: str | None = None) -> dict:
    """A sparse MoE block routed by a softmax over ``experts`` (``num_experts_per_tok`` of them, ``top_k``
    where the config has none, renormalised with ``normalize``) of GLU experts ``hidden`` wide, of
    ``activation`` (default: the config's ``hidden_act``, SiLU)."""
    chosen = config.count("num_experts_per_tok", top_k)
    if chosen > experts:
        raise config.refuse("num_experts_per_tok", f"{chosen} experts per token of {experts}")
    return {"kind": "moe", "experts": experts, "top_k": chosen, "hidden": hidden, "scoring": "softmax",
            "activation": activation or config.activation(allowed=("silu",)), "normalize": normalize}


def expert_counts(config: Config, field: str, default: int | None, top_k_field: str, top_k: int) -> tuple[int, int]:
    """(experts, experts per token) of a mixture-of-experts config: ``field`` (at most ``MAX_EXPERTS``) and
    ``top_k_field`` (at most the experts), each refused by name otherwise."""
    from attnspec.spec import limits

    experts = config.count(field, default, limit=limits.MAX_EXPERTS)
    chosen = config.count(top_k_field, top_k)
    if chosen > experts:
        raise config.refuse(top_k_field, f"{chosen} experts per token of {experts}")
    return experts, chosen


def shared_count(config: Config, field: str, default: int) -> int:
    """How many shared experts a config states in ``field`` (0 to ``MAX_EXPERTS``, refused by name otherwise)."""
    from attnspec.spec import limits

    shared = config.get(field, int, default)
    if not 0 <= shared <= limits.MAX_EXPERTS:
        raise config.refuse(field, f"must be from 0 to {limits.MAX_EXPERTS}")
    return shared


def rmsnorm_node(eps: float) -> dict:
    return {"kind": "rmsnorm", "eps": eps}


def block_prefix(index: int) -> str:
    return f"blocks.{index}."


def lm_links(spec, embed: str, final_norm: str, offset: float = 0.0) -> list[Link]:
    links = [rename(embed, "embed.weight"), rename(final_norm, "final_norm.weight", offset)]
    if not spec.head.tied:
        links.append(rename("lm_head.weight", "head.weight"))
    return links


def glu_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """transformers' down(act(gate_proj x) * up_proj x) is attnspec's down(act(up x) * gate x)."""
    links = []
    for their_name, our_name in (("gate_proj", "up"), ("up_proj", "gate"), ("down_proj", "down")):
        links.append(rename(f"{theirs}{their_name}.weight", f"{ours}{our_name}.weight"))
        if bias:
            links.append(rename(f"{theirs}{their_name}.bias", f"{ours}{our_name}.bias"))
    return links


def mlp_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """transformers' down(act(up_proj x)) is attnspec's ``mlp`` kind, down(act(up x))."""
    names = ["up", "down"]
    return [rename(f"{theirs}{n}_proj.{p}", f"{ours}{n}.{p}") for n in names for p in ("weight", "bias")[:1 + bias]]


def w123_links(theirs: str, ours: str, bias: bool) -> list[Link]:
    """Mixtral's expert names: w2(act(w1 x) * w3 x) is attnspec's down(act(up x) * gate x)."""
    pairs = (("w1", "up"), ("w3", "gate"), ("w2", "down"))
    return [rename(f"{theirs}{t}.weight", f"{ours}{o}.weight") for t, o in pairs]


def moe_links(moe, theirs: str, ours: str, shared: str = "shared_expert", router: str = "gate",
               expert_links=None) -> list[Link]:
    """A sparse MoE block as released checkpoints store it: the ``router`` (and its score correction
    bias), one MLP per expert (``experts.{e}.gate_proj`` ...; no gate_proj for plain experts; Mixtral's
    w1/w2/w3 with ``expert_links``), the shared expert and its gate."""
    plain = glu_links if moe.gated else mlp_links
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


def attention_links(theirs: str, ours: str, bias: bool, out_bias: bool | None = None) -> list[Link]:
    """Softmax attention's q, k, v and o projections (``o_proj`` is attnspec's ``out_proj``); ``bias``: the
    q/k/v biases, ``out_bias`` the output's (default: as ``bias``)."""
    links = [rename(f"{theirs}{n}_proj.weight", f"{ours}{n}_proj.weight") for n in "qkv"]
    links.append(rename(f"{theirs}o_proj.weight", f"{ours}out_proj.weight"))
    if bias:
        links += [rename(f"{theirs}{n}_proj.bias", f"{ours}{n}_proj.bias") for n in "qkv"]
    if bias if out_bias is None else out_bias:
        links.append(rename(f"{theirs}o_proj.bias", f"{ours}out_proj.bias"))
    return links


def expanded_blocks(spec) -> list:
    from attnspec.spec.walk import iter_blocks

    return [block for _, block in iter_blocks(spec, expand=True)]
