"""What every mixer family's module has: its facts from the IR node, its planned mode and kernels, and
the defaults of decoding (prefill by stepping). A family is one module of this package built on this
class and the parts it opts into (:mod:`attnspec.nn.mixers.parts`); a plugin family is built the same
way (``examples/plugins/ema.py``).

Every mixer maps ``x`` of shape (B, L, d_model) to (B, L, d_model). ``forward(x, mode=None)`` runs the
whole sequence in ``self.mode`` (set by the compiler's plan) or the given mode, on the first of the
family's kernels that takes the call (:meth:`Mixer.kernel_for`). A family that sets
``takes_documents`` also takes ``forward(x, mode, documents=...)``: packed documents
(:class:`attnspec.ops.documents.Documents`), each computed as it would be alone. Mixers with a decoding step
(``has_step``) also provide ``init_state(batch, dtype, device)`` and ``step(x_t, state, position)``,
with the state as a tuple of plain tensors so the step can be exported, and ``prefill(x)``.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from attnspec.errors import ShapeError
from attnspec.ops.kernels import call_regime, first_that_runs
from attnspec.ops.per_step import shared


def full_precision(t: Tensor) -> Tensor:
    """bf16/fp16 activations (under autocast) enter the attention kernels as float32: the projections
    run in half precision, the sums over positions and the normaliser in float32."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def autocast_dtype(t: Tensor) -> Tensor:
    """``t`` in the autocast dtype when autocast is on for its device, else unchanged. Feature maps run
    in float32 (:func:`full_precision`); the attention op then takes its inputs in the training
    dtype because it accumulates states, decays and normalisers in float32 itself, and its Triton
    kernels read half the bytes and multiply on tensor cores."""
    device = t.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return t.to(torch.get_autocast_dtype(device))
    return t


class Mixer(nn.Module):
    """A mixer family's module: the IR node's facts (``node.modes()``, ``node.has_step``, its widths),
    the planned ``mode``, the kernels that may run each mode (``kernels``), and ``decode_limit`` (the
    positions its decoding state can hold, None: unbounded; the node's
    :meth:`~attnspec.spec.ir.MixerComponent.decode_limit`). Every mixer has an ``out_proj``, its map
    into the residual stream (``init.residual_scaling`` draws it)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__()
        self.kind = node.kind
        # the input's width: d_model, or wider for a family that `projects_input` (a shared block reading
        # [hidden, embeddings]); the output is always d_model wide
        self.d_in = d_in or d_model
        self.modes: tuple[str, ...] = node.modes()
        self.reference_mode = node.reference_mode  # what verification holds the other modes to
        self.has_step = node.has_step
        self.heads, self.d_qk, self.d_v = node.output_heads, node.d_qk, node.d_v
        self.causal, self.scale, self.max_len, self.d_model = node.causal, node.scale, max_len, d_model
        self.chunk_size = node.chunk_size
        self.mode = node.mode if node.mode != "auto" else self.modes[0]
        # per mode, the kernels that may run it (in order of preference) and what it hands them: which
        # one runs a call is decided at the call by their predicates, the ones the plan asked
        self.kernels = {mode: (tuple(backend.name for backend in node.backends(mode)), node.kernel_inputs(mode))
                        for mode in self.modes}
        self.decode_limit = node.decode_limit(max_len)
        self.init_scale = node.init_scale

    takes_documents: bool = False
    """Whether ``forward`` takes packed documents (``documents=``) and computes each as if alone; a
    model refuses documents when one of its mixers does not (a plugin family that has not said so)."""

    def projections(self) -> list[nn.Linear]:
        """The linear maps from and to the model width (the spec's ``init.projection_std`` draws them)."""
        return []

    def projection_groups(self) -> list[tuple[list[nn.Linear], float]]:
        """(projections, their ``init_scale``) for ``init.projection_std`` to draw: this mixer's own, or each
        branch's of a parallel mixer."""
        return [(self.projections(), self.init_scale)]

    def residual_writers(self) -> list[Tensor]:
        """The weights that write into the residual stream (``init.residual_scaling`` scales them)."""
        return [self.out_proj.weight]

    def state_size(self, length: int) -> int:
        """Numbers one sequence carries from its past at ``length`` (Zoology's state size): the decoding
        state of a mixer with a recurrent form."""
        return sum(t.numel() for t in self.init_state(1)) if self.has_step else 0

    def kernel_for(self, mode: str, *inputs: Tensor | None) -> str:
        """The kernel that runs the planned ``mode`` on ``inputs`` (the tensors the op receives): the first
        of the family's that takes the call (:mod:`attnspec.ops.kernels`), so on the plan's device and
        dtype in the plan's regime it is the one the plan names. Another mode a caller asks for (a
        verification of every mode) takes the graph path. The op runs the kernel named or raises."""
        if mode != self.mode:
            return "graph"
        names, kernel_inputs = self.kernels[mode]
        regime = call_regime(*inputs)
        regime = dataclasses.replace(regime, dtype=kernel_inputs.call_dtype(regime.dtype))
        return first_that_runs(names, kernel_inputs, regime)

    def _checked_mode(self, mode: str | None) -> str:
        """``mode`` (or the planned ``self.mode`` when None), refused unless this mixer has it."""
        if mode is None:
            return self.mode
        if mode not in self.modes:
            raise ShapeError(f"a {self.kind} mixer runs in {', '.join(self.modes)}, not in mode {mode!r}")
        return mode

    # -- prefill: a prompt in one pass, and the state the step continues from
    @property
    def prefills_in_one_pass(self) -> bool:
        """Whether :meth:`prefill` is a full-sequence computation (the family's own) rather than the
        default's loop over positions: only then can an exported prefill take prompts of any length."""
        return type(self).prefill is not Mixer.prefill

    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x (B, L, d_model) -> (y (B, L, d_model), the decoding state after position L - 1). This default
        steps through the positions; the families build the state from their full-sequence mode."""
        state = self.init_state(x.shape[0], x.dtype, x.device)
        outputs = []
        for t in range(x.shape[1]):
            y, state = self.step(x[:, t], state, torch.full((x.shape[0],), t, dtype=torch.long, device=x.device))
            outputs.append(y)
        return torch.stack(outputs, 1), state

    def regularization_loss(self) -> Tensor | None:
        return None


def holding(mixer: Mixer, capacity: int | None) -> dict:
    """The keyword a mixer's ``init_state`` and ``prefill`` take for a generation's ``capacity`` (the
    positions it will reach): ``{"capacity": capacity}`` for a mixer whose state holds positions (a
    ``decode_limit``: a full key/value cache, kept inputs), else ``{}``: recurrent states and sliding
    windows have one size whatever the length, and a plugin family without a cache need not take it."""
    return {} if capacity is None or mixer.decode_limit is None else {"capacity": capacity}


def positions_held(most: int, capacity: int | None) -> int:
    """The positions a state that holds them (a full cache, kept inputs) is made with: ``most`` (its
    ``max_len``), or a generation's ``capacity`` where given and smaller (an exported program's dynamic
    capacity is at most ``max_len`` by its range: ``min`` would add a guard)."""
    if isinstance(capacity, torch.SymInt):
        torch._check(capacity <= most)
        return capacity
    return most if capacity is None else min(capacity, most)


def check_prompt_fits(length: int, capacity: int) -> None:
    """Refuse a prompt of ``length`` positions for a state that holds ``capacity`` (eager code: traced
    code has its shapes fixed by export)."""
    if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and length > capacity:
        raise ShapeError(f"a prompt of {length} positions does not fit a decoding state of {capacity} positions; "
                         "give a capacity of at least the prompt's length plus the tokens to generate")


def check_position_held(position: Tensor, capacity: int, what: str, or_else: str = "") -> None:
    """Refuse a step at a ``position`` (B,) past the ``capacity`` positions a state holds (a full cache
    would wrap into a silent window): a ShapeError in eager code; in an exported step whose capacity is
    the caller's (a dynamic size), a data-dependent assertion raised when the program runs; either made once
    per step and capacity (:func:`attnspec.ops.per_step.shared`). A fixed exported capacity is ``max_len``,
    which the model's own check bounds."""
    remedy = f"raise max_len or the capacity{', or ' + or_else if or_else else ''}"
    if torch.compiler.is_exporting():
        if isinstance(capacity, torch.SymInt):
            message = f"{what}: a position is past the capacity the state was made with ({remedy})"
            shared("position held", (position, capacity),
                   lambda: torch._assert_async((position < capacity).all(), message))
        return
    if torch.compiler.is_compiling() or not position.numel():
        return

    def check() -> None:  # one host read per step and capacity, not one per layer
        if int(position.max()) >= capacity:
            raise ShapeError(f"{what} holds {capacity} positions (max_len, or the capacity the state was made "
                             f"with); position {int(position.max())} is past it ({remedy})")

    shared("position held", (position, capacity), check)


__all__ = ["Mixer", "autocast_dtype", "check_position_held", "check_prompt_fits", "full_precision", "holding",
           "positions_held"]
