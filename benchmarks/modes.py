"""Speed of the modes of causal gated linear attention against PyTorch's causal SDPA, and of the delta rule.

    python benchmarks/modes.py                 # the full table (about 25 minutes on 2 cores)
    python benchmarks/modes.py --quick         # L = 256 and 2048 only
    python benchmarks/modes.py --throughput    # only the chunk mode's GFLOP/s and the decode step
    python benchmarks/modes.py --delta         # only the delta rule's table

The delta rule's table (Gated DeltaNet: one gate per head, unit-norm keys, beta in [0, 1]) times
its chunk, recurrent and quadratic modes, forward and forward+backward, eager, at L 1K to 16K, with
gated linear attention's graph-path chunk mode at the same sizes as the baseline; the candidates of
a length are measured in interleaved rounds (these machines drift) and the medians compared.

For B=1, H=8, Dk=Dv=64, float32 and a per-head data-dependent decay, it times forward and
forward+backward of every mode, eager and compiled (torch.compile, dynamic=True), and
``scaled_dot_product_attention(is_causal=True)`` at the same sizes, all in one run; it prints
the times and the ratio SDPA time / mode time (higher is faster). It also prints the chunk
mode's achieved GFLOP/s (useful multiply-adds only: the causal half of each chunk's scores
and values, plus the state write and read) against a 2048^3 float32 matrix product measured
in the same run, and the one-token decoding step time after prefixes of 256 and 16384.

Without gradients the chunk mode runs on its CPU kernel (``attnspec/ops/linear/backends/native.py``); the rows
and columns marked "graph" force the graph path (what runs when gradients are needed, and in
exported programs) in the same run, so the two can be compared.

Allocator: by default glibc malloc serves blocks over its mmap threshold (which rises to at
most 32 MiB) with fresh mappings and returns the top of the heap over its trim threshold to the
OS, so a compiled graph whose intermediates are ~16 MiB page-faults and zero-fills them again on
every call (perf: ~18% of the chunk mode's time in the kernel's page-fault path, and run-to-run
swings of up to 2x). The benchmark therefore first asks glibc (``mallopt``) to keep freed
memory, as PyTorch's CPU tuning guide recommends (there: jemalloc or tcmalloc);
``--glibc-defaults`` measures without it. The header says which was used. The same settings can
be given to any program through ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824``.

Modes that would not fit or finish are reported as n/a with the reason: quadratic (L x L
scores) beyond 4096, scan (per-position states, L x Dk x Dv per head) beyond 2048, and the eager
recurrent mode (a Python loop per position) beyond 2048; recurrent is never compiled (its
loop would be unrolled per length).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from attnspec.ops.linear.backends import native
from attnspec.ops.linear import Decay, PairState, linear_attention, recurrent_step

B, H, D = 1, 8, 64
MAX_LENGTH = 16384
LIMITS = {"quadratic": 4096, "scan": 2048, "recurrent": 2048}


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def inputs(L: int, grad: bool = False):
    generator = torch.Generator().manual_seed(L)
    q = torch.randn(B, H, L, D, generator=generator).requires_grad_(grad)
    k = torch.randn(B, H, L, D, generator=generator).requires_grad_(grad)
    v = torch.randn(B, H, L, D, generator=generator).requires_grad_(grad)
    log_a = F.logsigmoid(torch.randn(B, H, L, generator=generator) + 4).requires_grad_(grad)
    return q, k, v, log_a


def gla(mode: str):
    def run(q, k, v, log_a):
        return linear_attention(q, k, v, log_a, mode=mode, chunk_size=64, max_length=MAX_LENGTH)
    return run


def graph_only(fn):
    """``fn`` with the chunk mode's CPU kernel switched off (compiled code retraces for it)."""
    def run(*args):
        with native.disabled():
            return fn(*args)
    return run


def sdpa(q, k, v, log_a):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def measure(fn, L: int, backward: bool, repeats: int) -> float:
    if not backward:
        args = inputs(L)
        with torch.no_grad():
            return timed(lambda: fn(*args), repeats)
    args = inputs(L, grad=True)

    def step():
        out = fn(*args)
        out.sum().backward()
        for t in args:
            t.grad = None
    return timed(step, repeats)


def chunk_useful_flops(L: int, C: int = 64) -> float:
    """2 x useful multiply-adds of the chunk algorithm: causal half of C x C scores and values, state write, read."""
    return 2 * B * H * (L * C / 2 * (D + D) + 2 * L * D * D)


def matmul_gflops(repeats: int) -> float:
    a = torch.randn(2048, 2048)
    return 2 * 2048 ** 3 / timed(lambda: a @ a, repeats) / 1e9


def keep_freed_memory() -> bool:
    """Ask glibc malloc to keep freed blocks (big blocks from the heap, not mmap; no trimming). False if not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**30))
    except (OSError, AttributeError):
        return False


def decode_step(prefix: int):
    """One recurrent step after a prefix, as a callable: the state is (B, H, Dk, Dv) whatever the prefix."""
    q, k, v, log_a = inputs(prefix)
    with torch.no_grad():
        _, state = linear_attention(q, k, v, log_a, mode="chunk", return_state=True, max_length=MAX_LENGTH)
    pair = PairState(state, None)
    q1, k1, v1 = q[:, :, -1], k[:, :, -1], v[:, :, -1]
    decay = Decay(log_a[:, :, -1].unsqueeze(-1), None)  # (B, H, 1): one decay per head

    def step():
        with torch.no_grad():
            return recurrent_step(q1, k1, v1, decay, pair)
    return step


def decode_step_seconds(prefixes: tuple[int, ...], repeats: int, rounds: int = 5) -> list[float]:
    """Median step time per prefix, measured in alternating rounds so that drift hits every prefix alike."""
    steps = [decode_step(prefix) for prefix in prefixes]
    samples = [[] for _ in prefixes]
    for _ in range(rounds):
        for step, times in zip(steps, samples):
            times.append(timed(step, repeats * 20))
    return [statistics.median(times) for times in samples]


DELTA_LIMITS = {"recurrent": 4096, "quadratic": 2048}
"""The delta rule's modes that would not finish in minutes beyond these lengths (recurrent: a Python
loop per position, about 13 s forward+backward at 4096; quadratic: L x L solves)."""


def delta_inputs(L: int, grad: bool):
    q, k, v, log_a = inputs(L)
    generator = torch.Generator().manual_seed(L + 1)
    beta = torch.rand(B, H, L, generator=generator)
    return [t.detach().requires_grad_(grad) for t in (q, F.normalize(k, dim=-1), v, beta, log_a)]


def delta_table(lengths: list[int], rounds: int, console: Console) -> None:
    """The delta rule's modes and gated linear attention's graph-path chunk mode, interleaved per length."""
    from attnspec.ops.delta import delta_rule

    candidates = {"GLA chunk (graph)": lambda q, k, v, beta, log_a: linear_attention(q, k, v, log_a, mode="chunk")}
    for mode in ("chunk", "recurrent", "quadratic"):
        candidates[f"delta {mode}"] = (lambda mode: lambda q, k, v, beta, log_a: delta_rule(
            q, k, v, beta, log_a, mode=mode, chunk_size=64, max_length=MAX_LENGTH))(mode)
    for backward in (False, True):
        table = Table(title=f"delta rule, {'forward + backward' if backward else 'forward'}, eager: ms "
                            "(x) = GLA chunk time / this time")
        table.add_column("mode")
        for L in lengths:
            table.add_column(f"L={L}", justify="right")
        cells: dict[str, list[str]] = {name: [] for name in candidates}
        for L in lengths:
            runnable = {name: fn for name, fn in candidates.items()
                        if L <= DELTA_LIMITS.get(name.removeprefix("delta "), L)}
            samples: dict[str, list[float]] = {name: [] for name in runnable}
            args = delta_inputs(L, backward)
            for _ in range(rounds):  # interleaved: a slow moment hits every candidate alike
                for name, fn in runnable.items():
                    samples[name].append(_delta_seconds(fn, args, backward))
            medians = {name: statistics.median(times) for name, times in samples.items()}
            for name in candidates:
                if name not in medians:
                    cells[name].append("n/a")
                else:
                    base = medians["GLA chunk (graph)"]
                    cells[name].append(f"{medians[name] * 1e3:.0f} ({base / medians[name]:.2f}x)")
        for name, row in cells.items():
            table.add_row(name, *row)
        console.print(table)


def _delta_seconds(fn, args, backward: bool) -> float:
    with native.disabled(), torch.set_grad_enabled(backward):
        start = time.perf_counter()
        out = fn(*args)
        if backward:
            out.sum().backward()
            for t in args:
                t.grad = None
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only L = 256 and 2048")
    parser.add_argument("--throughput", action="store_true",
                        help="only the chunk mode's throughput table and the decode step (about 3 minutes)")
    parser.add_argument("--delta", action="store_true", help="only the delta rule's table")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="keep glibc's allocator defaults (freed big blocks go back to the OS; see the docstring)")
    args = parser.parse_args()
    allocator = "glibc defaults" if args.glibc_defaults else (
        "glibc, freed memory kept (mallopt)" if keep_freed_memory() else "default (not glibc)")
    torch.manual_seed(0)
    torch._dynamo.config.cache_size_limit = 64  # one compiled function per mode, traced per grad mode and kernel switch
    lengths = [256, 2048] if args.quick else [256, 1024, 2048, 4096, 8192, 16384]
    console = Console(width=150)
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, allocator: {allocator}; B={B} H={H} "
                  f"Dk=Dv={D} float32, per-head decay; times in ms" + ("" if args.delta else
                                                                         ", (x) = SDPA time / this time"))
    # (name, how, function, forward only). Without gradients the chunk mode runs on its CPU kernel;
    # "graph" rows force the graph path, which is also what every fwd+bwd chunk row runs.
    compiled = {mode: torch.compile(gla(mode), fullgraph=True, dynamic=True) for mode in ("chunk", "scan", "quadratic")}
    variants = [("sdpa", "eager", sdpa, False), ("chunk", "eager", gla("chunk"), False),
                ("chunk graph", "eager", graph_only(gla("chunk")), True)]
    for mode in ("scan", "quadratic", "recurrent"):
        variants.append((mode, "eager", gla(mode), False))
    variants += [("chunk", "compiled", compiled["chunk"], False),
                 ("chunk graph", "compiled", graph_only(compiled["chunk"]), True),
                 ("scan", "compiled", compiled["scan"], False), ("quadratic", "compiled", compiled["quadratic"], False),
                 ("sdpa", "compiled", torch.compile(sdpa, fullgraph=True, dynamic=True), False)]

    if args.delta:
        delta_table([1024, 2048, 4096, 8192, 16384] if not args.quick else [1024, 4096], max(3, args.repeats), console)
        return
    for backward in (False, True):
        if args.throughput:
            break
        table = Table(title="forward + backward (the chunk mode on its graph path)" if backward else
                      "forward (chunk: the CPU kernel; chunk graph: the graph path)")
        table.add_column("mode")
        for L in lengths:
            table.add_column(f"L={L}", justify="right")
        baseline = {L: measure(sdpa, L, backward, args.repeats) for L in lengths}
        for name, how, fn, forward_only in variants:
            if backward and forward_only:
                continue
            cells = []
            for L in lengths:
                if name in LIMITS and L > LIMITS[name]:
                    cells.append("n/a")
                    continue
                seconds = baseline[L] if (name, how) == ("sdpa", "eager") else measure(fn, L, backward, args.repeats)
                cells.append(f"{seconds * 1e3:.1f} ({baseline[L] / seconds:.1f}x)")
            table.add_row(f"{name} {how}", *cells)
        console.print(table)

    # The matmul baseline is measured again right before each length: these machines' speed drifts
    # within a run (up to 1.5x seen), and the percentage must compare like with like.
    table = Table(title="chunk mode throughput (forward; useful multiply-adds) vs a 2048^3 float32 matmul measured "
                        "just before")
    for column in ("L", "matmul GFLOP/s", "kernel eager GFLOP/s", "kernel compiled GFLOP/s", "% of matmul",
                   "graph compiled GFLOP/s", "% of matmul "):
        table.add_column(column, justify="right")
    for L in lengths:
        flops = chunk_useful_flops(L)
        rate = matmul_gflops(args.repeats)
        eager = flops / measure(gla("chunk"), L, False, args.repeats) / 1e9
        kernel = flops / measure(compiled["chunk"], L, False, args.repeats) / 1e9
        graph = flops / measure(graph_only(compiled["chunk"]), L, False, args.repeats) / 1e9
        table.add_row(str(L), f"{rate:.0f}", f"{eager:.1f}", f"{kernel:.1f}", f"{100 * kernel / rate:.0f}%",
                      f"{graph:.1f}", f"{100 * graph / rate:.0f}%")
    console.print(table)

    if not args.throughput:
        delta_table([1024, 2048, 4096, 8192, 16384], max(3, args.repeats), console)
    short, long = decode_step_seconds((256, 16384), args.repeats)
    console.print(f"decode step: prefix 256 {short * 1e6:.1f} us, prefix 16384 {long * 1e6:.1f} us, "
                  f"ratio {long / short:.2f}")


if __name__ == "__main__":
    main()
