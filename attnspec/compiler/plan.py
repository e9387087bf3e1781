"""Planning: choose per mixer the (mode, backend) for full sequences and the mode for one-token decoding.

The unit is the mixer *family* (:mod:`attnspec.spec.family`): its IR class states its modes, the
cost of each (``mode_costs``: multiply-adds, bytes moved through memory and sequential steps at
length L, from its widths and structure) and the backends of each mode with when they apply
(``backends``); this module branches on no kind name. A mode's estimated time is

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
* decoding: the family's ``decode_mode``: the recurrent step (a constant-size state), a key/value
  cache of ``decode_cache`` positions (softmax attention: ``max_len``, or its window as a ring
  buffer), or the mixer rerun over its cached inputs (Scatterbrain); non-causal mixers have none.

The backend of the chosen mode is the family's first that applies on the plan's device to the
spec's dtype in the regime (``LayerPlan.backend``), and, for the build's exported program, the first
that can be exported (``LayerPlan.export_backend``): on a CPU the C++ chunk kernel serves eager
inference and the graph path everything else; on CUDA the Triton kernels serve all three.

Where this machine has a calibration (:class:`~attnspec.compiler.calibration.Calibration`, measured by
:mod:`attnspec.compiler.calibrate`) for a mixer's structure, regime and shapes, ``auto`` takes the
fastest *measured* mode instead of the cheapest estimate; the estimates stay beside the
measurements in ``explain``. This module reads the calibration file without importing torch.
Training passes an empty calibration unless its configuration says ``planning: measured`` (a run's
modes must not depend on a timing taken on one machine), and a resumed run passes the modes it
recorded (``recorded``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from attnspec.compiler.calibration import Calibration, mixer_signature
from attnspec.errors import BuildError
from attnspec.spec.family import Cost, Regime
from attnspec.spec.ir import Spec, iter_blocks
from attnspec.spec.walk import block_labels

# Eager training pays far more per sequential step: each position of the recurrent loop runs ~15
# small ops forward and their autograd nodes backward. Measured on the 2-core CPU (per-channel
# GateLoop, one layer, L = 64..2048): ~0.7 ms per position for forward + backward together.
TRAINING_STEP_OVERHEAD = 350e-6
MAX_BYTES = 2 << 30  # a calibration does not run a mode estimated to move more memory than this
REGIMES = ("inference", "training")


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
    """Estimated seconds of every valid mode."""
    measured: dict[str, float] | None = None
    """Measured seconds of the modes this machine's calibration ran (None: not calibrated)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Modes the calibration did not run, and why."""
    spread: dict[str, float] = field(default_factory=dict)
    """Per measured mode, the interquartile range of its timed runs over their median."""
    backend: str = "graph"
    """What runs ``full_mode`` in the plan's regime on its device (:meth:`MixerComponent.backends`)."""
    export_backend: str = "graph"
    """What runs it inside the build's exported program (a backend that can be exported)."""
    decode_cache: int | None = None
    """Positions the decoding state caches (``decode_mode`` "cache": the window, or ``max_len``); None for
    a constant-size recurrent state."""

    @property
    def seconds(self) -> float:
        """The chosen mode's time: measured where this machine's calibration has it, else estimated."""
        return (self.measured or {}).get(self.full_mode, self.cost.seconds)


DECODING = {
    "recurrent": ("a constant-size state", "memory constant in the position"),
    "cache": ("a key/value cache of {cache:,} positions, allocated once", "memory per position, up to the cache"),
    "borrowed": ("none of its own: it reads the cache of the block that lends it keys and values, {cache:,} "
                 "positions", "cross-layer key/value sharing (`kv_from`): the keys and values are an earlier block's"),
    "prefix": ("the mixer's inputs, {cache:,} positions, rerun each token",
               "exact, but a full pass per token (the sparse support needs every earlier key)"),
    None: ("-", "no decoding step: non-causal"),
}
"""Per decoding mode (:attr:`MixerComponent.decode_mode`): what one sequence holds, and why that mode."""


def decoding_text(layer: LayerPlan) -> tuple[str, str]:
    """What ``layer``'s decoding holds per sequence and why its mode, in words (``explain`` renders them)."""
    held, why = DECODING[layer.decode_mode]
    return held.format(cache=layer.decode_cache or 0), why


@dataclass
class Plan:
    """The plan of a model at one length: one :class:`LayerPlan` per block, in execution order."""

    length: int
    layers: list[LayerPlan]
    batch: int = 1
    training: bool = False
    device: str = "cpu"
    packed: bool = False
    """Planned for packed documents (:mod:`attnspec.ops.documents`): a causal recurrence resets at each
    document's start through a per-head decay, which every backend chosen takes."""

    @property
    def full_modes(self) -> list[str]:
        return [layer.full_mode for layer in self.layers]

    @property
    def backends(self) -> list[str]:
        return [layer.backend for layer in self.layers]

    @property
    def has_decode(self) -> bool:
        return all(layer.decode_mode is not None for layer in self.layers)

    def to_json(self) -> dict:
        return {"length": self.length, "batch": self.batch, "training": self.training, "device": self.device,
                "packed_documents": self.packed, "layers": [asdict(layer) for layer in self.layers]}


def plan_spec(spec: Spec, length: int | None = None, *, for_build: bool = False, batch: int = 1,
              training: bool = False, calibration: "Calibration | None" = None, device: str = "cpu",
              dtype: str | None = None, recorded: list[str] | None = None, packed: bool = False) -> Plan:
    """Plan every block of a resolved spec at ``length`` (default ``max_len``).

    With ``for_build`` a forced mode that cannot be compiled with a dynamic length is an error.
    ``batch`` and ``training``: the regime of a training run (forward and backward at that batch,
    fixed length, so the recurrent loop qualifies); the default is inference at batch 1.
    ``calibration``: measured times to choose by where they exist (default: this machine's cache,
    if any; pass ``Calibration.empty()`` to plan from the cost model alone). ``device``: the device
    type the model runs on ("cpu" or "cuda"), which decides the backends, with ``dtype``: the dtype the
    mixers compute in (default the spec's; ``"bfloat16"`` for a run under bfloat16 autocast).
    ``recorded``: one full mode per block that ``mode: auto`` blocks keep (a resumed run's recorded
    plan), whatever the cost model or a calibration would choose now. ``packed``: the run packs
    documents; the backends are chosen for the decays their resets add (a decay-free recurrence gains
    one per head). The modes' costs do not price that decay (an elementwise term beside the products).
    """
    L = length or spec.max_len
    if L < 1:
        raise BuildError(f"--length must be positive, got {L}")
    if batch < 1:
        raise BuildError(f"the batch must be positive, got {batch}")
    calibration = calibration if calibration is not None else Calibration.load()
    regime = "training" if training else "inference"
    layers = []
    blocks = list(zip(block_labels(spec), iter_blocks(spec, expand=True)))
    if recorded is not None and len(recorded) != len(blocks):
        raise BuildError(f"the recorded plan has {len(recorded)} modes for {len(blocks)} blocks: it is not this "
                         "spec's plan")
    for index, (label, (_, block)) in enumerate(blocks):
        entry = calibration.lookup(mixer_signature(spec, block.mixer), regime, batch, L)
        layer = _plan_mixer(block.mixer, label, L, for_build, batch, training, entry,
                            None if recorded is None else recorded[index])
        layer.decode_cache = block.mixer.cache_capacity(spec.max_len)
        computes_in = dtype or spec.dtype
        layer.backend = choose_backend(block.mixer, layer.full_mode, device=device, dtype=computes_in,
                                       training=training, packed=packed)
        layer.export_backend = choose_backend(block.mixer, layer.full_mode, device=device, dtype=computes_in,
                                              training=training, export=True)
        layers.append(layer)
    return Plan(L, layers, batch, training, device, packed)


def choose_backend(mixer, mode: str, *, device: str, dtype: str, training: bool, export: bool = False,
                   packed: bool = False) -> str:
    """The first of the family's backends for ``mode`` whose predicate (:mod:`attnspec.ops.kernels`, the
    one the op asks) takes the call on ``device`` for a ``dtype`` model in the regime (``training``: a
    gradient flows back; ``export``: inside an exported program; ``packed``: packed documents, whose
    resets give a decay-free causal recurrence a decay per head). The graph path takes every call."""
    import dataclasses

    from attnspec.ops.kernels import first_that_runs  # the predicates import torch; the rest of planning does not

    inputs = mixer.kernel_inputs(mode)
    if packed and inputs.causal and inputs.decay == "none":
        inputs = dataclasses.replace(inputs, decay="head")
    regime = Regime(device, inputs.call_dtype(dtype), grad=training, export=export)
    return first_that_runs([backend.name for backend in mixer.backends(mode)], inputs, regime)


def _regime(cost: Cost, batch: int, training: bool) -> Cost:
    """A batch-1 forward cost scaled to ``batch`` and, when training, to forward + backward."""
    work = batch * (3 if training else 1)
    return Cost(macs=cost.macs * work, bytes=cost.bytes * work, state_bytes=cost.state_bytes * batch,
                sequential_steps=cost.sequential_steps * (2 if training else 1),
                step_overhead=TRAINING_STEP_OVERHEAD if training else cost.step_overhead)


def regime_modes(mixer, regime: str) -> tuple[str, ...]:
    """The modes of ``mixer`` valid in ``regime``: inference (a build) excludes the recurrent mode's
    loop over positions for causal mixers, which cannot be exported with a dynamic length."""
    loops = mixer.causal and regime != "training"
    return tuple(mode for mode in mixer.modes() if mode != "recurrent" or not loops)


def estimated_costs(mixer, L: int, batch: int = 1, training: bool = False) -> dict[str, Cost]:
    """The family's estimate (``mixer.mode_costs``) of every mode ``mixer`` has, at (batch, L) in the regime."""
    return {name: _regime(cost, batch, training) for name, cost in mixer.mode_costs(L).items()}


def _plan_mixer(mixer, path: str, L: int, for_build: bool, batch: int = 1, training: bool = False,
                calibrated: dict | None = None, recorded: str | None = None) -> LayerPlan:
    costs = estimated_costs(mixer, L, batch, training)
    valid = regime_modes(mixer, "training" if training else "inference")
    seconds = {name: cost.seconds for name, cost in costs.items()}
    decode = mixer.decode_mode
    measured = skipped = None
    spread = {}
    if calibrated is not None:
        measured = {mode: t for mode, t in calibrated["seconds"].items() if mode in valid}
        spread = {mode: s for mode, s in calibrated.get("spread", {}).items() if mode in valid}
        skipped = {mode: why for mode, why in calibrated.get("skipped", {}).items() if mode in valid}
    if mixer.is_identity:
        return LayerPlan(path, mixer.describe(), mixer.modes()[0], decode, costs[mixer.modes()[0]],
                         "no mixer: nothing to plan", seconds, measured)
    if mixer.softmax_kernel:
        reason = "the softmax kernel has no finite features: quadratic is the only mode"
        if decode is None:
            reason += "; no decoding step (non-causal)"
        return LayerPlan(path, mixer.describe(), "quadratic", decode, costs["quadratic"], reason, seconds, measured)
    if mixer.mode != "auto":
        if for_build and mixer.mode not in valid:
            raise BuildError(f"{path}: mixer.mode 'recurrent' loops over positions in Python, so it cannot be compiled "
                             "or exported with a dynamic sequence length; use `mode: auto` or `chunk` (decoding "
                             "uses the recurrent form anyway)")
        chosen = mixer.mode
        reason = f"forced by the spec (mode: {mixer.mode})"
    elif recorded is not None:
        if recorded not in valid:
            raise BuildError(f"{path}: the recorded mode {str(recorded)[:40]!r} is not one of this mixer's modes "
                             f"({', '.join(valid)})")
        chosen = recorded
        reason = "as recorded by the run (a resumed run keeps its modes)"
    else:
        prefix = ("training " if training else "") + (f"at batch {batch}, " if batch > 1 else "")
        if measured and all(mode in measured or mode in skipped for mode in valid):
            ranked = sorted(measured, key=measured.get)
            chosen = ranked[0]
            reason = prefix + f"fastest measured on this machine ({_ms(measured[chosen])})"
            if len(ranked) > 1:
                reason += f"; next {ranked[1]}, {measured[ranked[1]] / max(measured[chosen], 1e-12):.1f}x slower"
        else:
            ranked = sorted(valid, key=lambda name: costs[name].seconds)
            chosen = ranked[0]
            reason = prefix + f"cheapest estimate ({_ms(costs[chosen].seconds)}; not calibrated)"
        if "recurrent" in costs and "recurrent" not in valid:
            reason += "; recurrent cannot be exported with a dynamic length"
    if decode is None:
        reason += "; no decoding step (" + ("the family has none)" if mixer.causal else "non-causal)")
    return LayerPlan(path, mixer.describe(), chosen, decode, costs[chosen], reason, seconds, measured, skipped or {},
                     spread=spread)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
