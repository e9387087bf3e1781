"""Data-parallel training on an existing engine: ``torchrun`` + DistributedDataParallel.

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) :func:`setup` joins the process group
(gloo on the CPU, NCCL on CUDA, each rank on its ``LOCAL_RANK`` GPU) and :meth:`Distributed.wrap`
wraps the model in DDP. Alone it is a no-op with rank 0 of 1. The trainer slices each global batch
by rank (:mod:`attnspec.training.loop`), so the data never overlap and the global batch is preserved.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Distributed:
    rank: int
    world_size: int
    device: torch.device

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def wrap(self, model: nn.Module) -> nn.Module:
        if not self.active:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def no_sync(self, wrapped: nn.Module, last: bool):
        """Skip the gradient all-reduce on every micro-batch but the last of a step."""
        if self.active and not last:
            return wrapped.no_sync()
        return contextlib.nullcontext()

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.active:
            value = value.clone()
            dist.all_reduce(value)
        return value

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def setup(device: str = "auto") -> Distributed:
    """Join torchrun's process group when there is one; choose the device (``auto``: CUDA if present)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        from attnspec.errors import AttnSpecError

        raise AttnSpecError("device: cuda was asked for, but this PyTorch sees no CUDA device; use --device cpu")
    chosen = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(chosen)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Distributed(rank, world, chosen)
