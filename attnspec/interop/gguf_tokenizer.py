"""A GGUF file's tokenizer as a Hugging Face ``tokenizer.json``, built as transformers' GGUF loader builds it.

A GGUF file carries its tokenizer as arrays: the tokens, their types (control, user-defined, ...), BPE
merges or SentencePiece scores, and the special ids. transformers turns them into a fast tokenizer by
model kind (``tokenizer.ggml.model``): byte-level BPE for ``gpt2`` (the tokens spelled in GPT-2's byte
alphabet, the file's merges, a split pattern chosen by ``tokenizer.ggml.pre``), byte-fallback BPE for a
SentencePiece ``llama`` vocabulary (merges recovered from the vocabulary; Gemma's ranked by the tokens'
order in the file, whose scores do not follow its merges), control tokens added as special tokens and
user-defined ones as plain added tokens. This module writes the same ``tokenizer.json`` as data (no
tokenizer library runs here: the file is loaded, like any received tokenizer, in attnspec's tokenizer
process), so the import's token ids are the ones transformers' model of the same file is checked on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from attnspec.errors import InteropError, shorten

CONTROL, USER_DEFINED = 3, 4
"""``tokenizer.ggml.token_type`` values (llama.cpp's)."""

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
          "dbrx": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
"""``tokenizer.ggml.pre`` -> the pattern byte-level BPE splits text with before merging (transformers' table,
for the vocabularies of the architectures attnspec imports); any other keeps GPT-2's own pattern."""
GEMMA = ("gemma", "gemma2", "gemma3")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte as a printable character (byte-level BPE's spelling)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes)}


def _merges_from_vocabulary(vocab: dict[str, int], scores: dict[str, float]) -> list[list[str]]:
    """BPE merges recovered from a SentencePiece vocabulary: every split of a token into two tokens, best
    score first (then shorter left and right parts), as transformers' ``generate_merges`` orders them."""
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[left, right] for left, right, _ in merges]


def _added(tokens: list[str], types: list[int], vocab: dict[str, int], alphabet: set[str] | None) -> list[dict]:
    """Control tokens as special added tokens (a byte-level vocabulary's only where spelled in its alphabet,
    as transformers skips llama.cpp's mislabels), user-defined ones as plain added tokens."""
    found = []
    for index, (token, kind) in enumerate(zip(tokens, types)):
        if kind == CONTROL and (alphabet is None or set(token) <= alphabet) or kind == USER_DEFINED:
            found.append({"id": vocab.get(token, index), "content": token, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": kind == CONTROL})
    unique = {entry["content"]: entry for entry in found}
    return sorted(unique.values(), key=lambda entry: entry["id"])


def tokenizer_json(metadata: dict, source: str) -> tuple[dict, str, str | None]:
    """The ``tokenizer.json`` of a GGUF file's tokenizer metadata, its end-of-document token and its
    beginning-of-sequence token (None where the file names none: transformers' ``bos_token``).

    Raises:
        InteropError: no tokenizer, a kind other than byte-level BPE (``gpt2``) or SentencePiece BPE
            (``llama``), or arrays that do not agree.
    """
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise InteropError(f"{source}: holds no tokenizer (tokenizer.ggml.model and tokenizer.ggml.tokens)")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise InteropError(f"{source}: tokenizer.ggml.tokens is not a list of strings")
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise InteropError(f"{source}: tokenizer.ggml.token_type has {len(types):,} entries for {len(tokens):,} tokens")
    special = {}
    for name in ("bos", "eos", "unknown", "padding"):
        index = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tokens):
                raise InteropError(f"{source}: tokenizer.ggml.{name}_token_id {shorten(index)} is not a token")
            special[name] = tokens[index]
    if "eos" not in special:
        raise InteropError(f"{source}: states no end-of-document token (tokenizer.ggml.eos_token_id)")
    architecture = metadata.get("general.architecture")
    if kind == "gpt2":
        spelling = _bytes_to_unicode()
        alphabet = set(spelling.values())
        spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
        vocab = {token: index for index, token in enumerate(spelled)}
        merges = metadata.get("tokenizer.ggml.merges")
        if not isinstance(merges, list) or not all(isinstance(m, str) and m.count(" ") == 1 for m in merges):
            raise InteropError(f"{source}: tokenizer.ggml.merges must list merges as 'left right'")
        split = SPLITS.get(metadata.get("tokenizer.ggml.pre"))
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        pre = byte_level if split is None else {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {**byte_level, "use_regex": False}]}
        data = {"normalizer": None, "pre_tokenizer": pre,
                "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                          "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                          "ignore_merges": False, "vocab": vocab, "merges": [m.split(" ") for m in merges]}}
        added = _added(tokens, types, vocab, alphabet)
    elif kind == "llama" and architecture in GEMMA:
        spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        vocab = {token: index for index, token in enumerate(spelled)}
        order = {token: -index for index, token in enumerate(spelled)}  # Gemma's merges follow the file's order
        unk = special.get("unknown", "<unk>")
        data = {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                                  "invert": False},
                "decoder": {"type": "Sequence", "decoders": [
                    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                    {"type": "Fuse"}]},
                "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                          "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                          "ignore_merges": False, "vocab": vocab, "merges": _merges_from_vocabulary(vocab, order)}}
        added = _added(spelled, types, vocab, None)
    else:
        raise InteropError(f"{source}: tokenizer.ggml.model {shorten(kind)} of a {shorten(architecture)} model: "
                           "attnspec builds byte-level BPE (gpt2) and Gemma's SentencePiece tokenizers from GGUF")
    bos = special.get("bos") if metadata.get("tokenizer.ggml.add_bos_token") else None
    single = [{"Sequence": {"id": "A", "type_id": 0}}]
    processor = {"type": "TemplateProcessing", "single": single,
                 "pair": [*single, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}}
    if bos is not None:  # the tokenizer adds the BOS token to a text, as transformers' does for this file
        start = [{"SpecialToken": {"id": bos, "type_id": 0}}]
        processor = {"type": "TemplateProcessing", "single": [*start, *single],
                     "pair": [*start, *single, {"SpecialToken": {"id": bos, "type_id": 1}},
                              {"Sequence": {"id": "B", "type_id": 1}}],
                     "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}
    document = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                "normalizer": data["normalizer"], "pre_tokenizer": data["pre_tokenizer"],
                "post_processor": processor, "decoder": data["decoder"], "model": data["model"]}
    named = {token: spelling for token, spelling in zip(tokens, spelled) if token in special.values()}
    return document, named[special["eos"]], named.get(special.get("bos"))


def gguf_tokenizer(checkpoint):
    """The tokenizer of an opened GGUF checkpoint (:class:`attnspec.interop.gguf.GGUFCheckpoint`), written
    as a ``tokenizer.json`` into attnspec's cache (named by its content) and loaded as any tokenizer file
    (:func:`attnspec.tokenizer.load_tokenizer`).

    Raises:
        InteropError: the file's tokenizer cannot be built (:func:`tokenizer_json`).
        TokenizerError: the tokenizer library refuses what was built.
    """
    from attnspec.io import cache_directory, write_atomic
    from attnspec.tokenizer import load_tokenizer

    document, eos, bos = tokenizer_json(checkpoint.file.metadata, str(checkpoint.path))
    raw = json.dumps(document, ensure_ascii=False).encode("utf-8")
    directory = cache_directory() / "gguf-tokenizers"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{hashlib.sha256(raw).hexdigest()[:32]}.json"
    if not path.is_file() or path.read_bytes() != raw:
        write_atomic(path, raw)
    return load_tokenizer(Path(path), eos=eos, bos=bos)


__all__ = ["SPLITS", "gguf_tokenizer", "tokenizer_json"]
