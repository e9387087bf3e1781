"""Cross-field rules: combinations that are individually well-typed but cannot be computed.

Each rule yields ``(path, message)``; the message says what is wrong and how to fix the
spec. Every combination the IR can express is either computed by the compiler or
rejected: nothing silently falls back. The rules of a component live in its definition
(``problems()`` on the IR classes: a mixer checks its modes and parts, a feature map its own
fields); this module holds the model-level and block-level rules and walks the blocks.
"""

from __future__ import annotations

from typing import Iterator

from attnspec.spec import limits
from attnspec.spec.ir import Block, Group, LmHead, Spec, TokenInput, iter_blocks
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
    yield from _mixer_rules(spec, mixer, at)
    if mixer.is_identity and block.mlp.is_identity:
        yield at, "a block with neither a mixer nor an MLP computes nothing: give it one, or remove the block"
    for below, message in block.mlp.problems():
        yield path + ("mlp",) + below, message


def _mixer_rules(spec: Spec, mixer, at: Path) -> Iterator[Violation]:
    """A mixer's rules at ``at``, then those of the mixers it holds (a parallel mixer's branches)."""
    widths = mixer.resolved_widths(spec.d_model)
    if widths is None:
        yield at + ("heads",), (f"d_model = {spec.d_model} is not divisible by heads = {mixer.heads}, so d_qk/d_v "
                               "cannot be derived; choose heads dividing d_model or set d_qk and d_v")
    if not _is_power_of_two(mixer.chunk_size):
        yield at + ("chunk_size",), f"chunk_size must be a power of two (e.g. 64), got {mixer.chunk_size}"
    d_qk = (widths or {}).get("d_qk", mixer.d_qk)
    for below, message in mixer.problems(max_len=spec.max_len, d_qk=d_qk):
        yield at + below, message
    for below, sub in mixer.sub_mixers():
        yield from _mixer_rules(spec, sub, at + below)