"""The hostile-input suite for what a user receives and hands to attnspec last: tokenizer files, token cache
entries, evaluation options, partial weights and the new model parts' spec fields.

Built like ``tests/test_hostile_interop.py`` and with its tools: seeded damage to real, valid inputs, each
handed to the reader a user would call, every outcome classified, the counts printed (``pytest -s``) and
asserted. Beside a crash, a hang, a code execution or a file of the user's touched, a result that is
quietly wrong is a finding here: an evaluation that scores no window or scores otherwise than batch 1 does,
partial weights that load a non-finite value, and a spec that passes ``check`` but does not build, or
builds a model whose output is not finite.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec import tokenizer_worker as worker
from attnspec.errors import SpecError
from tests.test_hostile_directories import Tally, UserFiles, damage_file, hostile_values, json_paths, set_path
from tests.tokenizer_files import REAL, write_tokenizer

pytestmark = pytest.mark.slow  # about a minute: 8,280 spec fields (9 s), 160 damaged inputs

SEED = 20261127
TRIALS = {"tokenizer": 40, "token-cache": 40, "eval-option": 40, "partial-weight": 40}
CATASTROPHIC = ["(a|aa)+$", "(a+)+$", "(a|a)*b", "(.*a){12}", "(\\s*)+$", "((a{1,8}){1,8}){1,8}$", "(x+x+)+y"]
"""Patterns whose backtracking is exponential (or polynomial of a high degree) in a run of text."""
TEXTS = ["a" * 30 + "!", "a" * 2000, " " * 3000 + "x", ("ab " * 400), "🙂" * 300 + "é" * 300, "", "x"]


# ----------------------------------------------------------------------------- tokenizers


def _damage_tokenizer(rng: random.Random, path: Path, marker: Path) -> str:
    """A real tokenizer.json damaged: a value anywhere, a catastrophic pattern in its split or a normalizer,
    a multiplying normalizer chain, or its bytes."""
    kind = rng.choice(["value", "value", "pattern", "pattern", "normalizer", "multiply", "bytes"])
    if kind == "bytes":
        raw = path.read_bytes()
        path.write_bytes(raw[: rng.randrange(len(raw))] + rng.randbytes(rng.choice([0, 16])))
        return "bytes"
    data = json.loads(path.read_text())
    if kind == "value":
        where = rng.choice([p for p in json_paths(data) if p])
        data = set_path(data, where, rng.choice(hostile_values(marker)))
        what = f"value {where}"
    elif kind == "pattern":
        pattern = rng.choice(CATASTROPHIC)
        split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": rng.choice(["Isolated", "Removed"]),
                 "invert": rng.random() < 0.3}
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split] + ([data["pre_tokenizer"]]
                                                                                 if data.get("pre_tokenizer") else [])}
        what = f"split {pattern}"
    elif kind == "normalizer":
        pattern = rng.choice(CATASTROPHIC)
        data["normalizer"] = {"type": "Replace", "pattern": {"Regex": pattern}, "content": "b"}
        what = f"replace {pattern}"
    else:
        factor, depth = rng.choice([2, 10, 100]), rng.choice([3, 8, 20])
        data["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": "a"}, "content": "a" * factor}] * depth}
        what = f"multiply {factor}^{depth}"
    path.write_text(json.dumps(data))
    return what


def _tokenizer_trial(path: Path, texts: list[str]):
    from attnspec.tokenizer import load_tokenizer

    def read():
        loaded = load_tokenizer(path)
        for text in texts:
            ids = loaded.encode(text)
            assert all(0 <= i < loaded.vocab_size for i in ids)
            loaded.decode(ids)
    return read


# ----------------------------------------------------------------------------- token caches


def _cache_trial(root: Path, tokenizer: Path, packing: str):
    from attnspec.training.tasks import TextTask

    def read():
        task = TextTask.model_validate({"kind": "text", "path": str(root), "tokenizer": str(tokenizer),
                                        "seq_len": 16, "packing": packing})
        for split in ("train", "test"):
            inputs, targets = task.batch(split, 0, 2, seed=0)
            assert int(inputs.max()) < task.vocab_size
    return read


# ----------------------------------------------------------------------------- evaluation options


EVAL_VALUES = [-1, 0, 1, 2, 3, 16, 17, 10 ** 30, True, 1.5, "3", None, -(10 ** 30), float("nan")]


def _eval_trial(model, text: Path, task: Path, tokenizer, rng: random.Random, findings: list[str]):
    from attnspec.training.evaluate import evaluate_file, evaluate_text

    batch, stride = rng.choice(EVAL_VALUES), rng.choice(EVAL_VALUES)
    on_text = rng.random() < 0.6
    what = f"{'text' if on_text else 'task'} batch_size={batch!r} stride={stride!r}"

    def read():
        if on_text:
            result = evaluate_text(model, text, tokenizer=tokenizer, stride=stride, batch_size=batch)
            alone = evaluate_text(model, text, tokenizer=tokenizer, stride=stride, batch_size=1)
            if result.windows < 1 or not math.isfinite(result.perplexity) or result.perplexity <= 1.0 or \
                    abs(result.perplexity - alone.perplexity) > 1e-9 * alone.perplexity:
                findings.append(f"quiet wrong result: eval {what}: {result}")
        else:
            result = evaluate_file(model, task, tokenizer=tokenizer, batch_size=batch)
            alone = evaluate_file(model, task, tokenizer=tokenizer, batch_size=1)
            if result.requests != alone.requests or not math.isclose(result.perplexity, alone.perplexity,
                                                                     rel_tol=1e-9):
                findings.append(f"quiet wrong result: eval {what}: {result}")
    return what, read


# ----------------------------------------------------------------------------- partial weights


def _damage_weights(rng: random.Random, tensors: dict, path: Path) -> str:
    """A build's weights with one tensor damaged (dtype, values, shape, name) or the file's bytes."""
    kind = rng.choice(["dtype", "value", "value", "shape", "rename", "drop", "extra", "bytes"])
    name = rng.choice(sorted(tensors))
    tensors = dict(tensors)
    if kind == "dtype":
        dtype = rng.choice([torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int8, torch.bool])
        tensors[name] = tensors[name].to(dtype)
        what = f"{name} as {dtype}"
    elif kind == "value":
        value = rng.choice([float("nan"), float("inf"), 1e300, -1e300, 1e-320, 7e4, 3.5e38])
        dtype = rng.choice([torch.float64, torch.float32, torch.float16])
        tensors[name] = tensors[name].to(dtype).clone()
        tensors[name].view(-1)[0] = torch.tensor(value, dtype=torch.float64).to(dtype)  # 1e300 is inf in float32
        what = f"{name}[0] = {value} in {dtype}"
    elif kind == "shape":
        tensors[name] = tensors[name].reshape(-1) if tensors[name].dim() > 1 else tensors[name][None]
        what = f"{name} reshaped"
    elif kind == "rename":
        tensors[name + ".x"] = tensors.pop(name)
        what = f"{name} renamed"
    elif kind == "drop":
        del tensors[name]
        what = f"{name} dropped"
    elif kind == "extra":
        tensors["evil.weight"] = torch.full((3,), float("nan"))
        what = "an extra tensor of NaN"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    if kind == "bytes":
        raw = path.read_bytes()
        path.write_bytes(raw[: rng.randrange(len(raw))])
        what = "truncated"
    return what


def _weights_trial(build: Path, path: Path, strict: bool, what: str, findings: list[str]):
    def read():
        model = attnspec.load(build, weights=path, strict=strict)
        bad = [n for n, p in model.state_dict().items() if p.is_floating_point() and not torch.isfinite(p).all()]
        if bad:
            findings.append(f"quiet wrong result: weights {what}: {bad} not finite")
    return read


# ----------------------------------------------------------------------------- spec fields


FIELD_VALUES = [0, 1, 2, 3, 4, 8, -1, 7, 17, 1 << 20, 0.5, 0.9, -0.5, 1e-30, 1e30, float("nan"), True, False, "x",
                [], None, {}, ["q", "q"], [0.5, 0.1]]
"""Boundaries (0, 1, -1, odd widths, d_model + 1, huge, tiny, NaN), wrong types, and values a field may hold."""
BASE_SPEC = {"name": "fields", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 16,
             "dtype": "float64"}
SHARED = {"name": "memory", "reads": "hidden_and_embeddings", "adapter_rank": 2,
          "block": {"mixer": {"kind": "softmax", "heads": 2}, "mlp": {"kind": "glu", "hidden": 24}, "norm": "rmsnorm",
                    "residual": False}}


def _mixers() -> dict[str, dict]:
    """A valid mixer of every family: its kind's defaults, and the fields a family requires."""
    from attnspec.spec.components import SLOTS

    required = {"mla": {"kv_rank": 8}, "parallel": {"branches": [{"kind": "softmax", "heads": 2},
                                                                 {"kind": "linear", "heads": 2}]}}
    return {kind: {"kind": kind, **required.get(kind, {})} for kind in SLOTS["mixer"]}


def spec_field_cases() -> list[tuple[str, dict]]:
    """(what, spec) for every field of every mixer family, MLP kind, block and shared block, at each of
    :data:`FIELD_VALUES`."""
    from attnspec.spec.components import SLOTS
    from attnspec.spec.ir import Block, SharedBlock

    cases = []
    for kind, mixer in _mixers().items():
        for field in SLOTS["mixer"][kind].model_fields:
            for value in FIELD_VALUES:
                layer = {"mixer": {**copy.deepcopy(mixer), field: value}}
                cases.append((f"{kind}.{field}={value!r}", {**BASE_SPEC, "layers": [layer]}))
    for kind, cls in SLOTS["mlp"].items():
        for field in cls.model_fields:
            for value in FIELD_VALUES:
                mlp = {"kind": kind, **({"experts": 4, "top_k": 2} if kind == "moe" else {}), field: value}
                cases.append((f"mlp {kind}.{field}={value!r}", {**BASE_SPEC, "layers": [
                    {"mixer": {"kind": "softmax", "heads": 2}, "mlp": mlp}]}))
    for field in Block.model_fields:
        for value in FIELD_VALUES:
            cases.append((f"block.{field}={value!r}", {**BASE_SPEC, "layers": [
                {"mixer": {"kind": "softmax", "heads": 2}, field: value}]}))
    for field in SharedBlock.model_fields:
        for value in FIELD_VALUES:
            shared = {**copy.deepcopy(SHARED), field: value}
            layers = [{"mixer": {"kind": "delta", "heads": 2}, "norm": "rmsnorm", "mlp": "none",
                       **({"shared": {"name": "memory"}} if i else {})} for i in range(2)]
            cases.append((f"shared.{field}={value!r}", {**BASE_SPEC, "shared": [shared], "layers": layers}))
    return cases


def _spec_trial(spec: dict, what: str, findings: list[str], counts) -> None:
    """Check, then (where it passes) build and run: a refusal must name a field; a spec that passes
    must build and compute finite outputs."""
    from attnspec.spec import load_spec

    try:
        resolved = load_spec(spec)
    except SpecError as error:
        counts["spec fields: refused at check"] += 1
        if not all(problem.path for problem in error.problems):
            findings.append(f"unlocated check error: {what}: {error}")
        return
    except Exception as error:  # noqa: BLE001
        findings.append(f"crash at check: {what}: {type(error).__name__}: {str(error)[:200]}")
        return
    try:
        model = attnspec.build(resolved)
        tokens = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
        output = model(tokens)
    except Exception as error:  # noqa: BLE001 - a spec that passed check must build
        findings.append(f"passes check, fails to build: {what}: {type(error).__name__}: {str(error)[:200]}")
        return
    counts["spec fields: built"] += 1
    if not torch.isfinite(output).all():
        findings.append(f"passes check, computes non-finite outputs: {what}")


# ----------------------------------------------------------------------------- the suite


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("received-originals")
    tokenizers = {name: write_tokenizer(root / f"{name}.json", name, vocab=300) for name in REAL}
    corpus = root / "corpus"
    corpus.mkdir()
    for index, text in enumerate(["the cat sat on the mat. " * 20, "a dog ran past the river. " * 15,
                                  "birds sang old songs. " * 12, "quiet hills and green fields. " * 10]):
        (corpus / f"{index}.txt").write_text(text)
    spec = {**BASE_SPEC, "input": {"kind": "tokens", "vocab_size": 300},  # float64: batching is exact to 1e-9
            "layers": [{"mixer": {"kind": "softmax", "heads": 2, "causal": True}},
                       {"mixer": {"kind": "linear", "heads": 2, "transition": {"kind": "data"}}}]}
    torch.manual_seed(0)
    attnspec.save(attnspec.build(spec), root / "build", compile_check=False)
    (root / "text.txt").write_text("the cat sat on the mat while a dog ran past the river. " * 6)
    lines = [{"context": "the cat", "choices": [" sat", " ran", " sang"], "label": 0},
             {"context": "a dog", "continuation": " ran past"}, {"context": "birds", "continuation": " sang"}]
    (root / "task.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return {"root": root, "tokenizers": tokenizers, "corpus": corpus, "build": root / "build"}


def test_received_inputs_never_crash_hang_run_code_touch_files_or_change_a_result_quietly(originals, tmp_path,
                                                                                        monkeypatch, capsys):
    from safetensors.torch import load_file

    from attnspec.tokenizer import load_tokenizer

    rng = random.Random(SEED)
    user = UserFiles(tmp_path / "user")
    marker = tmp_path / "PWNED"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(worker, "TIME_FLOOR", 2.0)  # a pathological pattern is stopped within seconds
    tally = Tally()
    findings: list[str] = []
    tokenizer = load_tokenizer(originals["tokenizers"]["bpe"])
    model = attnspec.load(originals["build"])
    weights = load_file(str(originals["build"] / "model.safetensors"))
    for surface, count in TRIALS.items():
        for index in range(count):
            work = tmp_path / f"{surface}-{index}"
            work.mkdir()
            if surface == "tokenizer":
                path = work / "tokenizer.json"
                shutil.copy(originals["tokenizers"][rng.choice(REAL)], path)
                what = _damage_tokenizer(rng, path, marker)
                read = _tokenizer_trial(path, rng.sample(TEXTS, 3))
            elif surface == "token-cache":
                cache = tmp_path / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                _cache_trial(originals["corpus"], originals["tokenizers"]["bpe"], "pack")()  # a fresh entry
                entry = next((cache / "corpora").iterdir())
                target = rng.choice(sorted(entry.iterdir()))
                what = damage_file(rng, target, user, marker) + f" ({target.name})"
                read = _cache_trial(originals["corpus"], originals["tokenizers"]["bpe"], rng.choice(["pack", "pad"]))
            elif surface == "eval-option":
                what, read = _eval_trial(model, originals["root"] / "text.txt", originals["root"] / "task.jsonl",
                                         tokenizer, rng, findings)
            else:
                path = work / "weights.safetensors"
                what = _damage_weights(rng, weights, path)
                strict = rng.random() < 0.3
                what += f" strict={strict}"
                read = _weights_trial(originals["build"], path, strict, what, findings)
            before = dict(tally.counts)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # partial weights warn of what they keep, by design
                tally.trial(surface, what, read, user, marker)
            outcome = next(k for k in ("accepted", "located error", "crash", "hang")
                           if tally.counts[k] != before.get(k, 0))
            tally.counts[f"{surface}: {outcome}"] += 1
            shutil.rmtree(work, ignore_errors=True)
    cases = spec_field_cases()  # every case: on the code before this suite, rglru heads 3, 7, 17 and adapt [q, q]
    for what, spec in cases:   # passed check and failed to build
        _spec_trial(spec, what, findings, tally.counts)
    tally.counts["inputs: spec-field"] = len(cases)
    with capsys.disabled():
        print("\nhostile received-input suite:")
        for key, value in sorted(tally.counts.items()):
            print(f"  {key:<40} {value:>6,}")
    assert not tally.findings + findings, "\n".join(tally.findings + findings)
    assert tally.counts["inputs"] == sum(TRIALS.values())
    assert tally.counts["located error"] > sum(TRIALS.values()) // 3
    assert tally.counts["spec fields: built"] > 500 and tally.counts["spec fields: refused at check"] > 5000
