"""What a spec's model holds, counted on PyTorch's meta device before anything is allocated: its
parameters and one sequence's decoding state, against attnspec's limits. Imports no spec front-end,
so loading a build directory can check them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnspec.errors import BuildError, ShapeError
from attnspec.nn.model import Model, meta_values_skipped
from attnspec.spec import limits
from attnspec.spec.ir import Spec


def count_parameters(spec: Spec) -> int:
    """The number of trainable parameters of the model of ``spec``, from the lowered model built on
    the meta device: no memory is allocated, so the count is safe before the limit check
    (an 89-billion-parameter spec is counted in under a second), and no formula can drift from
    what the modules really hold (tests keep a hand-written formula as an oracle)."""
    with torch.device("meta"), meta_values_skipped():
        model = Model(spec)
    return sum(parameter.numel() for parameter in model.parameters())


@dataclass(frozen=True)
class LayerSize:
    """What one expanded block holds: its trainable ``parameters``, those one token uses
    (``active_parameters``: a mixture of experts uses top_k of its routed experts), and the bytes of one
    sequence's decoding state at capacity (``decode_state_bytes``: a recurrent state, or a key/value
    cache of ``max_len`` or the window; 0 without a decoding step)."""

    parameters: int
    active_parameters: int
    decode_state_bytes: int


def layer_sizes(spec: Spec) -> list[LayerSize]:
    """One :class:`LayerSize` per block of ``spec`` in execution order (``blocks[i]``), counted on the
    meta device like :func:`count_parameters`; the embedding, final norm, head and shared blocks are not in
    any (a block calling a shared block holds its call's projection and adapters, and its cache)."""
    with torch.device("meta"), meta_values_skipped():
        model = Model(spec)
    dtype, meta = model.embed.weight.dtype, torch.device("meta")
    shared = {id(parameter) for parameter in model.shared_blocks.parameters()}  # counted with the model, not a block
    sizes = []
    for block in model.blocks:
        state = block.init_state(1, dtype, meta) if block.has_step else ()  # a shared block's cache at this call too
        total = sum(parameter.numel() for parameter in block.parameters() if id(parameter) not in shared)
        mlp = block.mlp
        idle = sum(p.numel() for p in mlp.parameters()) - mlp.active_parameters() if mlp is not None else 0
        sizes.append(LayerSize(total, total - idle, sum(math.prod(t.shape) * t.element_size() for t in state)))
    return sizes


def check_model_size(spec: Spec) -> int:
    """The parameter count of ``spec``'s model, after checking it and one sequence's decoding state
    against attnspec's limits on the meta device (nothing allocated).

    Raises:
        BuildError: over ``MAX_PARAMETERS`` or ``MAX_DECODE_STATE_BYTES``, saying what to make smaller.
    """
    with torch.device("meta"), meta_values_skipped():
        model = Model(spec)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    if parameters > limits.MAX_PARAMETERS:
        raise BuildError(f"the spec implies {parameters:,} parameters, over the limit of {limits.MAX_PARAMETERS:,}; "
                         "make the model smaller")
    try:
        model.check_decode_state(1)
    except ShapeError as error:
        raise BuildError(str(error)) from None
    return parameters


__all__ = ["LayerSize", "check_model_size", "count_parameters", "layer_sizes"]
