"""The real SmolLM2-135M-Instruct (tools/fetch_models.py: its Q4_1 GGUF, from PyPI, pinned) beside transformers
reading the same file: import, scoring long windows of real text, decoding; time and peak memory.

    python benchmarks/real_models.py                  # quiet machine, torch's default threads
    python benchmarks/real_models.py --rounds 2 --tokens 9559 --new-tokens 64

Each candidate runs in a fresh Python process (its peak RSS is that process's ``VmHWM``, Linux; its time
is the work alone, after imports), attnspec's and transformers' interleaved round by round. Candidates:

* import: ``attnspec import-hf FILE.gguf`` as the command does it by default (bfloat16, its self-check
  against transformers included: transformers' model is loaded in the same process after attnspec's),
  against transformers' ``from_pretrained(gguf_file=, dtype=bfloat16)`` and one forward of 8 tokens;
  peak RSS also as a multiple of the import's ``model.safetensors`` (the dequantised checkpoint); and the
  same from a bfloat16 transformers directory of the model (export-hf's, as a release is shipped).
* eval: ``attnspec eval --text`` (:func:`attnspec.training.evaluate.evaluate_text`) on ``--tokens`` tokens of
  the Python documentation's topics in windows of ``max_len`` (8,192: two windows at 9,559 tokens, the
  issue's measurement) in float32, against transformers' forward over the same windows (lm-eval's:
  the prefix token, then disjoint windows, the last reaching back a whole window) with each window's
  logits log-softmaxed and gathered as lm-eval does; the log-likelihoods are checked equal (1e-4).
* decode: ``model.generate`` greedy, ``--new-tokens`` after a 32-token prompt, float32, against
  transformers' ``generate`` (its DynamicCache); the tokens are checked equal.

Ratios are attnspec / transformers: below 1.00 attnspec is faster or smaller.
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
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

PRELUDE = """
import json, os, sys, time
os.environ["TQDM_DISABLE"] = "1"
import torch
import attnspec
def report(seconds, **extra):  # VmHWM: this process's peak RSS (ru_maxrss keeps the parent's across exec)
    peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print("RESULT " + json.dumps({"seconds": seconds, "peak_rss": peak, **extra}))
"""

IMPORT_OURS = """
from attnspec.interop.convert import import_hf
start = time.perf_counter()
result = import_hf({source}, OUT + "/build", calibrate=False)
report(time.perf_counter() - start, agrees=result.import_check.agrees,
       checkpoint=os.path.getsize({weights}))
"""
IMPORT_THEIRS = """
from transformers import AutoModelForCausalLM
start = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained({arguments}, dtype=torch.bfloat16)
with torch.no_grad():
    model(torch.arange(8)[None])
report(time.perf_counter() - start)
"""

CANDIDATES = {
    ("import", "attnspec"): IMPORT_OURS.format(source="GGUF", weights='OUT + "/build/model.safetensors"'),
    ("import", "transformers"): IMPORT_THEIRS.format(
        arguments="os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF)"),
    ("import a directory", "attnspec"): IMPORT_OURS.format(source="DIRECTORY",
                                                          weights='DIRECTORY + "/model.safetensors"'),
    ("import a directory", "transformers"): IMPORT_THEIRS.format(arguments="DIRECTORY"),
    ("eval", "attnspec"): """
from attnspec.compiler.load import tokenizer_of
from attnspec.training.evaluate import evaluate_text
model, tokenizer = attnspec.load(BUILD), tokenizer_of(BUILD)
start = time.perf_counter()
result = evaluate_text(model, TEXT, tokenizer=tokenizer)
report(time.perf_counter() - start, loglikelihood=result.loglikelihood, tokens=result.tokens, windows=result.windows)
""",
    ("eval", "transformers"): """
from transformers import AutoModelForCausalLM, AutoTokenizer
import torch.nn.functional as F
model, tokenizer = AutoModelForCausalLM.from_pretrained(EXPORTED, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(EXPORTED)
text = open(TEXT, encoding="utf-8").read()
prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
start = time.perf_counter()
ids = [prefix] + tokenizer(text).input_ids
width, total, done = model.config.max_position_embeddings, 0.0, 0
with torch.no_grad():
    while done < len(ids) - 1:
        end = min(done + width, len(ids) - 1)
        first = max(0, end - width)
        logits = model(torch.tensor([ids[first:end]])).logits[0, done - first:]
        total += float(F.log_softmax(logits, -1).gather(1, torch.tensor(ids[done + 1:end + 1])[:, None]).sum())
        done = end
report(time.perf_counter() - start, loglikelihood=total, tokens=len(ids) - 1)
""",
    ("decode", "attnspec"): """
model = attnspec.load(BUILD)
prompt = torch.tensor([PROMPT])
model.generate(prompt, 2)
start = time.perf_counter()
tokens = model.generate(prompt, NEW)[0, len(PROMPT):].tolist()
report(time.perf_counter() - start, tokens=tokens)
""",
    ("decode", "transformers"): """
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(EXPORTED, dtype=torch.float32).eval()
prompt = torch.tensor([PROMPT])
generate = lambda n: model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
generate(2)
start = time.perf_counter()
tokens = generate(NEW)[0, len(PROMPT):].tolist()
report(time.perf_counter() - start, tokens=tokens)
""",
}


TASKS = ("import", "import a directory", "eval", "decode")


def _run(task: str, who: str, values: dict) -> dict:
    """One candidate in a fresh process; its RESULT line."""
    constants = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    done = subprocess.run([sys.executable, "-c", PRELUDE + constants + CANDIDATES[(task, who)]], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"{task} / {who} failed:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=9559, help="tokens of text to score (9,559: two 8,192 windows)")
    parser.add_argument("--new-tokens", type=int, default=64)
    options = parser.parse_args()

    import pydoc_data.topics

    from attnspec.compiler.load import tokenizer_of
    from attnspec.interop.convert import export_hf, import_hf
    from tools.fetch_models import fetch

    gguf = str(fetch("smollm2", quiet=True))
    work = Path(tempfile.mkdtemp(prefix="attnspec-real-"))
    build = work / "float32"
    import_hf(gguf, build, dtype="float32", check=False, compile_check=False, calibrate=False)
    exported, _ = export_hf(build, work / "hf")
    import_hf(gguf, work / "bfloat16", check=False, compile_check=False, calibrate=False)
    directory, _ = export_hf(work / "bfloat16", work / "hf-bfloat16")  # a transformers directory, as released
    tokenizer = tokenizer_of(build)
    topics = "\n\n".join(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics))
    ids = tokenizer.encode(topics, special=True)[:options.tokens - 1]
    text = work / "text.txt"
    text.write_text(tokenizer.decode(ids), encoding="utf-8")
    prompt = tokenizer.encode(topics[:400], special=True)[:32]
    values = {"GGUF": gguf, "DIRECTORY": str(directory), "BUILD": str(build), "EXPORTED": str(exported), "TEXT": str(text), "PROMPT": prompt,
              "NEW": options.new_tokens}

    found: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(options.rounds):
        for task in TASKS:
            for who in ("attnspec", "transformers"):
                out = work / f"out-{task}-{who}-{round_}"
                out.mkdir()
                found.setdefault((task, who), []).append(_run(task, who, {**values, "OUT": str(out)}))

    def best(task: str, who: str, key: str) -> float:
        return min(result[key] for result in found[(task, who)])

    ours, theirs = found[("eval", "attnspec")][0], found[("eval", "transformers")][0]
    assert abs(ours["loglikelihood"] - theirs["loglikelihood"]) <= 1e-4 * abs(theirs["loglikelihood"]), (ours, theirs)
    assert found[("decode", "attnspec")][0]["tokens"] == found[("decode", "transformers")][0]["tokens"]
    assert all(result["agrees"] for task in ("import", "import a directory") for result in found[(task, "attnspec")])

    table = Table(title=f"real SmolLM2-135M-Instruct, {options.rounds} round(s), best of each, torch threads "
                        f"{os.environ.get('OMP_NUM_THREADS', 'default')}")
    for column in ("measure", "attnspec", "transformers", "ratio"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    rows = [("import of the GGUF file (s, with its check)", "import", "seconds", 1.0),
            ("import of a bfloat16 transformers directory (s, with its check)", "import a directory", "seconds", 1.0),
            (f"eval: {ours['tokens']:,} tokens in {ours['windows']} window(s) (s)", "eval", "seconds", 1.0),
            (f"decode: {options.new_tokens} tokens (s)", "decode", "seconds", 1.0)]
    for label, task, key, scale in rows:
        a, b = best(task, "attnspec", key), best(task, "transformers", key)
        table.add_row(label, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x")
    for task in TASKS:
        a, b = best(task, "attnspec", "peak_rss"), best(task, "transformers", "peak_rss")
        table.add_row(f"{task}: peak RSS (MiB)", f"{a / 2**20:,.0f}", f"{b / 2**20:,.0f}", f"{a / b:.2f}x")
    for task in ("import", "import a directory"):  # the checkpoint: the bfloat16 weights (the GGUF's dequantised)
        checkpoint = found[(task, "attnspec")][0]["checkpoint"]
        table.add_row(f"{task}: peak RSS / the bfloat16 model.safetensors",
                      f"{best(task, 'attnspec', 'peak_rss') / checkpoint:.2f}x",
                      f"{best(task, 'transformers', 'peak_rss') / checkpoint:.2f}x", "")
    table.add_row("eval tokens/s", f"{ours['tokens'] / best('eval', 'attnspec', 'seconds'):.0f}",
                  f"{theirs['tokens'] / best('eval', 'transformers', 'seconds'):.0f}", "")
    table.add_row("decode tokens/s", f"{options.new_tokens / best('decode', 'attnspec', 'seconds'):.1f}",
                  f"{options.new_tokens / best('decode', 'transformers', 'seconds'):.1f}", "")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
