"""Distributed training on existing engines: ``torchrun`` + DistributedDataParallel or FSDP2.

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) :func:`setup` joins the process group
(gloo on the CPU, NCCL on CUDA, each rank on its ``LOCAL_RANK`` GPU) and :meth:`Distributed.wrap`
wraps the model: in DDP (``parallel: ddp``), or shards it with FSDP2's ``fully_shard`` (``parallel:
fsdp``; :func:`shard` says how). Alone it is a no-op with rank 0 of 1. The trainer slices each
global batch by rank (:mod:`attnspec.training.loop`), so the data never overlap and the global
batch is preserved. A sharded run checkpoints each process's shard (:func:`save_shards`, with
torch.distributed.checkpoint) and resumes from shards written by any number of processes
(:func:`load_shards`); :func:`load_full_state` loads whole tensors (a one-process checkpoint's) into it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Distributed:
    rank: int
    world_size: int
    device: torch.device
    parallel: str = "ddp"

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """The model's parameters are sharded over the processes (FSDP2): its state is gathered to save it."""
        return self.active and self.parallel == "fsdp"

    def wrap(self, model: nn.Module, bfloat16: bool = False) -> nn.Module:
        """The module the training step runs: ``model`` itself alone or sharded (:func:`shard`, in place), a
        DistributedDataParallel around it otherwise. ``bfloat16``: FSDP gathers the weights in bfloat16."""
        if not self.active:
            return model
        if self.sharded:
            shard(model, bfloat16)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def no_sync(self, wrapped: nn.Module, last: bool):
        """Skip the gradient reduction on every micro-batch but the last of a step (DDP decides it in the
        forward, under its context; FSDP2 in the backward, by a flag set here until the next call)."""
        if self.sharded:
            wrapped.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if self.active and not last:
            return wrapped.no_sync()
        return contextlib.nullcontext()

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.active:
            value = value.clone()
            dist.all_reduce(value)
        return value

    def all_agree(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every process (each must call it): a step rank 0 alone takes (making a
        checkpoint's folder) fails on every process rather than leaving the others waiting."""
        return _everywhere(ok) if self.active else ok

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def shard(model: nn.Module, bfloat16: bool) -> None:
    """Shard ``model`` (an :class:`attnspec.nn.model.Model`) in place with FSDP2, one group per block.

    Groups: each block whose parameters are its own, then the root (embeddings, final norm, head, the
    shared blocks and the blocks that call them: a shared block's tensors are held by every use's view,
    and a tensor must be in one group). A group's weights are all-gathered for its forward, freed after
    it, gathered again for its backward, and its gradients reduce-scattered: each process holds 1/N of
    the parameters, gradients and AdamW moments outside the block it runs. Mixture-of-experts experts
    are their block's tensors: every process runs every expert, on its own tokens.

    ``bfloat16`` (the run computes in bfloat16 under autocast): a group's weights are gathered in
    bfloat16 and its gradients reduced in float32 onto the float32 shards (the master weights), except
    a block holding parameters its family keeps in float32 (``float32_parameters``: Mamba's ``A_log``),
    which is gathered in float32 (autocast still multiplies in bfloat16). One group per block, never
    nested, so a compiled block's forward has no gather inside it.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def policy(module: nn.Module) -> dict:
        if not bfloat16:
            return {}
        keeps = any(isinstance(getattr(part, name, None), nn.Parameter) for part in module.modules()
                    for name in getattr(part, "float32_parameters", ()))
        return {"mp_policy": MixedPrecisionPolicy(param_dtype=None if keeps else torch.bfloat16,
                                                  reduce_dtype=torch.float32)}

    for block in model.blocks:
        if block.shared_use is None:
            fully_shard(block, **policy(block))
    fully_shard(model, **policy(model))


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, weights: dict,
                    moments: dict | None) -> None:
    """Load whole tensors (a checkpoint's, read by every process) into a sharded ``model`` and its
    ``optimizer``: each process keeps its shard. ``moments``: name -> {moment -> tensor}, as
    :func:`attnspec.training.rundir.checked_moments` gives them."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    if optimizer is not None and moments is not None:
        groups = get_optimizer_state_dict(model, optimizer)["param_groups"]  # by parameter name, this run's
        set_optimizer_state_dict(model, optimizer, {"state": moments, "param_groups": groups}, options=options)


def save_shards(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every process writes its shard of a sharded ``model``'s weights and AdamW state into ``folder``
    (torch.distributed.checkpoint, its safetensors format: :func:`attnspec.io.shard_file`, each piece
    with its offset; nothing pickled); a tensor every process holds whole (a step count) once."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    dcp.save(_flat_state(model, optimizer), storage_writer=HuggingFaceStorageWriter(str(folder), save_distributed=True))


def load_shards(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a sharded checkpoint (:func:`save_shards`, written by any number of processes) into this run's
    sharded ``model`` and ``optimizer``: each process reads the pieces of its own shard.

    Before torch.distributed.checkpoint reads anything, every process checks the folder's layout from
    its files' headers (:func:`attnspec.io.sharded_layout`: valid safetensors files, pieces that tile
    whole tensors) against this run's state (the same names, each whole tensor of this run's shape and
    dtype), so a damaged checkpoint never reaches the reader. Whatever the reader still raises is caught,
    ``BaseException``s included (torch's ``CheckpointException`` is one), and after it every process
    checks what it holds (finite weights and moments, second moments non-negative). The processes agree
    on the outcome at each step, so all of them stop together or none does.

    Raises:
        RunError: on every process, when the checkpoint does not fit the model or holds such values.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from attnspec.errors import RunError

    state = _flat_state(model, optimizer)
    problem = _layout_problem(folder, state)
    if not _everywhere(problem is None):
        raise RunError(f"{folder}: the sharded checkpoint {problem or 'is damaged (another process found it)'}")
    try:
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # noqa: BLE001 - torch's CheckpointException is a BaseException wrapping anything
        said = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        problem = f"does not fit this run's model ({said[:300]})"
    if problem is None:
        bad = [name for name, tensor in state.items() if not _sane(name, tensor)]
        problem = f"holds NaN, infinite or negative second-moment values in {bad[0]}" if bad else None
    if not _everywhere(problem is None):
        raise RunError(f"{folder}: the sharded checkpoint {problem or 'is damaged (another process found it)'}; "
                       "the checkpoint is damaged")
    set_model_state_dict(model, {name[len("model."):]: tensor for name, tensor in state.items()
                                 if name.startswith("model.")})
    moments: dict = {}
    for name, tensor in state.items():
        if name.startswith("optimizer."):
            parameter, moment = name[len("optimizer."):].rsplit(".", 1)
            moments.setdefault(parameter, {})[moment] = tensor
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]
    set_optimizer_state_dict(model, optimizer, {"state": moments, "param_groups": groups})


def _layout_problem(folder: Path, state: dict) -> str | None:
    """What keeps the sharded checkpoint ``folder`` from filling ``state`` (:func:`_flat_state`, DTensors
    whose shapes are the whole tensors'), read from the files' headers; None when it fits."""
    from attnspec.errors import RunError
    from attnspec.io import SAFETENSORS_NAMES, read_json, shard_count, sharded_layout

    try:
        layout = sharded_layout(folder, shard_count(folder, read_json(folder / "state.json")) or 0)
    except RunError as error:
        return f"is damaged ({str(error)[:400]})"
    for name, tensor in state.items():
        if name not in layout:
            return f"has no {name}, which this run's model holds"
        shape, dtype, _ = layout[name]
        if shape != tuple(tensor.shape) or dtype != SAFETENSORS_NAMES[str(tensor.dtype).removeprefix("torch.")]:
            return (f"holds {name} as {dtype} {list(shape)}, where this run's model has "
                    f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}")
    extra = sorted(set(layout) - set(state))
    return f"holds {extra[0]}, which this run's model does not have" if extra else None


def _everywhere(ok: bool) -> bool:
    """Whether ``ok`` holds on every process (each must call it)."""
    flag = torch.tensor([int(not ok)], dtype=torch.int32)
    dist.all_reduce(flag)
    return not int(flag)


def _flat_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The sharded weights and AdamW state by flat name: ``model.{parameter}``, ``optimizer.{parameter}.{moment}``
    (the names a whole checkpoint's two files use, prefixed), as DTensors of this run's sharding."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {f"model.{name}": tensor for name, tensor in get_model_state_dict(model).items()}
    for name, entry in get_optimizer_state_dict(model, optimizer)["state"].items():
        state.update({f"optimizer.{name}.{moment}": value for moment, value in entry.items()})
    return state


def _sane(name: str, tensor: torch.Tensor) -> bool:
    """This process's piece of a loaded tensor is finite (and non-negative for AdamW's second moment)."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    if not local.is_floating_point():
        return True
    return bool(torch.isfinite(local).all()) and not (name.endswith(".exp_avg_sq") and bool((local < 0).any()))


def setup(device: str = "auto", parallel: str = "ddp") -> Distributed:
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
    return Distributed(rank, world, chosen, parallel)
