"""Cross-field rules: combinations that are individually well-typed but cannot be computed.

Each rule yields ``(path, message)``; the message says what is wrong and how to fix the
spec. Every combination the IR can express is either computed by the compiler or
rejected: nothing silently falls back. The rules of a component live in its definition
(``problems()`` on the IR classes: a mixer checks its modes and parts, a feature map its own
fields); this module holds the model-level and block-level rules and walks the blocks.
"""

from __future__ import annotations

from typing import Any, Iterator

from attnspec.spec import limits
from attnspec.spec.ir import Block, Group, LmHead, Spec, TokenInput, iter_blocks
from attnspec.spec.walk import kv_sources
from attnspec.spec.source import Path

Violation = tuple[Path, str]

def check_rules(spec: Spec) -> list[Violation]:
    """All rule violations of a structurally valid spec, in document order."""
    found: list[Violation] = list(_model_rules(spec))
    found.extend(_shared_rules(spec))
    found.extend(_kv_sharing_rules(spec))
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


def _shared_rules(spec: Spec) -> Iterator[Violation]:
    """A shared block's own rules (its block's, at its input width), its name's, and the uses' names."""
    names = [shared.name for shared in spec.shared]
    used = {block.shared.name for _, block in iter_blocks(spec) if block.shared is not None}
    for i, shared in enumerate(spec.shared):
        at = ("shared", i)
        if names.index(shared.name) != i:
            yield at + ("name",), f"another shared block is named '{shared.name}' already; give each its own name"
        if shared.name not in used:
            yield at + ("name",), (f"no block calls the shared block '{shared.name}': name it in a block's `shared: "
                                   f"{{name: {shared.name}}}`, or remove it")
        block, width = shared.block, input_width(spec, shared)
        if block.shared is not None:
            yield at + ("block", "shared"), "a shared block cannot itself call a shared block"
        if block.mixer.is_identity and shared.reads != "hidden":
            yield at + ("reads",), (f"`reads: {shared.reads}` feeds the mixer's input, and this shared block has "
                                    "no mixer; read `hidden`, or give it a mixer")
        if width != spec.d_model and block.residuals()[0]:
            yield at + ("block", "residual"), (
                f"this shared block reads width {width} and its mixer writes d_model = {spec.d_model}, so there is "
                "no skip around the mixer to add: set `residual: {mixer: false}` (Zamba: `residual: false`)")
        if width != spec.d_model and block.norm_placement not in ("pre", "sandwich"):
            yield at + ("block", "norm_placement"), (
                f"a shared block reading width {width} normalises its input before the mixer (`pre` or `sandwich`); "
                f"`{block.norm_placement}` would normalise the mixer's output at the input's width")
        if width != spec.d_model and not block.mixer.projects_input:
            yield at + ("block", "mixer", "kind"), (
                f"a {block.mixer.kind} mixer reads inputs of width d_model only, and this shared block reads "
                f"{width} (`reads: {shared.reads}`); use a family that projects its input (softmax, linear, "
                "delta, mlstm, scatterbrain), or `reads: hidden`")
        twice = sorted({target for target in shared.adapt if shared.adapt.count(target) > 1})
        if twice:
            yield at + ("adapt",), (f"names {', '.join(f'`{t}`' for t in twice)} more than once; an adapter per "
                                    "projection, so list each once")
        if shared.adapter_rank is not None:
            for target in shared.adapt:
                if target != "mlp" and not block.mixer.projects_input:
                    yield at + ("adapt",), (f"a {block.mixer.kind} mixer has no `{target}` projection for an adapter;"
                                            " adapt `mlp` only, or use a family with q/k/v projections")
                if target == "mlp" and block.mlp.kind not in ("mlp", "glu"):
                    yield at + ("adapt",), (f"an `mlp` adapter needs a dense MLP (`mlp` or `glu`); this shared "
                                            f"block's is `{block.mlp.kind}`")
        yield from _block_rules(spec, block, at + ("block",), width)
    for path, block in iter_blocks(spec):
        if block.shared is None:
            continue
        if block.shared.name not in names:
            known = f": the spec's are {', '.join(names)}" if names else "; the spec has no `shared` blocks"
            yield path + ("shared", "name"), f"no shared block is named '{block.shared.name}'{known}"
        if block.mixer.is_identity:
            yield path + ("shared",), "a shared block's output is added to the mixer's input, and this block has no mixer"
        elif block.norm_placement != "pre":
            yield path + ("norm_placement",), ("a block calling a shared block adds its output before the mixer's "
                                               f"norm, which `pre` placement has; this block's is `{block.norm_placement}`")


def _kv_sharing_rules(spec: Spec) -> Iterator[Violation]:
    """Every attention that reads lent keys and values (`kv_from`) has a lender of that name before it, of its
    key/value heads, widths, causality and window, in every copy of its `repeat` groups; lending and borrowing
    are a block's own mixer's (not a shared block's, nor a parallel mixer's branch's)."""
    SHARING = ("lends_kv", "kv_from")
    for i, shared in enumerate(spec.shared):
        for name in SHARING:
            if getattr(shared.block.mixer, name, None) is not None:
                yield ("shared", i, "block", "mixer", name), (f"a shared block's attention cannot `{name}`: "
                                                              "each of its calls would read one another's")
    blocks = iter_blocks(spec, expand=True)
    seen: set[tuple] = set()  # a block in a `repeat` group is checked in every copy, reported once
    for (path, block), source in zip(blocks, kv_sources(spec)):
        mixer = block.mixer
        for below, sub in mixer.sub_mixers():
            for name in SHARING:
                if getattr(sub, name, None) is not None:
                    yield path + ("mixer",) + below + (name,), (f"a parallel mixer's branch cannot `{name}`: lend "
                                                                "or read keys and values in a block's own attention")
        name = getattr(mixer, "kv_from", None)
        if name is None or path in seen:
            continue
        at = path + ("mixer", "kv_from")
        if source is None:
            seen.add(path)
            yield at, (f"no earlier block lends keys and values as '{name}': set `lends_kv: {name}` on the "
                       "attention of a block before this one")
            continue
        lender = blocks[source][1].mixer
        for field in ("key_heads", "value_heads", "d_qk", "d_v", "causal", "window", "chunk"):
            mine, theirs = (_resolved(spec, one, field) for one in (mixer, lender))
            if mine != theirs and path not in seen:
                seen.add(path)
                what = {"key_heads": "kv_heads", "value_heads": "kv_heads"}.get(field, field)
                yield at, (f"the keys and values lent as '{name}' have {field} = {theirs}, and this "
                           f"attention's {field} is {mine}: set its `{what}` to the lender's")


def _resolved(spec: Spec, mixer, field: str) -> Any:
    """A mixer's ``field`` as the model builds it (``d_qk`` and ``d_v`` derived from d_model where unset)."""
    if field in ("d_qk", "d_v"):
        return (mixer.resolved_widths(spec.d_model) or {}).get(field, getattr(mixer, field))
    return getattr(mixer, field)


def input_width(spec: Spec, shared) -> int:
    """The width a shared block's mixer reads: d_model, or 2 d_model for [hidden, embeddings]."""
    return spec.d_model * (2 if shared.reads == "hidden_and_embeddings" else 1)


def _block_rules(spec: Spec, block: Block, path: Path, width: int | None = None) -> Iterator[Violation]:
    mixer = block.mixer
    at = path + ("mixer",)
    yield from _mixer_rules(spec, mixer, at, width or spec.d_model)
    if mixer.is_identity and block.mlp.is_identity:
        yield at, "a block with neither a mixer nor an MLP computes nothing: give it one, or remove the block"
    if block.parallel != "none":
        if mixer.is_identity or block.mlp.is_identity:
            yield path + ("parallel",), "a parallel block runs its mixer and its MLP side by side: it needs both"
        elif block.norm_placement != "pre" or block.residuals() != (True, True) or block.scales() != ((1.0, 1.0),) * 2:
            yield path + ("parallel",), ("a parallel block is x + mixer(norm(x)) + mlp(norm(x)): `pre` placement, "
                                         "both residuals and no skip or residual scales")
        elif block.shared is not None:
            yield path + ("parallel",), "a block calling a shared block runs its mixer and MLP one after the other"
    for below, message in block.mlp.problems():
        yield path + ("mlp",) + below, message


def _mixer_rules(spec: Spec, mixer, at: Path, width: int) -> Iterator[Violation]:
    """A mixer's rules at ``at``, reading inputs of ``width``, then those of the mixers it holds (a parallel
    mixer's branches)."""
    widths = mixer.resolved_widths(width)
    if widths is None:
        name = "d_model" if width == spec.d_model else "its input width"
        yield at + ("heads",), f"{name} = {width} is not divisible by heads = {mixer.heads}, {mixer.indivisible}"
    if not _is_power_of_two(mixer.chunk_size):
        yield at + ("chunk_size",), f"chunk_size must be a power of two (e.g. 64), got {mixer.chunk_size}"
    d_qk = (widths or {}).get("d_qk", mixer.d_qk)
    for below, message in mixer.problems(max_len=spec.max_len, d_qk=d_qk):
        yield at + below, message
    for below, sub in mixer.sub_mixers():
        yield from _mixer_rules(spec, sub, at + below, width)