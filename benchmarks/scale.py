"""Released models at their real sizes, beside transformers: import, build, load, first token, decode speed and
peak memory.

    python benchmarks/scale.py                          # 135m, 360m (Llama-shaped) and hybrid-135m
    python benchmarks/scale.py --sizes 135m --threads 1
    python benchmarks/scale.py --sizes 1b                # Llama-3.2-1B's shape: minutes more, 2.5 GB of disk

Checkpoints are made here from each size's transformers config with random bfloat16 weights (nothing is
downloaded): ``135m`` is SmolLM-135M's shape (30 blocks, width 576, GQA 9/3, vocabulary 49,152; 134.5M
parameters), ``360m`` SmolLM-360M's (32 blocks, width 960, GQA 15/5; 362M), ``hybrid-135m`` a
Qwen3-Next-shaped model of ~120M (24 blocks: three Gated DeltaNet per gated attention, dense MLPs), and,
on request, ``1b`` Llama-3.2-1B's (16 blocks, width 2048, GQA 32/8, vocabulary 128,256; 1.24B, without
its RoPE scaling).

Every step runs in its own process (its peak RSS is that process's), with attnspec's and Inductor's caches
fresh for each run of this script (in its temporary folder: the import is cold), one at a time, at ``--threads``
intra-op threads (1 by default: on these 2-core machines two threads collapse when anything else holds
a core), and each attnspec step is reported beside the transformers step it answers:

- import: ``attnspec import-hf`` (defaults: the checkpoint's dtype, no programs, the compile check, the
  check against transformers) vs transformers' ``from_pretrained`` + one forward of an 8-token prompt;
  target <= 3x.
- build: ``attnspec build`` of the imported spec with its weights and every program (``--programs all``),
  what a user asking for exported programs waits; beside the import.
- load + first token: ``attnspec.load`` + the prompt's prefill vs ``from_pretrained`` + one forward.
- run 8 tokens: ``attnspec run DIR --tokens ... --generate 8`` (a whole CLI process) vs a process doing
  ``from_pretrained`` + ``generate(8)``; target <= 1.5x.
- decode tokens/s: 64 greedy tokens after an 8-token prompt, after a warm-up: attnspec's eager
  ``model.generate`` and transformers' ``generate`` loaded in one process and run in 5 interleaved rounds
  (the median of each; a noisy machine slows both alike); target >= 1.0x.
- peak RSS of each attnspec process against transformers' load + forward process.

Columns are seconds (or tokens/s, MB) for transformers and the ratio of attnspec to it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 5, 9, 14, 3, 27, 8, 2]
DECODE_TOKENS = 64
DECODE_ROUNDS = 5

SIZES = {
    "135m": ("LlamaConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                 num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                                 tie_word_embeddings=True, rms_norm_eps=1e-5)),
    "360m": ("LlamaConfig", dict(vocab_size=49152, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                                 num_attention_heads=15, num_key_value_heads=5, max_position_embeddings=2048,
                                 tie_word_embeddings=True, rms_norm_eps=1e-5)),
    "1b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                               tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=500000.0)),
    "hybrid-135m": ("Qwen3NextConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                            num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
                                            head_dim=64, linear_num_value_heads=8, linear_num_key_heads=4,
                                            linear_key_head_dim=64, linear_value_head_dim=64, num_experts=0,
                                            max_position_embeddings=2048, tie_word_embeddings=True)),
}

MAKE = """
import sys, torch, transformers as tf
name, fields, path = sys.argv[1], __import__("json").loads(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
model = getattr(tf, name.replace("Config", "ForCausalLM"))(getattr(tf, name)(**fields, dtype="bfloat16"))
model = model.to(torch.bfloat16)
with torch.no_grad():
    for n, p in model.named_parameters():
        p.add_(torch.randn_like(p) * (0.1 if "norm" in n else 0.0))
model.save_pretrained(path)
print(sum(p.numel() for p in model.parameters()))
"""

HIDE = "import sys\nfor p in ('fla', 'mamba_ssm', 'causal_conv1d'): sys.modules.setdefault(p, None)\n"

TRANSFORMERS_FORWARD = HIDE + """
import sys, torch, transformers as tf
model = tf.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
with torch.no_grad():
    logits = model(torch.tensor([%s])).logits
print(int(logits[0, -1].argmax()))
""" % PROMPT

TRANSFORMERS_GENERATE = HIDE + """
import sys, torch, transformers as tf
model = tf.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
out = model.generate(torch.tensor([%s]), max_new_tokens=int(sys.argv[2]), min_new_tokens=int(sys.argv[2]),
                     do_sample=False, eos_token_id=None, pad_token_id=0)
print(" ".join(map(str, out[0, %d:].tolist())))
""" % (PROMPT, len(PROMPT))

ATTNSPEC_FIRST = """
import sys, torch, attnspec
model = attnspec.load(sys.argv[1])
with torch.no_grad():
    logits = model.prefill(torch.tensor([%s]), last_only=True)[0]
print(int(logits[0, -1].argmax()))
""" % PROMPT

DECODE = HIDE + """
import statistics, sys, time, torch
import attnspec, transformers as tf
prompt = torch.tensor([%s])
ours = attnspec.load(sys.argv[1])
theirs = tf.AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.bfloat16).eval()
runs = {"attnspec": lambda n: ours.generate(prompt, n, temperature=0.0),
        "transformers": lambda n: theirs.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                                  eos_token_id=None, pad_token_id=0)}
speeds = {name: [] for name in runs}
with torch.no_grad():
    for run in runs.values():
        run(4)
    for _ in range(%d):  # interleaved rounds: a noisy machine slows both alike
        for name, run in runs.items():
            start = time.perf_counter()
            run(%d)
            speeds[name].append(%d / (time.perf_counter() - start))
print(statistics.median(speeds["attnspec"]), statistics.median(speeds["transformers"]))
""" % (PROMPT, DECODE_ROUNDS, DECODE_TOKENS, DECODE_TOKENS)


CACHES = {}
"""Where the children keep attnspec's and Inductor's caches (set by :func:`main`: fresh for each run)."""


def timed(command: list[str], threads: int) -> tuple[float, float, str]:
    """Run ``command`` as a child: (wall seconds, its peak RSS in MB, its stdout's last line)."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                   "PYTHONPATH": str(ROOT), **CACHES}
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=environment)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stdout, stderr = process.stdout.read(), process.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{stderr[-3000:]}")
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    return seconds, usage.ru_maxrss / 1024, last


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from attnspec.cli import main; main()", *args]


def measure(size: str, work: Path, threads: int) -> dict:
    """Every row of one size (module docstring)."""
    config_class, fields = SIZES[size]
    checkpoint, imported, built = work / f"{size}-hf", work / f"{size}-import", work / f"{size}-build"
    _, _, parameters = timed(python(MAKE, config_class, json.dumps(fields), str(checkpoint)), threads)
    row = {"size": size, "parameters": int(parameters),
           "checkpoint_mb": (checkpoint / "model.safetensors").stat().st_size / 2 ** 20}
    row["tf_load_forward"], row["tf_rss"], tf_first = timed(python(TRANSFORMERS_FORWARD, str(checkpoint)), threads)
    row["import"], row["import_rss"], _ = timed(cli("import-hf", str(checkpoint), "-o", str(imported)), threads)
    row["import_mb"] = sum(path.stat().st_size for path in imported.iterdir()) / 2 ** 20
    row["build"], row["build_rss"], _ = timed(cli("build", str(imported / "spec.yaml"), "-o", str(built), "--weights",
                                                  str(imported / "model.safetensors"), "--strict-weights",
                                                  "--programs", "all"), threads)
    row["build_mb"] = sum(path.stat().st_size for path in built.iterdir()) / 2 ** 20
    row["first"], row["first_rss"], our_first = timed(python(ATTNSPEC_FIRST, str(imported)), threads)
    row["first_token_agrees"] = our_first == tf_first
    row["tf_generate"], _, tf_tokens = timed(python(TRANSFORMERS_GENERATE, str(checkpoint), "8"), threads)
    tokens = " ".join(map(str, PROMPT))
    row["run"], row["run_rss"], run_output = timed(cli("run", str(imported), "--tokens", tokens, "--generate", "8"),
                                                   threads)
    row["tokens_agree"] = run_output.removeprefix("generated: ").strip() == tf_tokens.strip()
    _, _, speeds = timed(python(DECODE, str(imported), str(checkpoint)), threads)
    row["decode"], row["tf_decode"] = map(float, speeds.split())
    return row


def render(rows: list[dict], threads: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"attnspec vs transformers at real sizes (bfloat16, {threads} thread(s); ratio attnspec / "
                        "transformers, lower is better but decode, higher is better)")
    for column in ("size", "params", "import (s, ratio)", "build all programs (s)", "load+1st token (ratio)",
                   "run 8 tokens (ratio)", "decode tok/s (ratio)", "peak RSS MB import / load (ratio)",
                   "written MB import / build (x ckpt)", "tokens agree"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["size"], f"{row['parameters'] / 1e6:.1f}M",
                      f"{row['import']:.1f} ({row['import'] / row['tf_load_forward']:.2f}x)",
                      f"{row['build']:.1f}",
                      f"{row['first']:.1f} ({row['first'] / row['tf_load_forward']:.2f}x)",
                      f"{row['run']:.1f} ({row['run'] / row['tf_generate']:.2f}x)",
                      f"{row['decode']:.1f} ({row['decode'] / row['tf_decode']:.2f}x)",
                      f"{row['import_rss']:.0f} / {row['first_rss']:.0f} ({row['first_rss'] / row['tf_rss']:.2f}x)",
                      f"{row['import_mb']:.0f} / {row['build_mb']:.0f} ({row['import_mb'] / row['checkpoint_mb']:.2f}x"
                      f" / {row['build_mb'] / row['checkpoint_mb']:.2f}x)",
                      f"{row['first_token_agrees'] and row['tokens_agree']}")
    Console(width=220).print(table)
    print(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="135m,360m,hybrid-135m")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sizes = [size for size in args.sizes.split(",") if size]
    unknown = [size for size in sizes if size not in SIZES]
    if unknown:
        raise SystemExit(f"--sizes: {unknown[0]} is not one of {', '.join(SIZES)}")
    with tempfile.TemporaryDirectory(prefix="attnspec-scale-") as work:
        CACHES.update(ATTNSPEC_CACHE_DIR=f"{work}/attnspec-cache", TORCHINDUCTOR_CACHE_DIR=f"{work}/inductor-cache")
        rows = [measure(size, Path(work), args.threads) for size in sizes]
    render(rows, args.threads)


if __name__ == "__main__":
    main()
