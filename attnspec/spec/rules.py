"""Cross-field rules: combinations that are individually well-typed but cannot be computed.

Each rule yields ``(path, message)``; the message says what is wrong and how to fix the
spec. Every combination the IR can express is either computed by the compiler or
rejected here: nothing silently falls back.
"""

from __future__ import annotations

from typing import Any, Iterator

from attnspec.spec import limits
from attnspec.spec.components import SLOTS
from attnspec.spec.ir import (
    Block,
    Group,
    LinearLowRank,
    LinearMixer,
    LmHead,
    PerformerLowRank,
    ScatterbrainMixer,
    SoftmaxMixer,
    Spec,
    TokenInput,
    iter_blocks,
)
from attnspec.spec.source import Path

Violation = tuple[Path, str]



def check_rules(spec: Spec) -> list[Violation]:
    """All rule violations of a structurally valid spec, in document order."""
    found: list[Violation] = list(_model_rules(spec))
    for path, block in iter_blocks(spec):
        found.extend(_block_rules(spec, block, path))
    return found


def expanded_block_count(layers: list) -> int:
    """Blocks after every ``repeat`` is expanded, computed without expanding anything."""
    return sum(item.repeat * expanded_block_count(item.layers) if isinstance(item, Group) else 1 for item in layers)


def _model_rules(spec: Spec) -> Iterator[Violation]:
    blocks = expanded_block_count(spec.layers)
    if blocks > limits.MAX_BLOCKS:
        yield ("layers",), (f"the layers expand to {blocks:,} blocks; a model has at most {limits.MAX_BLOCKS} "
                            "(attnspec's limit): lower a `repeat`")
    if isinstance(spec.head, LmHead) and not isinstance(spec.input, TokenInput):
        yield ("head",), ("an `lm` head predicts tokens, but the input is real-valued features; "
                          "use `head: {kind: classifier, classes: N}` or `head: none`, or token input")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _block_rules(spec: Spec, block: Block, path: Path) -> Iterator[Violation]:
    mixer = block.mixer
    at = path + ("mixer",)
    if (mixer.d_qk is None or mixer.d_v is None) and spec.d_model % mixer.heads:
        yield at + ("heads",), (f"d_model = {spec.d_model} is not divisible by heads = {mixer.heads}, so d_qk/d_v "
                               "cannot be derived; choose heads dividing d_model or set d_qk and d_v")
    if not _is_power_of_two(mixer.chunk_size):
        yield at + ("chunk_size",), f"chunk_size must be a power of two (e.g. 64), got {mixer.chunk_size}"
    transition = getattr(mixer, "transition", None)
    if transition is not None and not transition.is_identity and not mixer.causal:
        yield at + ("transition",), ("a state transition orders positions, so it needs `causal: true`; "
                                     "remove the transition or make the mixer causal")
    d_qk = mixer.d_qk or (spec.d_model // mixer.heads if spec.d_model % mixer.heads == 0 else None)
    if mixer.mode != "auto" and mixer.mode not in mixer.modes():
        yield at + ("mode",), mixer.mode_problem(mixer.mode)
    if isinstance(mixer, LinearMixer):
        yield from _linear_rules(spec, mixer, at, d_qk)
    elif isinstance(mixer, SoftmaxMixer):
        yield from _softmax_decay_rules(transition, at)
    elif isinstance(mixer, ScatterbrainMixer):
        yield from _scatterbrain_rules(spec, mixer, at)


def _softmax_decay_rules(transition: Any, at: Path) -> Iterator[Violation]:
    if transition.is_complex:
        yield at + ("transition",), _COMPLEX_SOFTMAX
    elif transition.per_channel:
        yield at + ("transition", "per"), ("under softmax a decay is one additive bias per pair of positions, so it "
                                           "must be per head; set `per: head`")


_COMPLEX_SOFTMAX = ("softmax scores must be real, but this transition is complex; use a real decay "
                    "(`complex: false` for fixed, `phase: none` for data-controlled)")


def _positive_feature_kinds() -> str:
    return ", ".join(sorted(kind for kind, cls in SLOTS["feature_map"].items() if cls.non_negative and cls.finite))


def _linear_rules(spec: Spec, mixer: LinearMixer, at: Path, d_qk: int | None) -> Iterator[Violation]:
    fmap = mixer.feature_map
    if mixer.normalize and not fmap.non_negative:
        yield at + ("feature_map",), (
            f"normalised linear attention divides by q~.z, which needs a non-negative feature map, but "
            f"'{fmap.kind}' features are signed; use one of {_positive_feature_kinds()} "
            "or set `normalize: false` (as GateLoop does)")
    if not fmap.finite:
        yield from _softmax_decay_rules(mixer.transition, at)
        if not mixer.normalize:
            yield at + ("normalize",), ("exp features are the softmax kernel and are computed as softmax attention, "
                                        "which is normalised; set `normalize: true` (or use performer features)")
        if mixer.reweighting.width_factor != 1:
            yield at + ("reweighting",), (f"{mixer.reweighting.kind} re-weighting needs finite features; with "
                                          "exp features use `reweighting: none`, or relu/performer features")
    for below, message in fmap.problems(d_qk):
        yield at + ("feature_map", *below), message
    for below, message in mixer.reweighting.problems(causal=mixer.causal, max_len=spec.max_len):
        yield at + ("reweighting", *below), message


def sparse_lowrank_sizes(spec: Spec, mixer: ScatterbrainMixer) -> dict[str, int]:
    """Sizes a Scatterbrain budget implies: ``{"sparse": keys per query, "lowrank": features}``."""
    assert mixer.budget is not None
    total = mixer.budget * spec.max_len
    s, r = mixer.ratio
    return {"sparse": max(1, round(total * s / (s + r))), "lowrank": max(1, round(total * r / (s + r)))}


def _scatterbrain_rules(spec: Spec, mixer: ScatterbrainMixer, at: Path) -> Iterator[Violation]:
    lowrank, sparse = mixer.lowrank, mixer.sparse
    if isinstance(lowrank, LinearLowRank):
        for below, message in lowrank.feature_map.problems(None):
            yield at + ("lowrank", "feature_map", *below), message
        if not (lowrank.feature_map.non_negative and lowrank.feature_map.finite):
            yield at + ("lowrank", "feature_map"), ("the low-rank part needs a finite non-negative feature map "
                                                    "(the joint normaliser must stay positive); use elu1, relu, "
                                                    "softplus or performer")
    for below, message in sparse.problems():
        yield at + ("sparse", *below), message
    if mixer.budget is not None:
        sizes = sparse_lowrank_sizes(spec, mixer)
        if isinstance(lowrank, PerformerLowRank) and lowrank.num_features not in (None, sizes["lowrank"]):
            yield at + ("lowrank", "num_features"), (
                f"budget {mixer.budget} with ratio {mixer.ratio[0]}:{mixer.ratio[1]} gives {sizes['lowrank']} "
                f"features, not {lowrank.num_features}; remove num_features or the budget")
        field = sparse.size_field
        value, expected = getattr(sparse, field), sparse.size_for_budget(sizes["sparse"])
        if value is not None and value != expected:
            yield at + ("sparse", field), (
                f"budget {mixer.budget} with ratio {mixer.ratio[0]}:{mixer.ratio[1]} gives {field} = {expected}, "
                f"not {value}; remove {field} or the budget")

