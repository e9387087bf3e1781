"""Memory per process of distributed training: DDP against FSDP (``parallel: fsdp``), with and without
activation checkpointing, on 2 CPU processes (gloo).

    python benchmarks/sharding.py                     # ~30M parameters, 3 steps each (a few minutes)
    python benchmarks/sharding.py --width 768 --blocks 12

The model is the softmax spec (``specs/softmax-transformer.yaml``, learned positions) at ``--width`` and
``--blocks``, vocabulary 8192, trained on ``lm``-shaped MQAR batches of length 256 (batch 8: 4 per
process) for 3 steps in float32 with AdamW. Each configuration is one ``torchrun`` of 2 processes
at 1 thread each; each process reports the peak of the memory its training allocated and still held
(glibc's ``mallinfo2``: bytes handed out and not freed, sampled every 2 ms, less what it held before
training: its share of the model, gradients and AdamW moments, DDP's buckets, gathered blocks,
activations), and its peak RSS (``ru_maxrss``, which also counts torch's modules and freed pages the
allocator keeps: on the CPU it barely moves with what training holds). Beside them, the model state a
process holds in theory: 16 bytes a parameter (weight, gradient, two moments) under DDP, half under
FSDP on 2 processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = """
import ctypes, json, os, resource, sys, threading, time
import torch
from attnspec.training.loop import train


class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2


def live_mb():  # bytes malloc has handed out and not had back (heap and mapped chunks): tensors, not freed pages
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2 ** 20


peak, running = [0.0], [True]


def sample():
    while running[0]:
        peak[0] = max(peak[0], live_mb())
        time.sleep(0.002)


spec, overrides, config = json.loads(sys.argv[1])
before = live_mb()
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
run = train(spec, config, overrides=overrides)
seconds = time.perf_counter() - start
running[0] = False
parameters = sum(p.numel() for p in run.model.parameters())
print(json.dumps({"rank": int(os.environ.get("RANK", 0)), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                  / 1024, "live_mb": peak[0] - before, "parameters": parameters, "seconds": seconds}))
"""


def measure(width: int, blocks: int, parallel: str, recompute: str, work: Path) -> list[dict]:
    """One torchrun of 2 processes: each rank's report (see the module doc)."""
    overrides = [f"d_model={width}", f"layers[0].repeat={blocks}", "input.vocab_size=8192", "max_len=256",
                 "position=learned"]
    config = {"task": {"kind": "mqar", "seq_len": 256, "vocab_size": 8192, "num_kv_pairs": 8}, "steps": 3,
              "batch_size": 8, "eval_every": 0, "test_examples": 8, "parallel": parallel,
              "activation_checkpointing": recompute, "precision": "float32", "compile": "off"}
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(driver), json.dumps([str(ROOT / "specs" / "softmax-transformer.yaml"), overrides,
                                                      config])], capture_output=True, text=True, env=environment)
    if result.returncode:
        raise SystemExit(f"{parallel}/{recompute} failed:\n{result.stderr[-3000:]}")
    return sorted((json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")),
                  key=lambda report: report["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnspec-sharding-") as work:
        for parallel in ("ddp", "fsdp"):
            for recompute in ("none", "blocks"):
                rows.append((parallel, recompute, measure(args.width, args.blocks, parallel, recompute, Path(work))))
    parameters = rows[0][2][0]["parameters"]
    print(f"\nsoftmax spec, width {args.width}, {args.blocks} blocks, {parameters / 1e6:.1f}M parameters, 2 processes "
          f"(gloo, 1 thread each), L 256, 4 sequences a process, float32")
    print(f"{'parallel':9} {'recompute':10} {'training peak MB (rank 0, 1)':>29} {'vs ddp/none':>12} "
          f"{'model state MB in theory':>25} {'peak RSS MB (rank 0, 1)':>24} {'seconds':>8}")
    baseline = max(report["live_mb"] for report in rows[0][2])
    for parallel, recompute, reports in rows:
        peak = max(report["live_mb"] for report in reports)
        state = 16 * parameters / 2 ** 20 / (2 if parallel == "fsdp" else 1)
        live = ", ".join(f"{report['live_mb']:.0f}" for report in reports)
        rss = ", ".join(f"{report['rss_mb']:.0f}" for report in reports)
        print(f"{parallel:9} {recompute:10} {live:>29} {peak / baseline:12.2f} {state:25.0f} {rss:>24} "
              f"{max(report['seconds'] for report in reports):8.1f}")
    print(json.dumps([{"parallel": p, "recompute": r, "reports": reports} for p, r, reports in rows]))


if __name__ == "__main__":
    main()
