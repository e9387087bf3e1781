"""Values that every layer of one decoding step computes alike, computed once per step.

A decoding step's layers derive the same things from the same position tensor: how many cache slots
each row has written, and which (softmax attention, the same capacity); the rotary angles (RoPE,
the same frequencies). Computed per layer, they are a third of a small model's step in ops, and an
exported step runs every op from Python (``torch.export``'s module), so each costs several
microseconds whatever its size. Inside :func:`one_step` (``Model.step`` opens it), :func:`shared`
computes each once and hands every later layer the same tensors; outside it, and under
``torch.compile`` (whose graphs must not hold Python state), it computes afresh.

A value is named by its computation and its inputs: tensors by identity (kept alive with the value,
so no identity is reused within the step; not modified within it), traced sizes by their expression,
everything else by value. The values must be read only.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")
_STEP: ContextVar[dict | None] = ContextVar("attnspec_step_values", default=None)


@contextlib.contextmanager
def one_step() -> Iterator[None]:
    """The scope of one decoding step: :func:`shared` values live until it closes. Under
    ``torch.compile`` it is no scope (Dynamo cannot trace a ContextVar): :func:`shared` computes afresh
    there, each layer's copy in the traced graph."""
    if torch.compiler.is_dynamo_compiling():
        yield
        return
    token = _STEP.set({})
    try:
        yield
    finally:
        _STEP.reset(token)


def shared(name: str, inputs: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, a function of ``inputs`` (tensors, numbers, strings), computed once per ``name``
    and inputs within :func:`one_step` (and at every call outside it)."""
    if torch.compiler.is_dynamo_compiling():  # (it cannot trace a ContextVar either)
        return compute()
    values = _STEP.get()
    if values is None:
        return compute()
    key = (name, *(_key(x) for x in inputs))
    if key not in values:
        values[key] = (compute(), inputs)  # the inputs held: their identities stay theirs
    return values[key][0]


def _key(x):
    """What names ``x`` among a step's inputs: a tensor its identity, a traced size (an exported program's
    dynamic capacity, a ``torch.SymInt``: unhashable) its expression, anything else itself."""
    if isinstance(x, Tensor):
        return ("tensor", id(x))
    if isinstance(x, torch.SymInt):
        return ("size", str(x.node.expr))
    return x


__all__ = ["one_step", "shared"]
