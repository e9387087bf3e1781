"""Planning: choose per mixer the execution mode for full sequences and for one-token decoding.

The cost model estimates, per mixer and per mode, the multiply-adds, the bytes moved through
memory and the number of sequential steps, from the sequence length L, the widths (feature
width m, value width d, head count H) and whether the transition is per channel or complex.
A mode's estimated time is

    macs / MAC_RATE + bytes / BANDWIDTH + sequential_steps * STEP_OVERHEAD

with rates for a 2-core CPU; ``auto`` takes the cheapest valid mode. Three regimes:

* full sequence (training, prefill): the model is compiled and exported with a dynamic length,
  so only modes without a Python loop over positions qualify (chunk, scan, quadratic); a
  forced ``recurrent`` is rejected for builds with the reason.
* training at a batch B: the multiply-adds and memory traffic scale with B and about 3x (the
  backward pass recomputes and stores what the forward did), the sequential steps only 2x, so at
  training batches the work, not the number of steps, decides (a per-channel quadratic mode that
  wins at batch 1 materialises B x L x L x m decays and loses). An eager (uncompiled) training
  run may use the recurrent mode's loop; a compiled one is traced at a fixed length, so may too.
* decoding: the recurrent step (constant-size state) for mixers that have one; softmax and
  Scatterbrain need the whole prefix, so a model containing them has no decoding step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from attnspec.errors import BuildError
from attnspec.spec.ir import Spec, iter_blocks
from attnspec.spec.source import format_path

MAC_RATE = 40e9  # multiply-adds per second a 2-core CPU sustains on these shapes (measured order)
BANDWIDTH = 10e9  # bytes per second of memory traffic
STEP_OVERHEAD = 20e-6  # seconds per sequential step (a kernel launch / Python iteration)
# Eager training pays far more per sequential step: each position of the recurrent loop runs ~15
# small ops forward and their autograd nodes backward. Measured on the 2-core CPU (per-channel
# GateLoop, one layer, L = 64..2048): ~0.7 ms per position for forward + backward together.
TRAINING_STEP_OVERHEAD = 350e-6
BYTES = 4


@dataclass
class Cost:
    """Estimated work of one mixer at one length (all heads, batch 1)."""

    macs: float
    bytes: float
    state_bytes: float
    sequential_steps: int
    step_overhead: float = STEP_OVERHEAD

    @property
    def seconds(self) -> float:
        return self.macs / MAC_RATE + self.bytes / BANDWIDTH + self.sequential_steps * self.step_overhead


@dataclass
class LayerPlan:
    """The plan of one block's mixer."""

    path: str
    mixer: str
    full_mode: str
    decode_mode: str | None
    cost: Cost
    reason: str
    candidates: dict[str, float] = field(default_factory=dict)


@dataclass
class Plan:
    """The plan of a model at one length: one :class:`LayerPlan` per block, in execution order."""

    length: int
    layers: list[LayerPlan]
    batch: int = 1
    training: bool = False

    @property
    def full_modes(self) -> list[str]:
        return [layer.full_mode for layer in self.layers]

    @property
    def has_decode(self) -> bool:
        return all(layer.decode_mode is not None for layer in self.layers)

    def to_json(self) -> dict:
        return {"length": self.length, "batch": self.batch, "training": self.training,
                "layers": [asdict(layer) for layer in self.layers]}


def linear_costs(L: int, H: int, m: int, d: int, chunk: int, per_channel: bool, complex_: bool) -> dict[str, Cost]:
    """Estimated costs of each mode of (gated) linear attention; see the module docstring."""
    c = 2 if complex_ else 1  # real and imaginary parts of the state
    state = H * m * d * c
    n = -(-L // chunk)
    levels = max(0, math.ceil(math.log(max(n / 64, 1), 16)))  # grouping levels of the cross-chunk scan
    intra_decay = L * chunk * (m if per_channel else 1)
    costs = {
        "recurrent": Cost(macs=H * L * m * d * 2 * c, bytes=H * L * (2 * m + d) * BYTES + L * state * BYTES,
                          state_bytes=state * BYTES, sequential_steps=L),
        "scan": Cost(macs=H * L * m * d * c * (1 + max(1, math.ceil(math.log2(max(L, 2))))),
                     bytes=H * L * m * d * c * BYTES * (2 + 2 * math.ceil(math.log2(max(L, 2)))),
                     state_bytes=state * BYTES, sequential_steps=math.ceil(math.log2(max(L, 2)))),
        # the cross-chunk scan is a recurrence over chunk states: ~2 multiply-adds and ~5 passes per entry
        "chunk": Cost(macs=H * (L * chunk * (m + d) + 2 * L * m * d * c + intra_decay + 2 * n * m * d * c),
                      bytes=H * (L * chunk * (1 + (m if per_channel else 0)) + n * m * d * c * 5 + L * (2 * m + 2 * d)) * BYTES,
                      state_bytes=state * BYTES, sequential_steps=2 * levels + 6),
        "quadratic": Cost(macs=H * (L * L * (m + d) + (L * L * m if per_channel else 0)),
                          bytes=H * L * L * (2 + (m if per_channel else 0)) * BYTES,
                          state_bytes=state * BYTES, sequential_steps=4),
    }
    return costs


def _softmax_cost(L: int, H: int, dk: int, dv: int) -> Cost:
    return Cost(macs=H * L * L * (dk + dv) / 2, bytes=H * L * (2 * dk + 2 * dv) * BYTES * 4, state_bytes=0,
                sequential_steps=4)


def plan_spec(spec: Spec, length: int | None = None, *, for_build: bool = False, batch: int = 1,
              training: bool = False) -> Plan:
    """Plan every block of a resolved spec at ``length`` (default ``max_len``).

    With ``for_build`` a forced mode that cannot be compiled with a dynamic length is an error.
    ``batch`` and ``training``: the regime of a training run (forward and backward at that batch,
    fixed length, so the recurrent loop qualifies); the default is inference at batch 1.
    """
    L = length or spec.max_len
    if L < 1:
        raise BuildError(f"--length must be positive, got {L}")
    if batch < 1:
        raise BuildError(f"the batch must be positive, got {batch}")
    layers = []
    for index, (path, block) in enumerate(iter_blocks(spec, expand=True)):
        layers.append(_plan_mixer(block.mixer, f"blocks[{index}] ({format_path(path)})", L, for_build, batch, training))
    return Plan(L, layers, batch, training)


def _regime(cost: Cost, batch: int, training: bool) -> Cost:
    """A batch-1 forward cost scaled to ``batch`` and, when training, to forward + backward."""
    work = batch * (3 if training else 1)
    return Cost(macs=cost.macs * work, bytes=cost.bytes * work, state_bytes=cost.state_bytes * batch,
                sequential_steps=cost.sequential_steps * (2 if training else 1),
                step_overhead=TRAINING_STEP_OVERHEAD if training else cost.step_overhead)


def _plan_mixer(mixer, path: str, L: int, for_build: bool, batch: int = 1, training: bool = False) -> LayerPlan:
    H = mixer.heads
    if mixer.softmax_kernel:
        cost = _regime(_softmax_cost(L, H, mixer.d_qk, mixer.d_v), batch, training)
        return LayerPlan(path, mixer.describe(), "quadratic", None, cost,
                         "the softmax kernel has no finite features: quadratic is the only mode; no constant-size "
                         "decoding state (the whole prefix is needed)", {"quadratic": cost.seconds})
    transition = getattr(mixer, "transition", None)
    per_channel = transition is not None and transition.per_channel
    complex_ = transition is not None and transition.is_complex
    d = mixer.d_v + (1 if getattr(mixer, "normalize", True) else 0)
    m = mixer.feature_width()
    costs = {mode: cost for mode, cost in linear_costs(L, H, m, d, mixer.chunk_size, per_channel, complex_).items()
             if mode in mixer.modes()}
    sparse = mixer.sparse_keys()
    for cost in costs.values():  # the exact part on a sparse support (Scatterbrain)
        cost.macs += H * L * sparse * (mixer.d_qk + mixer.d_v + m)
        cost.bytes += H * L * sparse * (mixer.d_qk + mixer.d_v) * BYTES
    if not mixer.causal:  # every mode but quadratic computes the linear form q (K^T V): no loop, no scan
        linear_form = Cost(macs=H * L * m * d * 2, bytes=H * L * (2 * m + 2 * d) * BYTES, state_bytes=0,
                           sequential_steps=3)
        costs = {name: (costs[name] if name == "quadratic" else linear_form) for name in costs}
    costs = {name: _regime(cost, batch, training) for name, cost in costs.items()}
    loops = mixer.causal and not training  # a loop over positions cannot be exported with a dynamic length
    compilable = {name: cost for name, cost in costs.items() if name != "recurrent" or not loops}
    seconds = {name: cost.seconds for name, cost in costs.items()}
    decode = "recurrent" if mixer.has_step else None
    if mixer.mode != "auto":
        if for_build and mixer.mode == "recurrent" and loops:
            raise BuildError(f"{path}: mixer.mode 'recurrent' loops over positions in Python, so it cannot be compiled "
                             "or exported with a dynamic sequence length; use `mode: auto` or `chunk` (decoding "
                             "uses the recurrent form anyway)")
        chosen = mixer.mode
        reason = f"forced by the spec (mode: {mixer.mode})"
    else:
        chosen = min(compilable, key=lambda name: compilable[name].seconds)
        ranked = sorted(compilable, key=lambda name: compilable[name].seconds)
        reason = ("training " if training else "") + (f"at batch {batch}, " if batch > 1 else "") + "cheapest: " + ", ".join(f"{name} {compilable[name].seconds * 1e3:.2f} ms" for name in ranked)
        if "recurrent" in costs and loops:
            reason += f"; recurrent {costs['recurrent'].seconds * 1e3:.2f} ms (not compilable with dynamic length)"
    if decode is None:
        reason += "; no decoding step (" + ("it needs the whole prefix)" if mixer.causal else "non-causal)")
    return LayerPlan(path, mixer.describe(), chosen, decode, costs[chosen], reason, seconds)
