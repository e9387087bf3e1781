"""The hostile-input suite for everything attnspec reads besides specs and build directories: run
directories, runs directories, sweeps, training configurations, task data and caches.

Seeded: the same inputs every run. Each trial takes a real, valid input (made once per session),
damages it as a stranger or an accident would (a value replaced by a hostile one, a key dropped, a
file truncated, swapped for random bytes, a directory, a FIFO or a link to a file of the user's), and
hands it to the reader a user would: ``attnspec train --resume``, ``attnspec report``, ``attnspec
ablate --dry-run``, ``attnspec train --config``, a task's data loader, the plan's and the compile
check's caches. Every outcome is classified:

- accepted (the damage was harmless: a loss value changed, say) or a located error (an
  ``AttnSpecError`` naming the file or the value), which are fine;
- a crash (any other exception), a hang (past ``HANG_SECONDS``), a code execution (a payload's
  marker file appears) or a file of the user's touched (digests of the user's files and folders
  change): each must never happen.

The counts are printed (``pytest -s``) and asserted; the suite runs in about a minute.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

import attnspec
from attnspec.errors import AttnSpecError
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # 300 damaged inputs, about a minute

SEED = 20261123
HANG_SECONDS = 30
SPEC = ROOT / "specs" / "softmax-transformer.yaml"
TINY = ["d_model=16", "layers[0].repeat=1", "max_len=16", "input.vocab_size=32", "position=learned"]
MQAR = ["seq_len=16", "vocab_size=32", "num_kv_pairs=2"]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


# ----------------------------------------------------------------------------- the user's files


class UserFiles:
    """Files and a folder of the user's, outside every input, that damaged inputs link to; any change is a finding."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir()
        (root / "thesis.tex").write_text("years of work\n")
        (root / "data.bin").write_bytes(bytes(range(256)) * 4)
        (root / "folder").mkdir()
        (root / "folder" / "notes.txt").write_text("notes\n")
        self.files = [root / "thesis.tex", root / "data.bin", root / "folder"]
        self.before = self.digest()

    def digest(self) -> str:
        hasher = hashlib.sha256()
        for path in sorted(self.root.rglob("*")):
            hasher.update(str(path.relative_to(self.root)).encode())
            if path.is_file():
                hasher.update(path.read_bytes())
        return hasher.hexdigest()

    def touched(self) -> bool:
        return self.digest() != self.before


# ----------------------------------------------------------------------------- damage


def hostile_values(marker: Path) -> list:
    """Values a stranger would put where a number, a string or a table belongs."""
    return [None, True, -5, 0, 10 ** 30, 1e308, "9" * 4000, "x" * 10_000, "$\\frac{$", "=cmd|'/C calc'!A0", [],
            {}, [[[[[[[[1]]]]]]]], {"__class__": "os.system"}, f"__import__('os').system('touch {marker}')",
            "../../../../etc/passwd", "plugins", ["evil_plugin"], -1e-300, 2 ** 63, "NaN"]


def json_paths(value, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += json_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:4]):
            out += json_paths(child, (*prefix, index))
    return out


def set_path(value, path: tuple, new):
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = set_path(copy[head], tuple(rest), new)
    return copy


def drop_path(value, path: tuple):
    if len(path) == 1:
        copy = dict(value) if isinstance(value, dict) else list(value)
        del copy[path[0]]
        return copy
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = drop_path(copy[head], tuple(rest))
    return copy


def damage_file(rng: random.Random, path: Path, user: UserFiles, marker: Path) -> str:
    """Damage one file in place; returns what was done (for the failure message)."""
    kind = rng.choice(["value", "value", "value", "drop", "truncate", "bytes", "deep", "nan", "directory", "fifo",
                       "link", "empty"] if path.suffix in (".json", ".jsonl") else
                      ["truncate", "bytes", "directory", "fifo", "link", "empty"])
    if kind in ("value", "drop"):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            kind = "truncate"
        else:
            paths = [p for p in json_paths(data) if p]
            if not paths:
                kind = "bytes"
            else:
                where = rng.choice(paths)
                if kind == "value":
                    data = set_path(data, where, rng.choice(hostile_values(marker)))
                else:
                    data = drop_path(data, where)
                path.write_text(json.dumps(data))
                return f"{kind} {path.name} {where}"
    if kind == "truncate":
        raw = path.read_bytes()
        path.write_bytes(raw[:rng.randrange(max(1, len(raw)))])
    elif kind == "bytes":
        path.write_bytes(rng.randbytes(rng.choice([1, 64, 4096])))
    elif kind == "deep":
        path.write_text("[" * 100_000)
    elif kind == "nan":
        path.write_text('{"step": NaN, "format": Infinity}')
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        if kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(rng.choice(user.files))
    return f"{kind} {path.name}"


def damage_tree(rng: random.Random, root: Path, user: UserFiles, marker: Path) -> str:
    """Damage one entry (file or folder) somewhere under ``root``."""
    entries = sorted(p for p in root.rglob("*") if not p.is_symlink())
    target = rng.choice(entries)
    if target.is_dir():
        action = rng.choice(["link", "file", "foreign"])
        if action == "foreign":
            (target / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
            return f"foreign file in {target.relative_to(root)}"
        shutil.rmtree(target)
        if action == "link":
            target.symlink_to(user.root / "folder")
        else:
            target.write_text("not a folder")
        return f"{action} at {target.relative_to(root)}"
    return damage_file(rng, target, user, marker) + f" ({target.relative_to(root)})"


# ----------------------------------------------------------------------------- the trials


class Tally:
    def __init__(self):
        self.counts = Counter()
        self.findings: list[str] = []

    def trial(self, surface: str, what: str, read: Callable[[], object], user: UserFiles, marker: Path) -> None:
        self.counts["inputs"] += 1
        self.counts[f"inputs: {surface}"] += 1
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(HANG_SECONDS)
        try:
            read()
            outcome = "accepted"
        except Hang:
            outcome = "hang"
        except AttnSpecError as error:
            outcome = "located error" if str(error).strip() else "crash"
        except Exception as error:  # noqa: BLE001 - exactly what this suite looks for
            outcome = "crash"
            what += f": {type(error).__name__}: {str(error)[:200]}"
        finally:
            signal.alarm(0)
        self.counts[outcome] += 1
        if outcome in ("hang", "crash"):
            self.findings.append(f"{outcome}: {surface}: {what}")
        if marker.exists():
            self.counts["code executions"] += 1
            self.findings.append(f"code execution: {surface}: {what}")
            marker.unlink()
        if user.touched():
            self.counts["files of the user's touched"] += 1
            self.findings.append(f"user's files touched: {surface}: {what}")
            user.before = user.digest()


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    """One valid input of each kind."""
    from attnspec.ablation.ablate import ablate
    from tests.ablation.sweeps import sweep, write_sweep

    root = tmp_path_factory.mktemp("originals")
    attnspec.train(SPEC, overrides=TINY, task="mqar", task_overrides=MQAR, output=root / "run", steps=4,
                   batch_size=8, eval_every=2, test_examples=16, lr=3e-3, stop_after=2)
    ablate(sweep(variants={"softmax": {}}, train={"steps": 2, "eval_every": 0}), root / "runs", workers=1, threads=1)
    sweep_file = write_sweep(root / "sweep.yaml", variants={"softmax": {}})
    config = root / "config.yaml"
    config.write_text((root / "run" / "config.yaml").read_text())
    tokens = root / "tokens"
    tokens.mkdir()
    import numpy as np

    for name, size in (("train.bin", 400), ("val.bin", 200)):
        (tokens / name).write_bytes(np.arange(size, dtype=np.uint16).__mod__(32).astype(np.uint16).tobytes())
    cache = root / "cache"
    cache.mkdir()
    from attnspec.compiler.calibration import Calibration, machine_key

    calibration = Calibration(cache / "calibration.json", {}, machine_key())
    calibration.store("signature", "inference", 1, 16, {"quadratic": 1e-3, "chunk": 2e-3}, {"scan": "slow"})
    calibration.save()
    (cache / "compile-checks.json").write_text(json.dumps({"format": 1, "checks": {"k" * 64: {
        "report": {"lengths": [16], "max_abs_diff": 0.0, "graphs": 1, "dynamic": False}, "proof": "0" * 64}}}))
    return {"run": root / "run", "runs": root / "runs", "sweep": sweep_file, "config": config, "tokens": tokens,
            "cache": cache}


TRIALS = {"run": 60, "runs": 60, "sweep": 50, "config": 50, "tokens": 40, "cache": 40}


def test_hostile_inputs_never_crash_hang_run_code_or_touch_the_user_s_files(originals, tmp_path, monkeypatch,
                                                                            capsys):
    from attnspec.ablation.ablate import plan_sweep
    from attnspec.ablation.report import write_report
    from attnspec.compiler import compile_cache as compile_check
    from attnspec.compiler.calibration import Calibration
    from attnspec.training.config import load_config
    from attnspec.training.tasks.text import TokensTask

    rng = random.Random(SEED)
    user = UserFiles(tmp_path / "user")
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil-path"
    evil.mkdir()
    (evil / "evil_plugin.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(evil))  # as if on PYTHONPATH: only consent may import it
    monkeypatch.chdir(tmp_path)
    tally = Tally()
    for surface, count in TRIALS.items():
        for index in range(count):
            work = tmp_path / f"{surface}-{index}"
            original = originals[surface]
            if original.is_dir():
                shutil.copytree(original, work, symlinks=True)
                what = damage_tree(rng, work, user, marker)
            else:
                work = work.with_suffix(original.suffix)
                shutil.copy(original, work)
                what = _damage_yaml(rng, work, marker)
            if surface == "run":
                read = lambda: attnspec.train(None, output=work, resume=True)  # noqa: E731
            elif surface == "runs":
                read = lambda: (write_report(work), plan_sweep(originals["sweep"], work))  # noqa: E731
            elif surface == "sweep":
                read = lambda: plan_sweep(work)  # noqa: E731
            elif surface == "config":
                read = lambda: load_config(work)  # noqa: E731
            elif surface == "tokens":
                read = lambda: TokensTask(kind="tokens", path=str(work), vocab_size=32, seq_len=8).batch(  # noqa: E731
                    "train", 0, 4, 0)
            else:
                def read():
                    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(work))
                    Calibration.load(work / "calibration.json").save()
                    compile_check.passed_before("k" * 64)
                    compile_check.remember_pass("k" * 64, {"lengths": [16], "max_abs_diff": 0.0, "max_rel_diff": 0.0,
                                                           "graphs": 1, "dynamic": False, "backend": "inductor"})
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an unwritable cache warns, by design
                tally.trial(surface, what, read, user, marker)
            shutil.rmtree(work, ignore_errors=True) if work.is_dir() else work.unlink(missing_ok=True)
    with capsys.disabled():
        print("\nhostile-input suite:", dict(sorted(tally.counts.items())))
    assert not tally.findings, "\n".join(tally.findings)
    assert tally.counts["inputs"] == sum(TRIALS.values()) and tally.counts["located error"] > sum(TRIALS.values()) // 3


def _damage_yaml(rng: random.Random, path: Path, marker: Path) -> str:
    """Damage a YAML file (sweep or configuration): a value replaced, a key dropped or added, a tag,
    an alias bomb, deep nesting, cut bytes."""
    import yaml

    kind = rng.choice(["value", "value", "value", "drop", "unknown", "tag", "bomb", "deep", "truncate", "bytes"])
    if kind in ("value", "drop", "unknown"):
        data = yaml.safe_load(path.read_text())
        paths = [p for p in json_paths(data) if p]
        where = rng.choice(paths)
        if kind == "value":
            data = set_path(data, where, rng.choice(hostile_values(marker)))
        elif kind == "drop":
            data = drop_path(data, where)
        else:
            data = {**data, "run_this": f"__import__('os').system('touch {marker}')"}
        path.write_text(yaml.safe_dump(data))
        return f"{kind} {where}"
    if kind == "tag":
        path.write_text(path.read_text() + f"\nextra: !!python/object/apply:os.system ['touch {marker}']\n")
    elif kind == "bomb":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
                  for i in range(1, 12)]
        path.write_text("\n".join(lines) + "\n" + path.read_text())
    elif kind == "deep":
        path.write_text("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    elif kind == "truncate":
        raw = path.read_bytes()
        path.write_bytes(raw[:rng.randrange(max(1, len(raw)))])
    else:
        path.write_bytes(rng.randbytes(256))
    return kind
