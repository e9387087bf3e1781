"""The hostile-input suite for sharded checkpoints: a real FSDP checkpoint of 2 processes, damaged as the
audit and a stranger would, resumed with ``train(..., resume=True)`` alone (its pieces put together), on
2 processes (each reads its own shard's pieces, the checkpoint's own world size) and on 3 (another
sharding of the same tensors), all under ``torchrun``.

Seeded: the same damaged checkpoints every run. Every damage here changes the checkpoint's structure
(headers, placements, names, dtypes, shapes, the shard count, NaN values), never a finite value, so
every outcome must be one of:

- a located error (an ``AttnSpecError``) on every process, the same on each;
- accepted, with the losses of the undamaged checkpoint resumed the same way (a harmless change: the
  shard files swapped, an unread metadata key).

A crash (any other exception, ``BaseException``s included: torch's ``CheckpointException`` is one),
a hang (past the launch's timeout), processes that disagree, or an accepted checkpoint whose losses
differ (silent-wrong) is a finding. The counts are printed (``pytest -s``) and asserted.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.test_hostile_directories import hostile_values
from tests.training.test_fsdp import CONFIG, SPEC

pytestmark = pytest.mark.slow  # 4 torchrun launches, about a minute and a half

SEED = 20261129
DAMAGED = 2 * 17

DRIVER = """
import json, sys
from pathlib import Path
from attnspec.errors import AttnSpecError
from attnspec.training.loop import train
rank = int(__import__("os").environ.get("RANK", "0"))
folders, report = json.loads(sys.argv[1])
outcomes = {}
for folder in folders:
    try:
        result = train(None, output=folder, resume=True)
        outcomes[folder] = ["accepted", result.losses[-3:]]
    except AttnSpecError as error:
        outcomes[folder] = ["located error", str(error)[:300]]
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # exactly what the suite looks for, torch's CheckpointException included
        outcomes[folder] = ["crash", f"{type(error).__name__}: {str(error)[:300]}"]
Path(report.format(rank=rank)).write_text(json.dumps(outcomes))
"""


def _resume_all(tmp_path: Path, folders: list[Path], processes: int) -> dict[str, list]:
    """Resume each run directory in ``folders`` in one launch of :data:`DRIVER` on ``processes`` (1: a plain
    process, no torchrun); {folder: [outcome, losses or message]}, the processes' outcomes checked alike."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    report = str(tmp_path / f"report-{processes}-{{rank}}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else []
    try:
        launch = subprocess.run([sys.executable, *launcher, str(driver), json.dumps([[str(f) for f in folders], report])],
                                capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: resuming {len(folders)} damaged checkpoints on {processes} processes passed 600 s")
    assert launch.returncode == 0, launch.stderr[-4000:]
    ranks = [json.loads(Path(report.format(rank=rank)).read_text()) for rank in range(processes)]
    for folder in map(str, folders):
        kinds = {rank[folder][0] for rank in ranks}
        assert len(kinds) == 1, f"the processes disagree on {folder}: {[rank[folder] for rank in ranks]}"
    return ranks[0]


# ----------------------------------------------------------------------------- damage


def _read_shard(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as opened:
        return {name: opened.get_tensor(name) for name in opened.keys()}, dict(opened.metadata())


def _write_shard(path: Path, tensors: dict, metadata: dict) -> None:
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(path), metadata=metadata)


KINDS = ["overlap", "offset 2^40", "offset in dimension 1", "2^40 rows in the header", "missing", "placement value",
         "sharding metadata", "nan", "dtype", "trailing shape", "extra tensor", "stray bytes", "truncated",
         "header bytes", "shard count", "swapped files", "unread key"]
"""The damage, each kind given to DAMAGED // len(KINDS) checkpoints: the audit's five first."""


def _damage(rng: random.Random, folder: Path, kind: str) -> str:
    """Damage the sharded checkpoint in ``folder`` by ``kind`` (a random tensor of a random file); what was done."""
    from attnspec.io import shard_file

    rank = rng.randrange(2)
    path = folder / shard_file(rank)
    tensors, metadata = _read_shard(path)
    info = json.loads(metadata["DCP_SHARDING_INFO"])
    rows = [name for name, tensor in tensors.items() if tensor.dim() == 2 and info[name]["saved_offsets"][0] > 0]
    name = rng.choice(rows) if rank == 1 else rng.choice([n for n in tensors if tensors[n].dim() == 2])
    offsets = info[name]["saved_offsets"]
    if kind == "overlap":
        offsets[0] = max(offsets[0] - 1, 0) if rank == 1 else offsets[0] + 1
    elif kind == "offset 2^40":
        offsets[0] = 1 << 40
    elif kind == "offset in dimension 1":
        offsets[1] = 1
    elif kind == "missing":
        del tensors[name], info[name]
    elif kind == "placement value":
        info[name] = rng.choice([{"saved_offsets": value} for value in hostile_values(folder / "PWNED")]
                                + [rng.choice(hostile_values(folder / "PWNED"))])
    elif kind == "sharding metadata":
        metadata["DCP_SHARDING_INFO"] = rng.choice(["", "[", "null", "[]", "{\"a\": 1}", "9" * 5000,
                                                    "[" * 100_000 + "]" * 100_000, "NaN"])
    elif kind == "nan":
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] = float("nan")
    elif kind == "dtype":
        tensors[name] = tensors[name].float()
    elif kind == "trailing shape":
        tensors[name] = tensors[name][:, :-1]
    elif kind == "extra tensor":
        tensors[f"model.stranger.{rng.randrange(9)}"] = torch.zeros(2, 2, dtype=torch.float64)
        info[f"model.stranger.{rng.randrange(9)}"] = {"saved_offsets": [0, 0]}
    elif kind == "unread key":
        metadata["note"] = "an unread key"
    metadata["DCP_SHARDING_INFO"] = metadata["DCP_SHARDING_INFO"] if kind == "sharding metadata" else json.dumps(info)
    _write_shard(path, tensors, metadata)
    raw = bytearray(path.read_bytes())
    length = struct.unpack("<Q", raw[:8])[0]
    if kind == "2^40 rows in the header":
        header = json.loads(raw[8:8 + length])
        header[name]["shape"][0] = 1 << 40
        text = json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + raw[8 + length:]
    elif kind == "stray bytes":
        raw = raw[:8 + length] + b"\0\0\0\0" + raw[8 + length:]
    elif kind == "truncated":
        raw = raw[:rng.randrange(8 + length, len(raw))]
    elif kind == "header bytes":
        at = rng.randrange(8, 8 + length)
        raw[at] = rng.randrange(256)
    elif kind == "shard count":
        (folder / "state.json").write_text(json.dumps({**json.loads((folder / "state.json").read_text()),
                                                       "shards": rng.choice([1, 3])}))
    elif kind == "swapped files":
        other = folder / shard_file(1 - rank)
        swap = folder / "swap"
        os.rename(path, swap)
        os.rename(other, path)
        os.rename(swap, other)
        return f"{kind} ({path.name})"
    path.write_bytes(bytes(raw))
    return f"{kind} ({path.name}: {name})"


def test_damaged_sharded_checkpoints_are_refused_alike_on_every_process_or_resume_as_the_undamaged_one(tmp_path,
                                                                                                         capsys):
    from attnspec.io import latest_checkpoint

    config = {**CONFIG, "parallel": "fsdp", "batch_size": 12}  # 12 divides into 1, 2 and 3 processes x 2
    original = tmp_path / "original"
    driver = tmp_path / "stop.py"
    driver.write_text("import json, sys\nfrom attnspec.training.loop import train\n"
                      "spec, config, output = json.loads(sys.argv[1])\n"
                      "train(spec, config, output=output, stop_after=3)\n")
    started = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                              str(driver), json.dumps([SPEC, config, str(original)])], capture_output=True,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
                             timeout=400)
    assert started.returncode == 0, started.stderr[-4000:]
    rng = random.Random(SEED)
    cases: dict[Path, str] = {}
    for processes in (1, 2, 3):
        clean = tmp_path / f"clean-{processes}"
        shutil.copytree(original, clean)
        cases[clean] = "undamaged"
    damaged = []
    for index in range(DAMAGED):
        folder = tmp_path / f"damaged-{index}"
        shutil.copytree(original, folder)
        cases[folder] = _damage(rng, latest_checkpoint(folder)[1], KINDS[index % len(KINDS)])
        damaged.append(folder)
    counts = Counter()
    findings = []
    for processes in (1, 2, 3):
        copies = {}
        for folder in damaged:  # each world size resumes its own copies: an accepted resume trains on
            copies[folder] = folder.with_name(f"{folder.name}-on-{processes}")
            shutil.copytree(folder, copies[folder])
        clean = tmp_path / f"clean-{processes}"
        outcomes = _resume_all(tmp_path, [clean, *copies.values()], processes)
        kind, reference = outcomes[str(clean)]
        assert kind == "accepted", f"the undamaged checkpoint on {processes}: {reference}"
        for folder, copy in copies.items():
            outcome, said = outcomes[str(copy)]
            counts["inputs"] += 1
            counts[outcome] += 1
            what = f"{processes} process(es): {cases[folder]}: {said}"
            if outcome == "crash":
                findings.append(f"crash: {what}")
            elif outcome == "accepted" and said != reference:
                counts["silent-wrong"] += 1
                findings.append(f"silent-wrong (losses {said}, undamaged {reference}): {what}")
    with capsys.disabled():
        print("\nhostile sharded checkpoints:", dict(sorted(counts.items())))
    assert not findings, "\n".join(findings)
    assert counts["inputs"] == 3 * DAMAGED and counts["located error"] >= 2 * DAMAGED
    # the audit's first case through the command line: one `error:` line, exit 2, no traceback
    audit = tmp_path / "audit"
    shutil.copytree(original, audit)
    _damage(random.Random(SEED), latest_checkpoint(audit)[1], "overlap")
    result = subprocess.run([sys.executable, "-m", "attnspec", "train", "--resume", "-o", str(audit), "--nproc", "2"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "the sharded checkpoint" in errors[0] and "CheckpointException" not in result.stderr, errors
