"""A received tokenizer is data with a bounded cost (attnspec/tokenizer_worker.py): its library runs in a
child process under time and memory allowances of each request's size.

* the structures of real tokenizers (trained BPE, Llama-3's and Qwen2's splits, Llama-2's SentencePiece
  BPE) give exactly the library's ids and text, through the process, in batches and alone;
* the audit's three hostile files end in a TokenizerError naming the file, in bounded time, at every
  entry: the Python API, ``build --tokenizer`` then ``run --text`` and ``eval --text``, ``task: text``
  corpora, and a transformers checkpoint carrying the file through ``import-hf``;
* after a failure, the same Tokenizer works again (a fresh process).
"""

from __future__ import annotations

import json
import time

import pytest

from attnspec import tokenizer_worker as worker
from attnspec.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from tests.conftest import ROOT
from tests.test_cli import attnspec as run_cli
from tests.tokenizer_files import REAL, SAMPLE, topics, write_tokenizer

pytest.importorskip("tokenizers")

PANIC = "a" * 40 + "!"
"""Past the regex engine's retry limit on ``(a|aa)+$``: the library panics."""
SLOW = ("a" * 26 + "b ") * 1500
"""42 KB of runs of ``a`` below that limit: ~0.1 s each, minutes in all."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: write_tokenizer(root / f"{name}.json", name) for name in (*REAL, "backtracking", "multiplying")}


@pytest.mark.parametrize("structure", REAL)
def test_real_structures_give_the_library_s_ids_and_text_through_the_process(files, structure):
    from tokenizers import Tokenizer as Library

    library = Library.from_file(str(files[structure]))
    loaded = load_tokenizer(files[structure])
    texts = [SAMPLE, "", " ", "\n\n", *topics()[:20]]
    expected = [e.ids for e in library.encode_batch(texts, add_special_tokens=False)]
    assert loaded.encode_batch(texts) == expected
    assert [loaded.encode(t) for t in texts[:4]] == expected[:4]
    assert loaded.decode(expected[0]) == library.decode(expected[0])
    assert loaded.eos == "<|endoftext|>" and loaded.eos_id == library.token_to_id("<|endoftext|>")
    assert loaded.vocab_size == library.get_vocab_size(with_added_tokens=True)


def test_requests_are_split_by_size_and_answers_keep_their_order(files, monkeypatch):
    import attnspec.tokenizer as module

    monkeypatch.setattr(module, "REQUEST_BYTES", 64)  # every few documents a request of their own
    loaded = load_tokenizer(files["bpe"])
    texts = [SAMPLE[: n] for n in range(0, len(SAMPLE), 7)]
    assert loaded.encode_batch(texts) == [loaded.encode(t) for t in texts]


def test_a_backtracking_pattern_is_stopped_at_its_time_allowance_and_the_tokenizer_works_again(files, monkeypatch):
    monkeypatch.setattr(worker, "TIME_FLOOR", 1.0)
    loaded = load_tokenizer(files["backtracking"])
    allowed = worker.time_allowance(len(SLOW))
    start = time.monotonic()
    with pytest.raises(TokenizerError, match=r"backtracking\.json: tokenising 42,000 bytes took over \d+ s"):
        loaded.encode(SLOW)
    assert time.monotonic() - start < allowed + 5
    assert loaded.encode("hello b") == load_tokenizer(files["backtracking"]).encode("hello b")  # a new process


def test_a_library_panic_is_a_tokenizer_error_naming_the_file(files):
    loaded = load_tokenizer(files["backtracking"])
    with pytest.raises(TokenizerError, match=r"backtracking\.json: tokenising 41 bytes failed in the tokenizer "
                                             r"library: PanicException: .*retry-limit"):
        loaded.encode(PANIC)
    assert loaded.encode_batch(["b b"]) == [loaded.encode("b b")]  # the panic did not take the process down


def test_a_multiplying_normalizer_dies_at_its_memory_allowance(files):
    loaded = load_tokenizer(files["multiplying"])
    with pytest.raises(TokenizerError, match=r"multiplying\.json: tokenising 4 bytes stopped the tokenizer \(killed "
                                             r"by SIGABRT: .*memory allocation .* 512 MiB"):
        loaded.encode("aaaa")
    from tokenizers import Tokenizer as Library  # a fresh process answers what the library does in-process

    assert loaded.encode("bbb") == Library.from_file(str(files["multiplying"])).encode("bbb").ids != []


def test_a_tiktoken_encoding_named_for_a_tokenizer_json_is_refused(files):
    with pytest.raises(TokenizerError, match="`encoding` names a tiktoken encoding"):
        load_tokenizer(files["bpe"], encoding="cl100k_base")


def test_answers_are_checked_against_the_request(files, monkeypatch):
    loaded = load_tokenizer(files["bpe"])
    assert loaded.decode([1, 5000]) == loaded.decode([1])  # past the vocabulary: skipped, as the library does
    with pytest.raises(TokenizerError, match="cannot decode -1, not a token id"):
        loaded.decode([1, -1])
    monkeypatch.setattr(worker, "IDS_PER_BYTE", 0)  # an answer of more ids than that is refused
    with pytest.raises(TokenizerError, match="gave an answer larger than any real tokenizer's"):
        loaded.encode("x" * 2000)
    with pytest.raises(TokenizerError, match="not valid Unicode"):
        loaded.encode("\ud800")


def test_a_tokenizer_is_plain_data_and_its_file_is_checked_when_its_process_restarts(files, tmp_path):
    import copy

    import attnspec.tokenizer as module

    path = tmp_path / "tokenizer.json"
    path.write_bytes(files["bpe"].read_bytes())
    loaded = load_tokenizer(path)
    assert copy.deepcopy(loaded) == loaded and isinstance(loaded, Tokenizer)
    module._stop_processes()
    assert loaded.encode("the") == copy.deepcopy(loaded).encode("the")
    module._stop_processes()
    path.write_bytes(files["llama3"].read_bytes())
    with pytest.raises(TokenizerError, match="changed since it was read"):
        loaded.encode("the")


def _cli(*args: str, expect: int):
    result = run_cli(*args)
    assert result.returncode == expect, result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "panicked" not in result.stderr
    if expect == 2:  # one located line
        assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    return result


@pytest.mark.slow
def test_every_entry_ends_a_hostile_tokenizer_in_one_located_line(files, tmp_path):
    """``build --tokenizer`` keeps the file (it is data); ``run --text`` and ``eval --text`` on its build,
    a ``task: text`` corpus and an ``import-hf`` of a checkpoint carrying it end in one line, exit 2."""
    build = tmp_path / "build"
    _cli("build", str(ROOT / "specs" / "softmax-transformer.yaml"), "-o", str(build), "--no-compile", "--no-calibrate",
         "--set", "d_model=32", "--set", "layers[0].repeat=1", "--set", "max_len=32", "--set", "input.vocab_size=1000",
         "--tokenizer", str(files["backtracking"]), expect=0)
    ran = _cli("run", str(build), "--text", PANIC, expect=2)
    assert "tokenizer.json: tokenising 41 bytes failed in the tokenizer library" in ran.stderr
    (tmp_path / "text.txt").write_text("x " + PANIC)
    scored = _cli("eval", str(build), "--text", str(tmp_path / "text.txt"), expect=2)
    assert "failed in the tokenizer library" in scored.stderr

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the aaaa cat\n")
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"task": {"kind": "text", "path": str(corpus), "tokenizer": str(files["multiplying"]),
                                           "seq_len": 16}, "steps": 1, "batch_size": 1}))
    trained = _cli("train", str(build / "spec.yaml"), "--config", str(config), "-o", str(tmp_path / "run"), expect=2)
    assert "multiplying.json: tokenising" in trained.stderr and "stopped the tokenizer" in trained.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_import_hf_carries_a_hostile_tokenizer_as_data_and_running_it_is_an_error(files, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    checkpoint = tmp_path / "llama"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                                 num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=32)
                     ).save_pretrained(checkpoint)
    (checkpoint / "tokenizer.json").write_bytes(files["multiplying"].read_bytes())
    _cli("import-hf", str(checkpoint), "-o", str(tmp_path / "build"), "--no-compile", "--no-calibrate", expect=0)
    ran = _cli("run", str(tmp_path / "build"), "--text", "aaaa", expect=2)
    assert "stopped the tokenizer" in ran.stderr
