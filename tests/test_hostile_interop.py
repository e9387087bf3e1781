"""The hostile-input suite for the surfaces added last: transformers checkpoints (``import-hf``),
``attnspec``-type directories (``from_pretrained`` then ``generate``) and ``attnspec eval`` task files.

Built like ``tests/test_hostile_directories.py`` and with its tools: seeded damage to real, valid
inputs, each handed to the reader a user would call, every outcome classified (accepted or a
located error are fine; a crash, a hang, a code execution or a file of the user's touched never
is), the counts printed (``pytest -s``) and asserted.

Beside it, the audit's unbounded inputs run in child processes under an address-space cap
(``RLIMIT_AS``, 4 GiB: importing torch and transformers takes about 1 GiB): each must end in a
located error (exit 2, one line, no traceback) within seconds, where it used to allocate GBs or spin.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import attnspec
from tests.conftest import ROOT
from tests.test_hostile_directories import Tally, UserFiles, damage_tree, hostile_values, json_paths, set_path

pytestmark = pytest.mark.slow  # 170 damaged inputs and 5 capped processes, about a minute and a half

SEED = 20261124
VOCAB = 97
TRIALS = {"hf-checkpoint": 70, "attnspec-type": 40, "eval-file": 60}


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama and Qwen3-Next checkpoint (transformers' own save_pretrained), an attnspec-type
    export of GateLoop, and a task file of both request types."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM

    from attnspec.interop.convert import export_hf

    root = tmp_path_factory.mktemp("interop-originals")
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**small, num_hidden_layers=2)).save_pretrained(root / "llama")
    Qwen3NextForCausalLM(Qwen3NextConfig(**small, num_hidden_layers=4, head_dim=16, linear_num_value_heads=4,
                                         linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=6,
                                         num_experts=0)).save_pretrained(root / "qwen3_next")
    spec = attnspec.load_spec(ROOT / "specs" / "gateloop.yaml").model_dump(mode="json")
    spec.update(max_len=16, d_model=16, input={"kind": "tokens", "vocab_size": VOCAB})
    attnspec.save(attnspec.build(spec), root / "build", compile_check=False)
    export_hf(root / "build", root / "attnspec-type")
    task = root / "task.jsonl"
    task.write_text("".join(json.dumps(line) + "\n" for line in [
        {"context": [1, 2, 3], "continuation": [4, 5]}, {"context": "ab", "continuation": "c"},
        {"context": [7, 8], "choices": [[1], [2, 3], [4]], "label": 1}]))
    return {"llama": root / "llama", "qwen3_next": root / "qwen3_next", "attnspec-type": root / "attnspec-type",
            "eval-file": task, "build": root / "build"}


def _damage_lines(rng: random.Random, path: Path, marker: Path) -> str:
    """Damage a JSON-lines file: a value of one request replaced, a line of bytes, a line split at
    U+2028, a huge line, truncation."""
    lines = path.read_text().splitlines()
    kind = rng.choice(["value", "value", "value", "bytes", "separator", "long", "many", "truncate"])
    index = rng.randrange(len(lines))
    if kind == "value":
        data = json.loads(lines[index])
        where = rng.choice([p for p in json_paths(data) if p])
        lines[index] = json.dumps(set_path(data, where, rng.choice(hostile_values(marker))))
        path.write_text("\n".join(lines) + "\n")
        return f"value line {index + 1} {where}"
    if kind == "bytes":
        path.write_bytes(path.read_bytes() + rng.randbytes(64) + b"\n")
    elif kind == "separator":
        path.write_text(path.read_text().replace("ab", "a\u2028b\u0085", 1), encoding="utf-8")
    elif kind == "long":
        path.write_text('{"context": [1], "continuation": [' + "1," * (5 << 20) + "1]}\n")
    elif kind == "many":
        path.write_text('{"context": [1], "label": 0, "choices": [' + "[1]," * 100_000 + "[2]]}\n")
    else:
        raw = path.read_bytes()
        path.write_bytes(raw[:rng.randrange(len(raw))])
    return kind


def test_hostile_interop_inputs_never_crash_hang_run_code_or_touch_the_user_s_files(originals, tmp_path, monkeypatch,
                                                                                   capsys):
    import attnspec.hf  # noqa: F401  (registers the attnspec model type)
    from attnspec.hf import AttnspecForCausalLM
    from attnspec.interop.convert import convert_weights, spec_from_checkpoint
    from attnspec.training.evaluate import evaluate_file

    rng = random.Random(SEED)
    user = UserFiles(tmp_path / "user")
    marker = tmp_path / "PWNED"
    monkeypatch.chdir(tmp_path)
    model = attnspec.load(originals["build"])
    prompt = torch.tensor([[1, 2, 3]])
    tally = Tally()
    for surface, count in TRIALS.items():
        for index in range(count):
            work = tmp_path / f"{surface}-{index}"
            if surface == "hf-checkpoint":
                model_type = rng.choice(["llama", "qwen3_next"])
                shutil.copytree(originals[model_type], work, symlinks=True)
                what = damage_tree(rng, work, user, marker)

                def read(work=work):
                    _, spec, found = spec_from_checkpoint(work)
                    convert_weights(spec, work, found)
            elif surface == "attnspec-type":
                shutil.copytree(originals["attnspec-type"], work, symlinks=True)
                what = damage_tree(rng, work, user, marker)

                def read(work=work):
                    AttnspecForCausalLM.from_pretrained(work).generate(prompt, max_new_tokens=2, do_sample=False,
                                                                       pad_token_id=0)
            else:
                work = work.with_suffix(".jsonl")
                shutil.copy(originals["eval-file"], work)
                what = _damage_lines(rng, work, marker)

                def read(work=work):
                    evaluate_file(model, work)
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # transformers warns about unused config keys, by design
                tally.trial(surface, what, read, user, marker)
            shutil.rmtree(work, ignore_errors=True) if work.is_dir() else work.unlink(missing_ok=True)
    with capsys.disabled():
        print("\nhostile interop suite:", dict(sorted(tally.counts.items())))
    assert not tally.findings, "\n".join(tally.findings)
    assert tally.counts["inputs"] == sum(TRIALS.values()) and tally.counts["located error"] > sum(TRIALS.values()) // 3


# ----------------------------------------------------------------------------- bounded under a memory cap

CAP = 4 << 30


def _capped(code: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``code`` in a child process limited to CAP bytes of address space; (result, seconds)."""
    program = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({CAP}, {CAP}))\n" + textwrap.dedent(code)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=cwd, timeout=300,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    return result, time.perf_counter() - start


def _cli(*args: str) -> str:
    return f"import sys\nsys.argv = ['attnspec', *{list(args)!r}]\nfrom attnspec.cli import main\nmain()\n"


def test_the_audit_s_unbounded_inputs_end_in_located_errors_under_a_memory_cap(originals, tmp_path, capsys):
    from tests.compiler.test_trust import edit_graph, fix_hashes, huge_power

    layers = tmp_path / "layers"  # num_hidden_layers: 10**9 built per-layer lists before the block limit
    shutil.copytree(originals["llama"], layers)
    config = json.loads((layers / "config.json").read_text())
    (layers / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10 ** 9}))
    choices = tmp_path / "choices.jsonl"  # a question of 20 M choices: objects before the request limit
    choices.write_text('{"context": [1], "label": 0, "choices": [' + "[1]," * 20_000_000 + "[2]]}\n")
    power = tmp_path / "power"  # allowed tokens, but sympify computes 10**(10**10)
    shutil.copytree(originals["build"], power)
    edit_graph(huge_power)(power)
    fix_hashes(power)
    caches = tmp_path / "caches"  # within every limit but the decoding state: 18 GiB of caches per row
    shutil.copytree(originals["attnspec-type"], caches)
    config = json.loads((caches / "config.json").read_text())
    config["spec"].update(d_model=8, max_len=1 << 20, layers=[{"repeat": 256, "layers": [
        {"mixer": {"kind": "softmax", "heads": 1}, "mlp": "none"}]}])
    (caches / "config.json").write_text(json.dumps(config))
    empty = tmp_path / "empty"  # 4.0e9 parameters (within the limit) and no weights: 16 GB allocated
    shutil.copytree(originals["attnspec-type"], empty)
    config = json.loads((empty / "config.json").read_text())
    block = {"mixer": {"kind": "softmax", "heads": 64}, "mlp": {"kind": "mlp", "expansion": 4}}
    config["spec"].update(d_model=8192, input={"kind": "tokens", "vocab_size": 8},
                          layers=[{"repeat": 5, "layers": [block]}])
    (empty / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({"model.embed.weight": torch.zeros(8, 8192)}, str(empty / "model.safetensors"))
    load = ("import attnspec.hf\nfrom attnspec.hf import AttnspecForCausalLM\n"
            "AttnspecForCausalLM.from_pretrained({!r})\n")
    cases = [
        ("import-hf layers", _cli("import-hf", str(layers), "-o", str(tmp_path / "out")), "num_hidden_layers"),
        ("eval choices", _cli("eval", str(originals["build"]), "--task", str(choices)), "choices.jsonl:1:"),
        ("run --programs power", _cli("run", str(power), "--tokens", "1 2", "--programs"), "symbolic size"),
        ("from_pretrained caches", load.format(str(caches)), "decoding state of 1 sequence"),
        ("from_pretrained empty weights", load.format(str(empty)), "does not fit its spec's model"),
    ]
    for name, code, words in cases:
        result, seconds = _capped(code, tmp_path)
        where = f"{name}: exit {result.returncode} after {seconds:.1f} s: {result.stderr[-600:]}"
        assert words in result.stderr, where
        if code.startswith("import sys"):  # the CLI: exit 2, no traceback
            assert result.returncode == 2 and "Traceback" not in result.stderr, where
        else:  # the Python API: the located InteropError
            assert "attnspec.errors.InteropError" in result.stderr, where
        assert seconds < 60, where
        with capsys.disabled():
            print(f"\n  capped at {CAP >> 30} GiB: {name}: located error after {seconds:.1f} s", end="")
    assert not (tmp_path / "out").exists()
