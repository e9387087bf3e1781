"""The main job's wall time: a cold ``attnspec build`` of a shipped spec and ``attnspec run`` to its first token.

    python benchmarks/main_job.py                       # specs/gateloop.yaml
    python benchmarks/main_job.py --specs gateloop hybrid --rounds 5

Cold: each build gets empty attnspec and Inductor caches (no calibration, no remembered compile check, no
compiled code), as on a fresh machine. The first token is ``attnspec run DIR --tokens "1 2 3"`` as a user
types it, a fresh process each round; its floor, measured in the same rounds, is a process that only
imports torch. Run it quietly (nothing else on the cores): it measures wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTNSPEC = [sys.executable, "-m", "attnspec"]


def timed(command: list[str], environment: dict) -> float:
    """Wall seconds of ``command`` (which must succeed)."""
    start = time.perf_counter()
    subprocess.run(command, env=environment, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", nargs="+", default=["gateloop"])
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    print("| spec | cold build (s) | first token, `attnspec run` (s, median) | `import torch` alone (s, median) |")
    print("|---|---|---|---|")
    for name in arguments.specs:
        with tempfile.TemporaryDirectory() as folder:
            environment = {**os.environ, "ATTNSPEC_CACHE_DIR": f"{folder}/cache",
                           "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor"}
            build = timed([*ATTNSPEC, "build", str(ROOT / "specs" / f"{name}.yaml"), "-o", f"{folder}/build"],
                          environment)
            runs, floors = [], []
            for _ in range(arguments.rounds):  # interleaved: the machine's load moves both alike
                runs.append(timed([*ATTNSPEC, "run", f"{folder}/build", "--tokens", "1 2 3"], environment))
                floors.append(timed([sys.executable, "-c", "import torch"], environment))
        print(f"| {name} | {build:.1f} | {statistics.median(runs):.2f} | {statistics.median(floors):.2f} |")


if __name__ == "__main__":
    main()
