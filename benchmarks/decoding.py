"""Decoding speed of hybrids beside pure-recurrent models: tokens/s of the one-token step after 256 and
4096 positions, at batch 1 and 16, for the eager step (``attnspec.load``'s model), the exported
``step.pt2`` and, with ``--aot``, its AOTInductor package.

    python benchmarks/decoding.py                       # hybrid, qwen3-next-style, sliding-window-hybrid, gated-deltanet
    python benchmarks/decoding.py --aot --specs hybrid  # also step.aoti.pt2 (about a minute per spec to compile)

A recurrent block's step costs the same at every position; a softmax block's grows with the number of
cached positions (a full cache reads all of them; a sliding window at most the window). The state is
set to "position P" by its position counter: every cache slot before P counts as written (their
contents do not change the cost), so no prefill is timed. Each spec is built at max_len 4352 so that
position 4096 fits its caches. Columns are tokens/s and, last, the ratio of the speed at 4096 to the
speed at 256 for the same artifact and batch (1.00: no slowdown with position). Candidates are
interleaved, median of several rounds (these machines are noisy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import attnspec  # noqa: E402
from attnspec.compiler.export import export_step  # noqa: E402

POSITIONS = (256, 4096)
BATCHES = (1, 16)
MAX_LEN = 4352


def _state_at(model, batch: int, position: int) -> list[torch.Tensor]:
    state = list(model.init_state(batch))
    state[0] = torch.full_like(state[0], position)
    return state


def _tokens_per_second(step, state: list[torch.Tensor], steps: int) -> float:
    """Tokens/s of ``step`` held at the state's position (the step advances it in place; it is set back)."""
    token = torch.zeros(state[0].shape[0], dtype=torch.long)
    position = state[0].clone()
    with torch.no_grad():
        step(token, *state)  # warm-up
        state[0].copy_(position)
        start = time.perf_counter()
        for _ in range(steps):
            step(token, *state)
            state[0].copy_(position)  # stay at the measured position
    return token.shape[0] * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", nargs="*", default=["gated-deltanet", "hybrid", "qwen3-next-style",
                                                        "sliding-window-hybrid"])
    parser.add_argument("--aot", action="store_true", help="also the AOTInductor package of the step")
    parser.add_argument("--steps", type=int, default=16, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    table = Table(title=f"decoding tokens/s (step after P positions; {torch.get_num_threads()} threads)")
    for column in ("spec", "artifact", "batch", *(f"P={p}" for p in POSITIONS), "4096 / 256"):
        table.add_column(column, justify="right" if column not in ("spec", "artifact") else "left")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.specs:
            model = attnspec.build(ROOT / "specs" / f"{name}.yaml", f"max_len={MAX_LEN}").eval()
            artifacts = {"eager step": model.step,
                         "step.pt2": export_step(model, Path(scratch) / f"{name}.pt2").module()}
            if args.aot:
                from torch._inductor import aoti_compile_and_package, aoti_load_package

                program = torch.export.load(str(Path(scratch) / f"{name}.pt2"))
                package = aoti_compile_and_package(program, package_path=str(Path(scratch) / f"{name}.aoti.pt2"))
                artifacts["step.aoti.pt2"] = aoti_load_package(package)
            for batch in BATCHES:
                times = {(artifact, p): [] for artifact in artifacts for p in POSITIONS}
                for _ in range(args.rounds):  # interleaved rounds
                    for artifact, step in artifacts.items():
                        for p in POSITIONS:
                            times[artifact, p].append(_tokens_per_second(step, _state_at(model, batch, p), args.steps))
                for artifact in artifacts:
                    speeds = [statistics.median(times[artifact, p]) for p in POSITIONS]
                    table.add_row(name, artifact, str(batch), *(f"{s:,.0f}" for s in speeds),
                                  f"{speeds[-1] / speeds[0]:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
