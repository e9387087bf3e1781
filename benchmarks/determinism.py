"""What "the same run" means: one training run repeated at one intra-op thread, and again at two.

    python benchmarks/determinism.py                 # GLA-style linear attention on MQAR, 300 steps
    python benchmarks/determinism.py --steps 1000

Each run is a fresh process (the thread count is read at start) training the same spec, task, seed and
configuration with the planner's cost model (`planning: model`, the default: no timing enters the plan).
The table gives each run's planned modes, test accuracy and loss, and whether its final weights are
bit-identical to the first run's, with the largest difference otherwise. What it shows on a CPU: repeated
at the same thread count the weights are bit-identical; at another thread count the plan and the data are
the same but the kernels sum in another order, so the weights round differently and the results move.
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

RUN = r"""
import json, torch
from pathlib import Path
from safetensors.torch import save_file
import attnspec
run = attnspec.train({spec!r}, overrides={overrides!r}, task="mqar", task_overrides={task!r}, steps={steps},
                     batch_size=32, lr=3e-3, eval_every=0, test_examples=256, seed=0, output={output!r})
save_file({{name: tensor.contiguous() for name, tensor in run.model.state_dict().items()}}, {weights!r})
result = json.loads((Path({output!r}) / "result.json").read_text())
print(json.dumps({{"threads": torch.get_num_threads(), "modes": result["plan"]["modes"],
                  "accuracy": run.metrics["accuracy"], "loss": run.metrics["loss"]}}))
"""

SPEC = str(ROOT / "specs" / "linear-elu.yaml")
OVERRIDES = ["d_model=64", "layers[0].repeat=2", "max_len=64", "input.vocab_size=128",
             "blocks[*].mixer={kind: linear, heads: 2, feature_map: identity, normalize: false, group_norm: true, "
             "transition: {kind: data, magnitude: sigmoid, per: channel}}"]
TASK = ["seq_len=64", "vocab_size=128", "num_kv_pairs=8"]


def run_once(threads: int, steps: int, folder: Path) -> dict:
    """One training run in a fresh process at ``threads`` intra-op threads: its report and final weights."""
    from safetensors.torch import load_file

    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    code = RUN.format(spec=SPEC, overrides=OVERRIDES, task=TASK, steps=steps, output=str(folder / "run"),
                      weights=str(folder / "weights.safetensors"))
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["weights"] = load_file(folder / "weights.safetensors")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runs = []
        for index, threads in enumerate((1, 1, 2)):
            (Path(folder) / str(index)).mkdir()
            runs.append(run_once(threads, arguments.steps, Path(folder) / str(index)))
    first = runs[0]["weights"]
    print(f"{arguments.steps} steps; planned modes: {runs[0]['modes']}")
    print("| run | threads | planned modes as the first | test accuracy | test loss | weights against the first run's |")
    print("|---|---|---|---|---|---|")
    for index, run in enumerate(runs):
        differences = [float((run["weights"][name].double() - tensor.double()).abs().max()) for name, tensor in first.items()]
        same = all(run["weights"][name].equal(tensor) for name, tensor in first.items())
        verdict = "bit-identical" if same else f"differ, largest {max(differences):.2e}"
        print(f"| {index + 1} | {run['threads']} | {run['modes'] == runs[0]['modes']} | {run['accuracy']:.4f} | "
              f"{run['loss']:.4f} | {verdict} |")


if __name__ == "__main__":
    main()
