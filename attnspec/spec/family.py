"""What a mixer family states beyond its spec fields: the cost of each mode and the backends that run it.

A *mixer family* (gated linear attention, the delta rule, softmax attention, Scatterbrain, or a
user's own) is one IR class derived from :class:`attnspec.spec.ir.MixerComponent`. Besides its
fields and rules it answers, without torch:

* ``modes()``: the execution modes that compute it (recurrent, scan, chunk, quadratic);
* ``mode_costs(L)``: a :class:`Cost` per mode at length L (batch 1, forward), from which the
  planner estimates a time when this machine has not measured one;
* ``backends(mode)``: the :class:`Backend` s that may run a mode, in order of preference (the graph
  path torch traces, the C++ CPU kernel, the Triton kernels), and ``kernel_inputs(mode)``: what the
  mode hands them; whether a kernel applies is its one predicate in :mod:`attnspec.ops.kernels`;
* ``has_step`` and the implementation's ``init_state``/``step``: its decoding state;
* its float64 reference, ``ops/<family>/naive.py``, which the tests hold every mode to.

The planner (:mod:`attnspec.compiler.plan`) reads these facts and branches on no kind name. The
cost helpers below are shared by the built-in families; a plugin family writes its own
``mode_costs`` with :class:`Cost` (see ``examples/plugins/ema.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAC_RATE = 40e9  # multiply-adds per second a 2-core CPU sustains on these shapes (measured order)
BANDWIDTH = 10e9  # bytes per second of memory traffic
STEP_OVERHEAD = 20e-6  # seconds per sequential step (a kernel launch / Python iteration)
BYTES = 4
PAIRWISE_PASSES = 14
"""Memory passes over each element of a materialised per-channel pairwise decay ((L, L, m) in the
quadratic mode, (n, C, C, m) within chunks): the segment sum writes and reads it four times (expand,
mask, cumulative sum, mask), then the exponential, the product with q and k, and the sum over m read
and write it again, ~7 read-write passes. Measured on the MQAR-Zoology sweep's GLA and KDA (L 64,
batch 64, training), one pass made the per-channel quadratic mode look 3x cheaper than recurrence
where it was 2.3-3.7x dearer."""


@dataclass
class Cost:
    """Estimated work of one mixer at one length (all heads, batch 1, forward)."""

    macs: float
    bytes: float
    state_bytes: float
    sequential_steps: int
    step_overhead: float = STEP_OVERHEAD

    @property
    def seconds(self) -> float:
        return self.macs / MAC_RATE + self.bytes / BANDWIDTH + self.sequential_steps * self.step_overhead


@dataclass(frozen=True)
class Backend:
    """One kernel that may run a mode of a family: its name in :mod:`attnspec.ops.kernels` (whose
    predicate says when it applies, for the plan and for the op alike) and what it is."""

    name: str
    summary: str = "plain torch ops: what torch.compile and torch.export trace"


GRAPH = Backend("graph")
"""The graph path: plain torch, every device and dtype, forward and backward, exportable."""
NATIVE_CPU = Backend("native", summary="the C++ CPU chunk kernel (no backward; exported programs take the graph path)")
TRITON = Backend("triton", summary="Triton kernels registered as torch.library.triton_op (inside compiled and "
                                   "exported graphs)")


@dataclass(frozen=True)
class KernelInputs:
    """What a mode hands its kernel, as far as a kernel's applicability goes: the ``mode``, whether it
    is ``causal``, its ``decay`` ("none", "head": one per head, "channel": one per key channel) and the
    ``key_width`` of the (feature-mapped) keys, and whether the mode widens half-precision inputs to
    float32 before its kernel (``widens_half``: then a bfloat16 model's call is a float32 one). A
    family states them for a mode (:meth:`~attnspec.spec.ir.MixerComponent.kernel_inputs`); an op reads
    them off its tensors."""

    mode: str
    causal: bool
    decay: str = "none"
    key_width: int = 0
    widens_half: bool = False

    def call_dtype(self, dtype: str) -> str:
        """The dtype the kernel sees when the mixer computes in ``dtype``."""
        return "float32" if self.widens_half and dtype in ("bfloat16", "float16") else dtype


@dataclass(frozen=True)
class Regime:
    """Where and how a call runs: the ``device`` type ("cpu", "cuda"), the ``dtype`` its inputs have
    ("float32", "bfloat16", ...), whether a gradient flows back through it (``grad``) and whether it
    is being traced into an exported program (``export``)."""

    device: str
    dtype: str
    grad: bool = False
    export: bool = False


def scan_depth(L: int) -> int:
    return math.ceil(math.log2(max(L, 2)))


def linear_costs(L: int, H: int, m: int, d: int, chunk: int, per_channel: bool, complex_: bool) -> dict[str, Cost]:
    """Costs of each mode of (gated) linear attention, per the state recurrence S (m x d per head)."""
    c = 2 if complex_ else 1  # real and imaginary parts of the state
    state = H * m * d * c
    n = -(-L // chunk)
    levels = max(0, math.ceil(math.log(max(n / 128, 1), 16)))  # grouping levels of the cross-chunk scan (chunk.TOP)
    intra_decay = L * chunk * (m if per_channel else 1)
    depth = scan_depth(L)
    return {
        "recurrent": Cost(macs=H * L * m * d * 2 * c, bytes=H * L * (2 * m + d) * BYTES + L * state * BYTES,
                          state_bytes=state * BYTES, sequential_steps=L),
        "scan": Cost(macs=H * L * m * d * c * (1 + max(1, depth)), bytes=H * L * m * d * c * BYTES * (2 + 2 * depth),
                     state_bytes=state * BYTES, sequential_steps=depth),
        # the cross-chunk scan is a recurrence over chunk states: ~2 multiply-adds and ~5 passes per entry
        "chunk": Cost(macs=H * (L * chunk * (m + d) + 2 * L * m * d * c + intra_decay + 2 * n * m * d * c),
                      bytes=H * (L * chunk * (1 + (m * PAIRWISE_PASSES if per_channel else 0)) + n * m * d * c * 5
                                 + L * (2 * m + 2 * d)) * BYTES,
                      state_bytes=state * BYTES, sequential_steps=2 * levels + 6),
        "quadratic": Cost(macs=H * (L * L * (m + d) + (L * L * m if per_channel else 0)),
                          bytes=H * L * L * (2 + (m * PAIRWISE_PASSES if per_channel else 0)) * BYTES,
                          state_bytes=state * BYTES, sequential_steps=4),
    }


def noncausal_linear_cost(L: int, H: int, m: int, d: int) -> Cost:
    """Non-causal linear attention in any mode but quadratic: q (Kᵀ V), no loop and no scan."""
    return Cost(macs=H * L * m * d * 2, bytes=H * L * (2 * m + 2 * d) * BYTES, state_bytes=0, sequential_steps=3)


def softmax_cost(L: int, H: int, dk: int, dv: int) -> Cost:
    """Exact softmax attention (a fused SDPA: scores never reach memory; causal halves the work)."""
    return Cost(macs=H * L * L * (dk + dv) / 2, bytes=H * L * (2 * dk + 2 * dv) * BYTES * 4, state_bytes=0,
                sequential_steps=4)


def delta_costs(L: int, H: int, dk: int, dv: int, chunk: int, per_channel: bool) -> dict[str, Cost]:
    """Costs of each mode of the delta rule (:mod:`attnspec.ops.delta`).

    recurrent: per position kᵀS, the rank-one update and qᵀS (3 dk dv), sequentially. chunk: per
    chunk of C the UT transform (KKᵀ, a C x C triangular inverse by C/2 doublings ~ C³/3, and the
    transformed keys and values, C² (dk + dv)), then per chunk W S and the state update (~4 C dk dv)
    and the intra-chunk attention (C² (dk + dv)); the state pass across chunks is a scan of affine
    maps (dk x dk and dk x dv per chunk: ~dk² (dk + dv) per level). quadratic: the parallel form,
    an L x L triangular inverse (~L³/3) and L² (dk + dv) products.
    """
    state = H * dk * dv
    n = -(-L // chunk)
    gate = dk if per_channel else 1
    gate_passes = gate * PAIRWISE_PASSES if per_channel else 1  # a per-channel gate's pair decays are materialised
    levels = scan_depth(n)
    return {
        "recurrent": Cost(macs=H * L * dk * dv * 3, bytes=H * L * (2 * dk + 2 * dv) * BYTES + L * state * BYTES,
                          state_bytes=state * BYTES, sequential_steps=L),
        "chunk": Cost(macs=H * (L * chunk * (2 * dk + 2 * dv) + n * chunk ** 3 / 3 + 4 * L * dk * dv
                                + L * chunk * gate + n * levels * dk * dk * (dk + dv)),
                      bytes=H * (L * chunk * (2 + gate_passes) + n * dk * (dk + dv) * (2 + 2 * levels)
                                 + L * (3 * dk + 3 * dv)) * BYTES,
                      state_bytes=state * BYTES, sequential_steps=levels + 8),
        "quadratic": Cost(macs=H * (L ** 3 / 3 + L * L * (2 * dk + dv) + L * L * gate),
                          bytes=H * L * L * (3 + gate_passes) * BYTES, state_bytes=state * BYTES, sequential_steps=6),
    }


__all__ = ["BANDWIDTH", "BYTES", "Backend", "Cost", "GRAPH", "KernelInputs", "MAC_RATE",
           "NATIVE_CPU", "Regime", "STEP_OVERHEAD", "TRITON", "delta_costs", "linear_costs", "noncausal_linear_cost",
           "softmax_cost"]
