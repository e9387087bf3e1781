"""A tokenizer travels with the weights through import-hf and export-hf, and an exported directory runs
under lm-evaluation-harness's own ``hf`` model on local data, agreeing with ``attnspec eval``.

lm-eval (the dev extra) reads a task YAML written here whose data is a local JSON-lines file (the
``json`` builder of `datasets`), offline; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from tests.training.test_text_corpus import WORDS, train_tokenizer, write_corpus

pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")

TASK_YAML = """task: local_piqa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{[sol1, sol2]}}}}"
metric_list:
  - metric: acc
"""


def _questions(count: int = 24) -> list[dict]:
    rng = random.Random(2)
    sentence = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    return [{"goal": sentence(rng.randint(3, 8)), "sol1": sentence(rng.randint(1, 5)),
             "sol2": sentence(rng.randint(1, 5)), "label": rng.randint(0, 1)} for _ in range(count)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result


@pytest.mark.slow
def test_an_exported_model_with_its_tokenizer_runs_under_lm_eval_as_attnspec_scores_it(tmp_path):
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", write_corpus(tmp_path / "corpus"), vocab=300)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=0)  # <|endoftext|>, the tokenizer's id 0
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    (checkpoint / "tokenizer.json").write_bytes(tokenizer.read_bytes())

    build, exported = tmp_path / "build", tmp_path / "hf"
    _cli("import-hf", str(checkpoint), "-o", str(build), "--no-compile", "--no-calibrate")
    assert json.loads((build / "manifest.json").read_text())["tokenizer"]["eos"] == "<|endoftext|>"
    _cli("export-hf", str(build), "-o", str(exported))
    loaded = transformers.AutoTokenizer.from_pretrained(exported)
    ran = _cli("run", str(build), "--text", "the cat sat").stdout.splitlines()[0]  # "input: 12 7 40"
    assert loaded("the cat sat")["input_ids"] == [int(t) for t in ran.removeprefix("input: ").split()]

    data = tmp_path / "piqa.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in _questions()))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_piqa.yaml").write_text(TASK_YAML.format(data=data))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "HF_HOME": str(tmp_path / "hf-home")}
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={exported},dtype=float32",
               "--tasks", "local_piqa", "--include_path", str(tmp_path / "tasks"), "--device", "cpu", "--batch_size",
               "4", "--output_path", str(tmp_path / "lm-eval")]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = json.loads(next((tmp_path / "lm-eval").rglob("results_*.json")).read_text())
    theirs = results["results"]["local_piqa"]["acc,none"]

    ours = json.loads(_cli("eval", str(build), "--task", str(data), "--format", "piqa", "--json").stdout)
    assert ours["questions"] == 24 and ours["accuracy"] == pytest.approx(theirs, abs=1e-12)
    assert 0 < theirs < 1  # both answers occur: the comparison can fail
