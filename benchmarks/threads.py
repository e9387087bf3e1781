"""Intra-op threads under oversubscription: the time of one training step of a small model at 1 and 2
PyTorch threads, with 0, 1 and 2 other processes spinning on the cores, with OpenMP's default wait
policy and with ``OMP_WAIT_POLICY=PASSIVE``.

    python benchmarks/threads.py              # softmax-transformer and gated-deltanet, d_model 128, L 256, B 8
    python benchmarks/threads.py --rounds 5

Each configuration is a fresh process (thread settings are read at start), the configurations are
interleaved round by round (these machines are noisy) and the table shows the median step time and its
ratio to the same spec at 1 thread without load measured in the same run. The load is a pure-Python
busy loop per process (what another training run or a sweep worker does to a core).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEP = r"""
import json, sys, time, torch
sys.path.insert(0, {root!r})
import attnspec
torch.manual_seed(0)
model = attnspec.build({spec!r}, "d_model=128", "max_len=256", "input.vocab_size=512")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 512, (8, 256))
times = []
for i in range(7):
    start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    times.append(time.perf_counter() - start)
print(json.dumps(sorted(times[2:])[len(times[2:]) // 2]))
"""


def step_seconds(spec: Path, threads: int, passive: bool) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, "-c", STEP.format(root=str(ROOT), spec=str(spec))], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=["softmax-transformer", "gated-deltanet"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configs = [(spec, threads, load, passive) for spec in args.specs for load in (0, 1, 2)
               for threads in (1, 2) for passive in (False, True)]
    results: dict[tuple, list[float]] = {config: [] for config in configs}
    for _ in range(args.rounds):
        for spec, threads, load, passive in configs:
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
            try:
                time.sleep(0.2)
                results[(spec, threads, load, passive)].append(
                    step_seconds(ROOT / "specs" / f"{spec}.yaml", threads, passive))
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
    print(f"{os.cpu_count()} cores, torch threads and load as listed; median step seconds over {args.rounds} rounds "
          "(each the median of 5 steps)")
    print("| spec | other busy processes | threads | OMP_WAIT_POLICY | step (s) | vs 1 thread, no load |")
    print("|---|---|---|---|---|---|")
    for spec, threads, load, passive in configs:
        median = statistics.median(results[(spec, threads, load, passive)])
        base = statistics.median(results[(spec, 1, 0, False)])
        print(f"| {spec} | {load} | {threads} | {'PASSIVE' if passive else 'default'} | {median:.3f} | "
              f"{median / base:.2f}x |")


if __name__ == "__main__":
    main()
