"""What every shipped spec builds to, as one JSON document: for a refactoring to prove "no behaviour
change", run it before and after and compare the two files (they must be equal).

For each spec in ``specs/`` (and the example plugins' specs): the resolved spec, the parameter count
and a SHA-256 of every parameter and buffer (names, dtypes, shapes, bytes), the cost model's plans
(inference at ``max_len``, training at 256 and batch 8: modes, backends and estimated costs; no
calibration is read, so the plan does not depend on this machine's measurements), the decoding
state's shapes, and the float64 verification (every mode against the reference: exact differences,
which are deterministic on one machine and one torch).

    python tools/fingerprint.py > before.json        # on the old commit
    python tools/fingerprint.py > after.json         # on the new one
    cmp before.json after.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def fingerprint(path: Path) -> dict:
    from attnspec.compiler.lower import lower
    from attnspec.compiler.plan import Calibration, plan_spec
    from attnspec.compiler.verify import verify_model
    from attnspec.spec import load_spec, spec_to_data

    spec = load_spec(path)
    empty = Calibration.empty()
    inference = plan_spec(spec, for_build=True, calibration=empty)
    training = plan_spec(spec, min(256, spec.max_len), batch=8, training=True, calibration=empty)
    torch.manual_seed(0)
    model = lower(spec, inference)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    state = [[list(t.shape), str(t.dtype)] for t in model.init_state(1)] if model.has_step else []
    report = verify_model(model)
    return {"spec": spec_to_data(spec, minimal=False),
            "parameters": sum(p.numel() for p in model.parameters()),
            "weights_sha256": digest.hexdigest(),
            "plan_inference": inference.to_json(), "plan_training": training.to_json(),
            "decode_limit": model.decode_limit if model.has_step else None, "decode_state": state,
            "verify": [[row.layer, row.mode, row.abs_diff, row.rel_diff, row.ok] for row in report.rows]}


def main() -> None:
    torch.set_num_threads(1)  # the verification's sums in one fixed order
    specs = sorted((ROOT / "specs").glob("*.yaml"))
    out = {path.name: fingerprint(path) for path in specs}
    json.dump(out, sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
