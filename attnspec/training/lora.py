"""Low-rank adaptation (LoRA, Hu et al. 2021) of a model's linear maps during training (the config's ``lora``).

An adapted map W (out, in) computes W x + (alpha / rank) B A dropout(x): A (rank, in) drawn as nn.Linear draws its
weight, B (out, rank) zeros, so training starts from the model as it was; W and its bias are frozen, A and B
train. The adapter is a submodule of the map (``<map>.lora.down``, ``<map>.lora.up``) run by a forward hook, so
the model's own names, its compiled code and its state dict keys for everything else stay as they are.

What a run produces is the merged model: every checkpoint's ``model.safetensors`` holds W + (alpha / rank) B A, a
plain model of the spec that anything reading a run (eval, export, ``init_weights``, a teacher) reads as it reads
any run; ``adapters.safetensors`` beside it holds each adapted map's own W and its A and B, which a resumed run
trains on from exactly where it stopped. :func:`merge_adapters` folds them into the model in place at the end.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from attnspec.errors import Problem, RunError, SpecError

ADAPTER = "lora"
"""The attribute of an adapted linear map holding its :class:`LoraAdapter`."""


class LoraAdapter(nn.Module):
    """B A dropout(x) times ``scale``: ``down`` A (rank, in), ``up`` B (out, rank), B zero at the start. A is drawn
    as nn.Linear draws a weight, U(-1/sqrt(in), 1/sqrt(in)), from a generator seeded with ``seed``: a run's adapters
    are the same whatever the process drew before."""

    def __init__(self, linear: nn.Linear, rank: int, alpha: float, dropout: float, seed: int):
        super().__init__()
        options = {"device": linear.weight.device, "dtype": linear.weight.dtype}
        self.down = nn.Linear(linear.in_features, rank, bias=False, **options)
        self.up = nn.Linear(rank, linear.out_features, bias=False, **options)
        bound = linear.in_features ** -0.5
        drawn = torch.rand(rank, linear.in_features, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        with torch.no_grad():
            self.down.weight.copy_((2 * drawn - 1) * bound)
        nn.init.zeros_(self.up.weight)
        self.scale = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(self.dropout(x))) * self.scale

    def delta(self) -> Tensor:
        """(alpha / rank) B A, the change it makes to the map's weight (out, in), computed in float64."""
        return (self.up.weight.double() @ self.down.weight.double()) * self.scale


def _adapted_output(linear: nn.Linear, args: tuple, output: Tensor) -> Tensor:
    return output + getattr(linear, ADAPTER)(args[0]).to(output.dtype)


def matched_maps(model: nn.Module, targets: list[str], where: str = "lora.targets") -> dict[str, nn.Linear]:
    """The linear maps of ``model`` whose name one of the globs ``targets`` matches (``blocks.*.mixer.q_proj``: the
    name ``explain`` and a build's manifest give its weight, without ``.weight``), by name, in order.

    Raises:
        SpecError: located at ``{where}[i]`` for a pattern naming no linear map (or naming a shared block's, which
            its calls alias), with the model's linear maps listed.
    """
    linears = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    adapted: dict[str, nn.Linear] = {}
    for index, pattern in enumerate(targets):
        matched = {name: module for name, module in linears.items() if fnmatch.fnmatchcase(name, pattern)}
        at = f"{where}[{index}]"
        if any(name.startswith("shared_blocks.") or ".tied_view." in name for name in matched):
            raise SpecError(Problem(f"{pattern!r} names a shared block's projections, which every call of it runs; "
                                    "adapt the calling blocks' own maps, or freeze the shared block",
                                    path=at, source="training configuration"))
        if not matched:
            names = [name for name in linears if ".tied_view." not in name]
            near = ", ".join(names[:4]) + (f" ... ({len(names)} in all)" if len(names) > 4 else "")
            raise SpecError(Problem(f"{pattern!r} names no linear map of this model (its linear maps: {near}); a "
                                    "pattern is a glob over them, `*` any characters", path=at,
                                    source="training configuration"))
        read, untrained = (sorted(found) for found in _probed(model, matched))
        if read:
            raise SpecError(Problem(f"{pattern!r} names map(s) the model reads through their weight rather than "
                                    f"by calling them ({', '.join(read[:3])}{' ...' if len(read) > 3 else ''}): "
                                    "an adapter there would never run; adapt other maps, or train these whole "
                                    "(`lora.train`)", path=at, source="training configuration"))
        if untrained:
            raise SpecError(Problem(f"{pattern!r} names map(s) whose output reaches the model's output through no "
                                    f"gradient ({', '.join(untrained[:3])}{' ...' if len(untrained) > 3 else ''}: "
                                    "read only through a discrete choice, as sparse attention's indexer picks its "
                                    "keys): an adapter there would never train; adapt other maps",
                                    path=at, source="training configuration"))
        adapted.update(matched)
    return {name: adapted[name] for name in sorted(adapted)}


def _probed(model: nn.Module, maps: dict[str, nn.Linear]) -> tuple[set[str], set[str]]:
    """What a forward pass of ``model`` (a random input of 2 rows and 8 positions, eval mode) does with ``maps``:
    (those it reads through their weight outside their own call, where no adapter's forward hook would see it:
    Mamba's ``dt_proj``, its split ``x_proj``; those it calls whose output no gradient of the model's output
    reaches, where an adapter would never train: sparse attention's indexer, whose scores pick keys by top-k).

    Every torch function's arguments are watched for the maps' weights (:class:`_WeightReads`), and each called
    map's output gets a zero added that requires a gradient (the same values, the graph through it kept, so a map
    feeding another is still reached), whose gradient is then asked for: nothing accumulates in the model's
    parameters. A map the input never reaches (an expert no token was routed to) is neither."""
    from attnspec.compiler.tracing import example_input

    outputs: dict[str, Tensor] = {}
    watch = _WeightReads({id(linear.weight): name for name, linear in maps.items()})

    def enter(name):
        watch.inside.append(name)

    def leave(output, name):
        watch.inside.remove(name)  # the output plus a zero that asks for a gradient: the same values, in the graph
        outputs[name] = output + torch.zeros((), dtype=output.dtype, device=output.device, requires_grad=True)
        return outputs[name]

    hooks = [hook for name, linear in maps.items() for hook in (
        linear.register_forward_pre_hook(lambda module, args, name=name: enter(name)),
        linear.register_forward_hook(lambda module, args, output, name=name: leave(output, name)))]
    training = model.training
    try:
        model.eval()
        with torch.enable_grad():
            with watch:
                result = model(example_input(model, 2, 8, torch.Generator().manual_seed(0)))
            names = list(outputs)
            cotangent = torch.randn(result.shape, generator=torch.Generator().manual_seed(1)).to(result)
            grads = torch.autograd.grad(result, [outputs[n] for n in names], cotangent, allow_unused=True) \
                if names and result.requires_grad else [None] * len(names)
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    untrained = {name for name, grad in zip(names, grads) if grad is None}  # (zeros here may be this input's)
    return watch.read_outside, untrained - watch.read_outside


class _WeightReads(TorchFunctionMode):
    """Records the maps (``weights``: id of a weight -> its map's name) whose weight a torch function reads while
    that map's own forward is not running (``inside``: the maps whose forward is)."""

    METADATA = frozenset({*(getattr(Tensor, name).__get__ for name in ("dtype", "device", "shape", "ndim", "layout",
                                                                       "requires_grad", "is_cuda", "is_meta")),
                          Tensor.size, Tensor.dim, Tensor.numel, Tensor.is_floating_point, Tensor.element_size})
    """What describes a tensor without reading it (a model asking its embedding's dtype reads no weight)."""

    def __init__(self, weights: dict[int, str]):
        super().__init__()
        self.weights, self.inside, self.read_outside = weights, [], set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for value in () if func in self.METADATA else _leaves((args, kwargs)):
            name = self.weights.get(id(value)) if isinstance(value, Tensor) else None
            if name is not None and name not in self.inside:
                self.read_outside.add(name)
        return func(*args, **kwargs)


def _leaves(value):
    """The tensors (and other values) inside nested tuples, lists and dicts of a torch function's arguments."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


def adapter_names(maps: dict[str, nn.Linear]) -> tuple[list[str], set[str]]:
    """(the parameters adapters on ``maps`` add, the maps' own parameters they freeze), by name."""
    added = [f"{name}.{ADAPTER}.{part}.weight" for name in maps for part in ("down", "up")]
    return added, {f"{name}.{part}" for name, linear in maps.items() for part in ("weight", "bias")
                   if getattr(linear, part) is not None}


def attach_adapters(model: nn.Module, targets: list[str], rank: int, alpha: float, dropout: float,
                    seed: int = 0, where: str = "lora.targets") -> list[str]:
    """Give every linear map of ``model`` that ``targets`` name (:func:`matched_maps`) a :class:`LoraAdapter`, and
    freeze the map's own weight and bias; the i-th map's A is drawn from ``seed`` + i. Returns the adapted maps'
    names, in order.

    Raises:
        SpecError: as :func:`matched_maps`.
    """
    adapted = matched_maps(model, targets, where)
    for index, (name, linear) in enumerate(adapted.items()):
        linear.add_module(ADAPTER, LoraAdapter(linear, rank, alpha, dropout, seed + index).train(linear.training))
        linear.register_forward_hook(_adapted_output)
        for parameter in (linear.weight, linear.bias):
            if parameter is not None:
                parameter.requires_grad_(False)
    return list(adapted)


def adapted_maps(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear maps of ``model`` that carry an adapter, by name."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and isinstance(getattr(module, ADAPTER, None), LoraAdapter)}


def frozen_by_adapters(model: nn.Module, config, added: list[str] = (), where: str = "lora.train") -> set[str]:
    """What a LoRA stage (``config``: its :class:`~attnspec.training.config.Lora`, or None) freezes besides its
    ``freeze``: every parameter of ``model`` but the adapters' (``added``, or those attached) and those the
    globs ``config.train`` name (peft's ``modules_to_save``); nothing without adapters.

    Raises:
        SpecError: located at ``lora.train[i]``, for a glob that names no parameter.
    """
    import fnmatch

    from attnspec.errors import Problem, SpecError

    if config is None:
        return set()
    names = [name for name, _ in model.named_parameters()]
    adapters = set(added) | {name for name in names if f".{ADAPTER}." in name}
    trained = set()
    for index, pattern in enumerate(config.train):
        matched = {name for name in names if fnmatch.fnmatchcase(name, pattern)}
        if not matched:
            raise SpecError(Problem(f"{pattern!r} names no parameter of this model; a pattern is a glob over its "
                                    "parameters' names, `*` any characters", path=f"{where}[{index}]",
                                    source="training configuration"))
        trained |= matched
    return {name for name in names if name not in adapters and name not in trained} | frozen_bases(model)


def frozen_bases(model: nn.Module) -> set[str]:
    """The parameters the adapters freeze: each adapted map's own weight and bias."""
    return {f"{name}.{part}" for name, linear in adapted_maps(model).items() for part in ("weight", "bias")
            if getattr(linear, part) is not None}


def split_state(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(the merged model's state dict, the adapters' file): the first names no adapter, each adapted weight
    W + (alpha / rank) B A in its dtype; the second each adapted map's own W and its A and B."""
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    adapters: dict[str, Tensor] = {}
    for name, linear in adapted_maps(model).items():
        adapter = getattr(linear, ADAPTER)
        prefix = f"{name}.{ADAPTER}."
        for key in [key for key in state if key.startswith(prefix)]:
            adapters[key] = state.pop(key)
        weight = linear.weight.detach()
        adapters[f"{name}.weight"] = weight
        state[f"{name}.weight"] = (weight.double() + adapter.delta().detach()).to(weight.dtype)
    return state, adapters


def joined_state(merged: dict[str, Tensor], adapters: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state dict of a model with adapters from a checkpoint's two files (:func:`split_state`'s inverse):
    the merged weights, each adapted map's own weight and its adapter's tensors taken from ``adapters``
    (a checkpoint's file: :func:`checked_adapters` first)."""
    return {**merged, **adapters}


def checked_adapters(model: nn.Module, merged: dict[str, Tensor], adapters: dict[str, Tensor],
                     path: Path) -> dict[str, Tensor]:
    """``adapters`` (a checkpoint's adapters file, ``path``) when it is what :func:`split_state` writes for
    ``model``'s adapted maps beside the merged weights ``merged``: exactly each adapted map's own weight W,
    its A (``lora.down.weight``) and B (``lora.up.weight``), of the model's shapes and dtypes, finite, and
    W + (alpha / rank) B A equal to the merged weight within 2 units in the last place of its dtype (the
    merge is computed in float64 and rounded once; another machine's float64 product may round the other
    way). So the file can never override another weight of the model, nor disagree with the merged model
    that ``build`` and ``eval`` of the same checkpoint read.

    Raises:
        RunError: naming ``path`` and the tensor that is not so.
    """
    maps = adapted_maps(model)
    expected = {f"{name}.{part}": module for name, linear in maps.items()
                for part, module in (("weight", linear), (f"{ADAPTER}.down.weight", getattr(linear, ADAPTER).down),
                                     (f"{ADAPTER}.up.weight", getattr(linear, ADAPTER).up))}
    extra, missing = sorted(set(adapters) - set(expected)), sorted(set(expected) - set(adapters))
    if extra or missing:
        raise RunError(f"{path}: an adapters file holds each adapted map's own weight and its A and B only; "
                       + (f"it also holds {extra[0]}" if extra else f"it has no {missing[0]}")
                       + " (the checkpoint is damaged, or was not written by this run)")
    for name, module in expected.items():
        tensor, weight = adapters[name], module.weight
        if tuple(tensor.shape) != tuple(weight.shape) or tensor.dtype != weight.dtype:
            raise RunError(f"{path}: {name} is {str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}, "
                           f"where the model has {str(weight.dtype).removeprefix('torch.')} {tuple(weight.shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise RunError(f"{path}: {name} holds NaN or infinite values; the checkpoint is damaged")
    for name, linear in maps.items():
        stored = merged.get(f"{name}.weight")
        own = adapters[f"{name}.weight"].double()
        down, up = adapters[f"{name}.{ADAPTER}.down.weight"], adapters[f"{name}.{ADAPTER}.up.weight"]
        recomputed = own + (up.double() @ down.double()) * getattr(linear, ADAPTER).scale
        if stored is None or tuple(stored.shape) != tuple(recomputed.shape):
            raise RunError(f"{path}: the merged weights have no {name}.weight of its shape to check the adapter "
                           "against; the checkpoint is damaged")
        eps = torch.finfo(linear.weight.dtype).eps
        bound = 2 * eps * recomputed.abs() + torch.finfo(linear.weight.dtype).tiny
        if not bool(((stored.double() - recomputed).abs() <= bound).all()):
            raise RunError(f"{path}: {name}'s own weight and adapter do not make the merged weight model.safetensors "
                           "holds (W + (alpha / rank) B A); the two files are not one checkpoint")
    return adapters


@torch.no_grad()
def merge_adapters(model: nn.Module) -> None:
    """Fold every adapter into its map's weight (W += (alpha / rank) B A) and remove it with its hook: the model
    is then a plain model of its spec."""
    for linear in adapted_maps(model).values():
        adapter = getattr(linear, ADAPTER)
        linear.weight.copy_((linear.weight.double() + adapter.delta()).to(linear.weight.dtype))
        del linear._modules[ADAPTER]
        for key, hook in list(linear._forward_hooks.items()):
            if hook is _adapted_output:
                del linear._forward_hooks[key]
        for parameter in (linear.weight, linear.bias):
            if parameter is not None:
                parameter.requires_grad_(True)


def adapter_parameters(model: nn.Module) -> int:
    """How many numbers the adapters train."""
    return sum(p.numel() for linear in adapted_maps(model).values() for p in getattr(linear, ADAPTER).parameters())


__all__ = ["ADAPTER", "LoraAdapter", "adapted_maps", "adapter_names", "adapter_parameters", "attach_adapters",
           "matched_maps", "checked_adapters",
           "frozen_bases", "joined_state", "merge_adapters", "split_state"]
