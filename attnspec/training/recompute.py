"""Activation checkpointing per block: a chosen block keeps only its input in the forward pass and
runs its forward again in the backward pass (``torch.utils.checkpoint``, non-reentrant), trading one
more forward of it for its activations' memory. The recomputation draws the same random numbers
(checkpoint restores the RNG state), so losses and gradients are those of the plain model.
"""

from __future__ import annotations

from torch import nn


def blocks_to_recompute(setting: str | int, blocks: int) -> list[int]:
    """The block indices a training configuration's ``activation_checkpointing`` names: ``"none"`` none,
    ``"blocks"`` every block, N every N-th (0, N, 2N, ... as torchtitan's selective layer option)."""
    if setting == "none":
        return []
    every = 1 if setting == "blocks" else int(setting)
    return list(range(0, blocks, every))


def recompute_blocks(model: nn.Module, indices: list[int]) -> None:
    """Make ``model.blocks[i]`` for each ``i`` recompute its activations in the backward pass, in place.

    The block's ``forward`` is wrapped (its instance attribute), not the block: parameter names, the
    state dict and hooks on the block (FSDP's gathers) stay as they are, and the recomputation calls
    the block's own forward inside the hooks' gather.
    """
    from torch.utils.checkpoint import checkpoint

    for index in indices:
        block = model.blocks[index]
        forward = block.forward

        def recomputed(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed
