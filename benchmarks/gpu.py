"""The GPU tables: attnspec's chunk mode against flash-linear-attention (FLA) and flash SDPA, a training
step of a shipped spec, and decoding. Needs a CUDA device; FLA is optional (its columns then say
"n/a").

    python benchmarks/gpu.py                          # B 8, H 16, D 64 and 128, L 1K..32K, bf16
    python benchmarks/gpu.py --lengths 1024 4096 --dims 64 --tables kernels
    python benchmarks/gpu.py --tables train decode --spec specs/retnet.yaml

Table 1 (kernels), per (D, L), forward and forward+backward, median milliseconds of CUDA-event-timed
calls after warm-up, the candidates interleaved call by call (round-robin) so clock and thermal drift
hit all alike:
  * ``triton``   attnspec's Triton chunk kernels (:mod:`attnspec.ops.linear.backends.triton`), per-head decay;
  * ``compiled`` the same op inside ``torch.compile(fullgraph=True)`` (what a compiled model runs);
  * ``graph``    attnspec's graph path of the chunk mode (plain PyTorch ops) under ``torch.compile``;
  * ``fla``      FLA's ``chunk_simple_gla`` (per-head decay), the reference for the ratios;
  * ``fla_gla``  FLA's ``chunk_gla`` (per-channel decay), against attnspec's graph path with a
    per-channel decay (``graph_gla``; the Triton kernels take per-head decays only);
  * ``sdpa``     ``scaled_dot_product_attention(is_causal=True)`` (flash), no decay.
Ratios are time / FLA's time (< 1 is faster than FLA). TFLOP/s counts the dense chunk work
(B H L (2 C (K + V) + 4 K V) forward, C = 64; SDPA: 2 B H L^2 D, causal half) with a backward of 2x
(chunk) and 2.5x (SDPA) the forward, against the device's bf16 matmul rate measured in this run.

Table 2 (train): one optimiser step of the spec's model on random tokens, bf16 autocast, eager and
compiled: tokens/s and peak memory. Table 3 (decode): tokens/s of ``model.step`` at batch 1 and 64.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from attnspec.ops.linear.chunk import _chunked  # noqa: E402
from attnspec.ops.linear.common import Decay  # noqa: E402

CHUNK = 64


def fla_ops():
    """FLA's chunk_simple_gla and chunk_gla, or (None, None) when FLA is not installed."""
    try:
        from fla.ops.gla import chunk_gla
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None, None
    return chunk_simple_gla, chunk_gla


def _fla_call(op, q, k, v, g, scale):
    """FLA in its (B, T, H, D) layout, whatever its version's keyword for the layout."""
    kwargs = {"head_first": False} if "head_first" in inspect.signature(op).parameters else {}
    return op(q=q, k=k, v=v, g=g, scale=scale, **kwargs)[0]


def matmul_tflops(size: int = 8192, repeats: int = 20) -> float:
    """The device's bf16 dense matmul rate (TFLOP/s), measured: median of ``repeats`` size^3 products."""
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    times = interleaved({"mm": lambda: a @ b}, repeats)["mm"]
    return 2 * size ** 3 / times / 1e12


def interleaved(calls: dict, repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each callable, calls interleaved round-robin, timed by CUDA events."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def kernel_candidates(B, H, L, D, backward: bool) -> dict:
    """Callables for one (D, L) cell; each returns after launching its work (timing synchronises)."""
    from attnspec.ops.linear.backends import triton as triton_chunk

    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (make(B, L, H, D) for _ in range(3))  # FLA's layout; attnspec reads it through strided views
    g = -torch.rand(B, L, H, device="cuda") * 0.1  # per-head log decays (float32)
    gk = (-torch.rand(B, L, H, D, device="cuda") * 0.1)  # per-channel
    scale = D ** -0.5
    leaves = [q, k, v, g, gk]
    for t in leaves:
        t.requires_grad_(backward)
    heads = lambda t: t.transpose(1, 2)  # noqa: E731  (B, L, H, D) -> (B, H, L, D), a view

    def attnspec_triton():
        return triton_chunk.chunked_linear_attention(heads(q), heads(k), heads(v), heads(g), None, None, None, scale,
                                                     CHUNK)[0]

    def attnspec_graph(decay):  # what linear_attention runs off the Triton path: bf16 inputs computed in float32
        return _chunked(heads(q).float() * scale, heads(k).float(), heads(v).float(), decay, None, CHUNK, L)[0]

    compiled_triton = torch.compile(attnspec_triton, fullgraph=True)
    graph = torch.compile(lambda: attnspec_graph(Decay(heads(g).unsqueeze(-1), None)), fullgraph=True)
    graph_gla = torch.compile(lambda: attnspec_graph(Decay(heads(gk), None)), fullgraph=True)
    calls = {"triton": attnspec_triton, "compiled": compiled_triton, "graph": graph, "graph_gla": graph_gla,
             "sdpa": lambda: F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)}
    simple_gla, gla = fla_ops()
    if simple_gla is not None:
        calls["fla"] = lambda: _fla_call(simple_gla, q, k, v, g, scale)
        calls["fla_gla"] = lambda: _fla_call(gla, q, k, v, gk, scale)
    if not backward:
        return {name: _no_grad(call) for name, call in calls.items()}
    grad = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    return {name: _with_backward(call, grad, leaves) for name, call in calls.items()}


def output_errors(candidates: dict) -> dict[str, float]:
    """Each gated forward candidate's max error relative to the largest entry of the graph path's output
    (float32 arithmetic on the same bf16 inputs); SDPA (no decay) and the per-channel pair are left out."""
    truth = candidates["graph"]().float()
    errors = {}
    for name in ("triton", "compiled", "fla"):
        if name in candidates:
            out = candidates[name]().float()
            out = out if out.shape == truth.shape else out.transpose(1, 2)  # FLA returns (B, L, H, D)
            errors[name] = ((out - truth).abs().max() / truth.abs().max()).item()
    return errors


def _no_grad(call):
    def run():
        with torch.no_grad():
            return call()
    return run


def _with_backward(call, grad, leaves):
    def run():
        out = call()
        incoming = grad if out.shape == grad.shape else grad.transpose(1, 2)  # FLA returns (B, L, H, D)
        out.backward(incoming.to(out.dtype))
        for t in leaves:
            t.grad = None
    return run


def kernel_table(console: Console, B: int, H: int, dims, lengths, repeats: int) -> None:
    peak = matmul_tflops()
    progress = Console(stderr=True, highlight=False)
    console.print(f"bf16 matmul rate of this device, measured: {peak:.0f} TFLOP/s")
    for backward in (False, True):
        table = Table(title=f"{'forward+backward' if backward else 'forward'}, bf16, B={B} H={H}: ms (ratio to FLA "
                            f"chunk_simple_gla) [TFLOP/s, % of matmul rate]")
        names = ["triton", "compiled", "graph", "fla", "graph_gla", "fla_gla", "sdpa"]
        for column in ["D", "L", *names]:
            table.add_column(column, justify="right")
        for D in dims:
            for L in lengths:
                try:
                    candidates = kernel_candidates(B, H, L, D, backward)
                    if not backward:  # a time means nothing for a wrong answer: check the outputs first
                        progress.print(f"fwd D={D} L={L} max error / max|out| against graph (float32): "
                                       + ", ".join(f"{name} {error:.1e}" for name, error
                                                   in output_errors(candidates).items()))
                    times = interleaved(candidates, repeats)
                except torch.cuda.OutOfMemoryError:
                    table.add_row(str(D), str(L), *["OOM"] * len(names))
                    torch.cuda.empty_cache()
                    continue
                factor = 3.0 if backward else 1.0
                chunk_flops = B * H * L * (2 * CHUNK * (D + D) + 4 * D * D) * factor
                sdpa_flops = 2 * B * H * L * L * D * (3.5 if backward else 1.0)
                reference = times.get("fla")
                cells = []
                for name in names:
                    if name not in times:
                        cells.append("n/a")
                        continue
                    base = times.get("fla_gla") if name == "graph_gla" else reference
                    ratio = f" ({times[name] / base:.2f})" if base else ""
                    flops = sdpa_flops if name == "sdpa" else chunk_flops
                    rate = flops / times[name] / 1e12
                    cells.append(f"{times[name] * 1e3:.2f}{ratio} [{rate:.0f}, {100 * rate / peak:.0f}%]")
                table.add_row(str(D), str(L), *cells)
                # each row as it comes too, so a run cut short still leaves what it measured
                progress.print(f"{'fwd+bwd' if backward else 'fwd'} D={D} L={L}: " + " | ".join(
                    f"{name} {cell}" for name, cell in zip(names, cells)))
                torch.cuda.empty_cache()
        console.print(table)


def train_table(console: Console, spec_path: Path, batch: int, length: int, steps: int) -> None:
    import attnspec

    table = Table(title=f"training step of {spec_path.name}, bf16 autocast, B={batch} L={length}")
    for column in ("compile", "tokens/s", "peak memory (GiB)"):
        table.add_column(column, justify="right")
    for compiled in (False, True):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        seconds = interleaved({"step": _training_step(attnspec.build(spec_path, f"max_len={max(length, 2)}",
                                                                     device="cuda"), compiled, batch, length)}, steps)
        table.add_row("on" if compiled else "off", f"{batch * length / seconds['step']:,.0f}",
                      f"{torch.cuda.max_memory_allocated() / 2 ** 30:.2f}")
    console.print(table)


def _training_step(model, compiled: bool, batch: int, length: int):
    """One AdamW step of ``model`` on random tokens (B, L) under bf16 autocast, as a callable."""
    model.train()
    forward = torch.compile(model) if compiled else model
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.spec.input.vocab_size, (batch, length + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)

    return step


def decode_table(console: Console, spec_path: Path, steps: int) -> None:
    import attnspec

    model = attnspec.build(spec_path, device="cuda")
    if not model.has_step:
        console.print(f"{spec_path.name} has no decoding step")
        return
    table = Table(title=f"decoding with model.step, {spec_path.name}")
    for column in ("batch", "eager tokens/s", "compiled tokens/s"):
        table.add_column(column, justify="right")
    compiled_step = torch.compile(model.step, fullgraph=True)
    for batch in (1, 64):
        cells = []
        for step in (model.step, compiled_step):
            state = model.init_state(batch)
            token = torch.zeros(batch, dtype=torch.long, device="cuda")

            def advance(step=step):
                nonlocal state
                with torch.no_grad():
                    _, *state = step(token, *state)

            seconds = interleaved({"step": advance}, steps)["step"]
            cells.append(f"{batch / seconds:,.0f}")
        table.add_row(str(batch), *cells)
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", nargs="*", default=["kernels", "train", "decode"],
                        choices=["kernels", "train", "decode"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dims", type=int, nargs="*", default=[64, 128])
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "retnet.yaml")
    parser.add_argument("--train-length", type=int, default=2048)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    import triton

    console = Console()
    simple_gla, _ = fla_ops()
    fla_version = "not installed"
    if simple_gla is not None:
        import fla
        fla_version = getattr(fla, "__version__", "unknown")
    console.print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__} · "
                  f"FLA {fla_version}")
    if "kernels" in args.tables:
        kernel_table(console, args.batch, args.heads, args.dims, args.lengths, args.repeats)
    if "train" in args.tables:
        train_table(console, args.spec, args.batch, args.train_length, args.repeats)
    if "decode" in args.tables:
        decode_table(console, args.spec, 50)


if __name__ == "__main__":
    main()
