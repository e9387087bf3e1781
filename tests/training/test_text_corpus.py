"""Text corpora through local tokenizers (``task: text``): tokenised once into a cached token file, packed
documents computed as if alone, padded rows, and the tokenizer's identity guarding resumes.

The tokenizers are trained here with the `tokenizers` library on a corpus the test writes; nothing is
downloaded.
"""

from __future__ import annotations

import hashlib
import random

import pytest
import torch
import torch.nn.functional as F

import attnspec
from attnspec.errors import RunError
from attnspec.tokenizer import TokenizerError, load_tokenizer
from attnspec.tokenizer_worker import open_library
from attnspec.training.tasks import IGNORE, TaskError, TextTask

WORDS = ("the cat sat on a mat while dogs ran past quiet rivers under green hills and small birds sang "
         "songs of old stories told by wise people in far lands").split()


def write_corpus(directory, documents: int = 40, seed: int = 0):
    """``documents`` files of 5 to 60 random words each, one document per file."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(documents):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 60))]
        (directory / f"doc{i:03d}.txt").write_text(" ".join(words) + ".\n")
    return directory


def train_tokenizer(path, corpus, vocab: int = 96):
    """A byte-level BPE tokenizer with an end-of-text token, trained on ``corpus``'s files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(p) for p in sorted(corpus.iterdir())], trainer)
    tokenizer.save(str(path))
    return path


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    root = write_corpus(tmp_path / "corpus")
    return root, train_tokenizer(tmp_path / "tokenizer.json", root, vocab=300)


def _task(root, tokenizer, **fields):
    return TextTask.model_validate({"kind": "text", "path": str(root), "tokenizer": str(tokenizer), "seq_len": 48,
                                    **fields})


def test_a_corpus_is_tokenised_once_and_split_by_documents(corpus):
    root, tokenizer = corpus
    calls = []
    task = _task(root, tokenizer)
    task.prepare(lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1]  # progress up to every byte
    loaded = load_tokenizer(tokenizer)
    data = task.corpus()
    assert data.meta["documents"] == 40 and data.meta["split_documents"] == {"train": 36, "val": 4}
    # the training part is the first 36 files' ids, each document followed by the end-of-document id
    expected = []
    for file in sorted(root.iterdir())[:36]:
        expected += loaded.encode(file.read_text()) + [loaded.eos_id]
    assert data.tokens["train"].tolist() == expected
    again = _task(root, tokenizer)
    again.prepare(lambda done, total: calls.append("again"))
    assert "again" not in calls and again.corpus().key == data.key  # read from the cache
    (root / "doc000.txt").write_text("a changed document.\n")
    changed = _task(root, tokenizer)
    assert changed.corpus().key != data.key  # the cache is keyed by content


def test_packed_rows_score_as_each_document_alone(corpus):
    """The loss of a packed batch (documents from the end-of-document ids, no target at them) equals the
    loss of its documents run one by one."""
    root, tokenizer = corpus
    task = _task(root, tokenizer)
    spec = {"name": "lm", "input": {"kind": "tokens", "vocab_size": task.vocab_size}, "d_model": 16, "max_len": 64,
            "dtype": "float64", "layers": [{"mixer": {"kind": "linear", "heads": 2, "transition": {"kind": "data"}}},
                                           {"mixer": {"kind": "softmax", "heads": 2, "position": {"kind": "rope"}}}]}
    model = attnspec.build(spec)
    inputs, targets = task.batch("train", 0, 4, seed=0)
    eos = load_tokenizer(tokenizer).eos_id
    assert (inputs == eos).any() and bool((targets[inputs == eos] == IGNORE).all())
    documents = task.documents(inputs)
    packed = F.cross_entropy(model(inputs, documents=documents).flatten(0, 1), targets.flatten(),
                             ignore_index=IGNORE, reduction="sum")
    alone = 0.0
    for row in range(4):
        starts = documents.starts[row].nonzero().flatten().tolist() + [inputs.shape[1]]
        for start, end in zip(starts, starts[1:]):
            logits = model(inputs[row:row + 1, start:end])[0]
            alone += F.cross_entropy(logits, targets[row, start:end], ignore_index=IGNORE, reduction="sum")
    assert abs(float(packed.detach()) - float(alone.detach())) < 1e-9 * float(alone.detach())


def test_padded_rows_hold_one_document_from_its_start(corpus):
    root, tokenizer = corpus
    task = _task(root, tokenizer, packing="pad")
    eos = load_tokenizer(tokenizer).eos_id
    inputs, targets = task.batch("test", 0, 4, seed=0)
    data, starts = task.corpus().tokens["test"], task.corpus().starts["test"]
    first = data[int(starts[0]):int(starts[1])].tolist()  # the first test document and its end-of-document id
    assert inputs[0, :min(len(first), 48)].tolist() == first[:48]
    answered = targets[0] != IGNORE
    assert int(answered.sum()) == min(len(first) - 1, 48)  # its own next tokens, up to its end-of-document id
    assert bool((inputs[0, len(first):] == eos).all())  # padding


def test_a_run_records_the_tokenizer_and_refuses_to_resume_with_another(corpus, tmp_path):
    root, tokenizer = corpus
    spec = {"name": "lm", "input": {"kind": "tokens", "vocab_size": 300}, "d_model": 16, "max_len": 48,
            "layers": [{"mixer": {"kind": "delta", "heads": 2}}]}
    config = {"task": {"kind": "text", "path": str(root), "tokenizer": str(tokenizer), "seq_len": 32},
              "steps": 4, "batch_size": 2, "eval_every": 0, "checkpoint_every": 2, "test_examples": 4}
    run = attnspec.train(spec, config, output=tmp_path / "run", stop_after=2)
    record = attnspec.io.read_run(tmp_path / "run")
    recorded = record["data"]
    assert recorded["tokenizer"] == load_tokenizer(tokenizer).identity() and run.step == 2
    assert record["plan"]["packed_documents"] is True  # planned for the resets packing adds
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    train_tokenizer(tokenizer, write_corpus(tmp_path / "other", seed=1), vocab=280)  # the same path, other merges
    with pytest.raises(RunError, match="trained on other data"):
        attnspec.train(None, resume=True, output=tmp_path / "run")


def test_a_tokenizer_that_cannot_be_read_is_a_clear_error(tmp_path, corpus):
    root, _ = corpus
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a Hugging Face tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(TaskError, match="no such tokenizer file"):
        _task(root, tmp_path / "missing.json").vocab_size
    lonely = train_tokenizer(tmp_path / "plain.json", root)
    with pytest.raises(TokenizerError, match="has no end-of-document token `</s>`"):
        load_tokenizer(lonely, eos="</s>")


def test_a_local_tiktoken_file_is_read_with_its_encodings_pattern(tmp_path, monkeypatch):
    """tiktoken's own definition of an encoding runs with the local file in place of its download; a file
    that is not that encoding's (by the hash the definition expects) is refused."""
    import base64

    tiktoken_ext = pytest.importorskip("tiktoken_ext.openai_public")
    ranks = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the"]
    path = tmp_path / "r50k_base.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in enumerate(ranks)))
    with pytest.raises(TokenizerError, match="not the r50k_base merges file"):
        load_tokenizer(path)

    original = tiktoken_ext.r50k_base

    def unchecked():  # r50k_base's pattern over the local merges, its hash not checked; attnspec's loader runs
        real = tiktoken_ext.load_tiktoken_bpe
        tiktoken_ext.load_tiktoken_bpe = lambda source, expected_hash=None: real(source)
        try:
            definition = original()
        finally:
            tiktoken_ext.load_tiktoken_bpe = real
        definition["special_tokens"] = {"<|endoftext|>": len(ranks)}
        definition.pop("explicit_n_vocab", None)
        return definition

    # the tokenizer process's own loader, run here: a monkeypatched encoding exists in this process only
    monkeypatch.setitem(tiktoken_ext.ENCODING_CONSTRUCTORS, "tiny", unchecked)
    raw = path.read_bytes()
    loaded, facts = open_library("tiktoken", raw, None, None, "tiny", hashlib.sha256(raw).hexdigest())
    ids = loaded.encode_batch(["the theme"])[0]
    assert ids[0] == 257 and loaded.decode(ids) == "the theme"
    assert facts == {"vocab_size": len(ranks) + 1, "eos": "<|endoftext|>", "eos_id": len(ranks), "encoding": "tiny",
                     "bos": None, "bos_id": None}  # a tiktoken encoding names no beginning-of-sequence token


@pytest.mark.slow
def test_the_shipped_text_example_trains_two_mixers_packed_and_streamed_and_reports(tmp_path, monkeypatch):
    """examples/text/packed_lm.py at toy size: the Python documentation's topics, a tokenizer trained on them,
    softmax and GLA with packed and streamed documents, a report with a row each."""
    import importlib.util

    from tests.conftest import ROOT

    monkeypatch.setenv("ATTNSPEC_CACHE_DIR", str(tmp_path / "cache"))
    source = importlib.util.spec_from_file_location("packed_lm", ROOT / "examples" / "text" / "packed_lm.py")
    example = importlib.util.module_from_spec(source)
    source.loader.exec_module(example)
    report = example.main([str(tmp_path / "out"), "--steps", "2", "--seeds", "1", "--d-model", "16", "--seq-len",
                           "32", "--vocab-size", "300", "--lr", "0.01", "--workers", "1"])
    rows = [line for line in report.read_text().splitlines() if line.startswith(("| softmax", "| gla"))]
    assert len(rows) >= 4 and {"packing=pack", "packing=stream"} <= {row.split(" | ")[2] for row in rows}
    assert len(list((tmp_path / "out" / "corpus").iterdir())) == 79


def _damage(entry, how: str) -> str:
    """Damage a corpus cache entry as the audit did; the words its refusal names."""
    import json as json_module
    import os

    import numpy as np

    meta = json_module.loads((entry / "corpus.json").read_text())
    if how == "truncated":
        data = (entry / "train.bin").read_bytes()
        (entry / "train.bin").write_bytes(data[: len(data) // 10])
        return "train.bin holds"
    if how == "dtype":
        meta["dtype"] = "uint32"  # the ids are uint16: read as uint32 they are other ids, half as many
        (entry / "corpus.json").write_text(json_module.dumps(meta))
        return "train.bin holds"
    if how in ("past", "negative", "unordered"):
        starts = np.fromfile(entry / "train.starts.bin", dtype=np.int64)
        starts[-1] = {"past": 10 ** 9, "negative": -5, "unordered": 1}[how]
        starts.tofile(entry / "train.starts.bin")
        return "document starts not increasing"
    if how == "empty-starts":
        (entry / "train.starts.bin").write_bytes(b"")
        return "train.starts.bin holds 0 bytes"
    if how == "fifo":
        (entry / "train.bin").unlink()
        os.mkfifo(entry / "train.bin")
        return "train.bin is not a regular file"
    if how == "id":
        data = np.fromfile(entry / "val.bin", dtype=np.uint16)
        data[0] = 65000
        data.tofile(entry / "val.bin")
        return "val.bin holds id 65,000"
    if how == "counts":
        meta["tokens"] = {"train": "many"}
        (entry / "corpus.json").write_text(json_module.dumps(meta))
        return "lacks its dtype or its counts"
    raise ValueError(how)


@pytest.mark.parametrize("packing", ["pack", "pad"])
@pytest.mark.parametrize("how", ["truncated", "dtype", "past", "negative", "unordered", "empty-starts", "fifo", "id",
                                 "counts"])
def test_a_damaged_cache_entry_is_refused_before_training_by_what_is_wrong(corpus, how, packing):
    """Each file of the entry is checked against corpus.json (sizes from its counts and dtype, starts
    increasing from 0 within the data, ids within the vocabulary, regular files) before a batch is drawn;
    before, a truncated train.bin trained on a tenth of the corpus with exit 0, and a FIFO blocked."""
    root, tokenizer = corpus
    entry = _task(root, tokenizer).corpus()
    directory = next((p for p in (root.parent / "cache" / "corpora").iterdir() if p.name == entry.key))
    words = _damage(directory, how)
    with pytest.raises(TaskError, match="a damaged corpus cache entry") as refused:
        _task(root, tokenizer, packing=packing).batch("train", 0, 2, seed=0)
    assert words in str(refused.value) and "remove it" in str(refused.value)


def test_a_one_document_corpus_whose_val_fraction_leaves_nothing_to_train_on_names_it(tmp_path, corpus):
    _, tokenizer = corpus
    (tmp_path / "one.txt").write_text("the cat sat on a mat while dogs ran.\n")
    with pytest.raises(TaskError, match=r"one document of \d+ tokens, and val_fraction 0.999 leaves 0 of them to "
                                        r"train on .* choose another val_fraction"):
        _task(tmp_path / "one.txt", tokenizer, val_fraction=0.999).corpus()


def test_a_jsonl_line_nested_past_the_parser_s_stack_is_located(tmp_path, corpus):
    _, tokenizer = corpus
    (tmp_path / "deep.jsonl").write_text('{"text": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TaskError, match=r"deep.jsonl:2: not a JSON object"):
        _task(tmp_path / "deep.jsonl", tokenizer).corpus()
