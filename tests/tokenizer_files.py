"""Tokenizer files with the structures real ones have, and the audit's hostile ones, written here.

Real structures (each trained with the ``tokenizers`` library on the Python documentation's topics, which
every Python ships; nothing is downloaded):

* ``bpe``: byte-level BPE as GPT-2's (ByteLevel pre-tokenizer with its own split);
* ``llama3``: Llama-3's tokenizer.json shape: a ``Split`` on Llama-3's pattern (digits in threes), then
  ByteLevel without its regex;
* ``qwen2``: Qwen2's: an NFC normalizer, a ``Split`` on Qwen2's pattern (single digits), ByteLevel;
* ``llama2``: Llama-2's SentencePiece-style BPE: normalizers ``Prepend("▁")`` and ``Replace(" ", "▁")``,
  no pre-tokenizer, byte fallback, and its decoder sequence.

Hostile (the audit's): ``backtracking`` splits on ``(a|aa)+$`` first (exponential in a run of ``a`` not at
the end; the regex engine's retry limit makes it panic on 40 ``a`` and a ``!``); ``multiplying`` chains 8
``Replace("a" -> "aaaaaaaaaa")`` normalizers (10^8 characters per ``a``).
"""

from __future__ import annotations

import json
from pathlib import Path

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
EOS = "<|endoftext|>"
REAL = ("bpe", "llama3", "qwen2", "llama2")
HOSTILE = ("backtracking", "multiplying")


def topics() -> list[str]:
    """The Python documentation's topics (about 465 KB of English and code), in a fixed order."""
    import pydoc_data.topics

    return [pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)]


def _split(pattern: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def write_tokenizer(path: Path, structure: str, vocab: int = 1000) -> Path:
    """Write a tokenizer.json of ``structure`` (one of :data:`REAL` or :data:`HOSTILE`) to ``path``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if structure == "llama2":
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>", EOS],
                                      show_progress=False, initial_alphabet=[f"<0x{b:02X}>" for b in range(256)])
        # trained on words (a pre-tokenizer on metaspace), then used as Llama-2's file is: none
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
        tokenizer.train_from_iterator(topics(), trainer)
        tokenizer.pre_tokenizer = None
        tokenizer.save(str(path))
        return path
    tokenizer = Tokenizer(models.BPE())
    tokenizer.decoder = decoders.ByteLevel()
    if structure == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(topics(), trainer)
    tokenizer.save(str(path))
    data = json.loads(path.read_text())
    if structure == "llama3":
        data["pre_tokenizer"] = _split(LLAMA3_PATTERN)
    elif structure == "qwen2":
        data["pre_tokenizer"] = _split(QWEN2_PATTERN)
    elif structure == "backtracking":
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False},
            data["pre_tokenizer"]]}
    elif structure == "multiplying":
        data["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": "a"}, "content": "a" * 10}] * 8}
    elif structure != "bpe":
        raise ValueError(structure)
    path.write_text(json.dumps(data))
    return path


SAMPLE = ("The quick brown fox's 12345 jumps\n\n  over   the lazy dog; naïve café, 東京 2024年, "
          "tabs\tand\r\nlines, emoji 🙂 and U+FDFA ﷺ, code: def f(x): return x**2  # end   ")
"""A text with what the patterns treat differently: contractions, digit runs, whitespace runs, CJK, emoji."""
