"""A local text corpus, tokenised once into a cached, memory-mapped token file.

A corpus is a file or a directory of files (walked in sorted order; hidden files and symlinks skipped).
Its documents: each line's ``text`` of a ``.jsonl`` file, else each file (split at ``separator`` where one
is given). Each document is tokenised and followed by the tokenizer's end-of-document id, and the
documents are laid end to end: ``train.bin`` and ``val.bin`` (uint16 ids, or uint32 for vocabularies over
65,536, nanoGPT's layout), ``train.starts.bin`` and ``val.starts.bin`` (int64 offsets where each document
begins), and ``corpus.json`` (what was tokenised, by what, how much). The validation part is the last
``val_fraction`` of the documents (of the tokens, for a corpus of one document).

The cache entry is keyed by the SHA-256 of every file's content, the tokenizer's identity and the
splitting options, so a changed corpus or another tokenizer makes a new entry and a cached one is never
stale; entries are written into a scratch directory renamed into place, so concurrent runs and
interrupted ones leave no half-written corpus.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from attnspec.errors import AttnSpecError, shorten
from attnspec.io import VERSION, cache_directory, read_json, write_atomic
from attnspec.tokenizer import Tokenizer
from attnspec.training.tasks.base import MAX_DATA_BYTES, TaskError

FORMAT = 1
"""The cache entry's layout; a new one makes new entries."""
MAX_DOCUMENTS = 1 << 26
ENCODE_BATCH = 256
"""Documents tokenised per call (the tokenizers' batch encoders run them in parallel)."""
Progress = Callable[[int, int], None]
"""``progress(bytes done, bytes in all)``, called as the corpus is tokenised."""


@dataclass(frozen=True)
class Corpus:
    """A tokenised corpus: ``tokens[split]`` (memory-mapped ids) and ``starts[split]`` (int64 offsets of its
    documents), for splits ``train`` and ``test``; ``key`` names its cache entry; ``meta`` is its
    ``corpus.json``."""

    tokens: dict[str, np.ndarray]
    starts: dict[str, np.ndarray]
    key: str
    meta: dict


def _lstat(path: Path) -> os.stat_result | None:
    """``path``'s own status (a link is not followed); None where it does not exist; a TaskError where
    it cannot be read (``/proc/1/cwd`` raised PermissionError from ``is_file``)."""
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise TaskError(f"{path}: cannot be read ({error.strerror}); fix its permissions or move it out of the "
                        "data directory") from None


def read_bytes(file: Path) -> bytes:
    """A data file's bytes, or a TaskError saying why it cannot be read."""
    try:
        return file.read_bytes()
    except OSError as error:
        raise TaskError(f"{file}: cannot be read ({error.strerror}); fix its permissions or move it out of the "
                        "data directory") from None


def file_size(file: Path) -> int:
    try:
        return file.stat().st_size
    except OSError as error:
        raise TaskError(f"{file}: cannot be read ({error.strerror})") from None


def regular_files(root: Path) -> list[Path]:
    """The regular files at ``root`` (a file, or a directory walked in sorted order, no symlinks)."""
    status = _lstat(root)
    if status is None:
        raise TaskError(f"{root}: no such file or directory")
    if stat.S_ISLNK(status.st_mode):
        raise TaskError(f"{root}: is a symbolic link; give the file or directory itself")
    if stat.S_ISREG(status.st_mode):
        return [root]
    if not stat.S_ISDIR(status.st_mode):
        raise TaskError(f"{root}: not a regular file or a directory")
    files = []

    def refuse(error: OSError) -> None:  # an unreadable folder is an error, not a silently smaller corpus
        raise TaskError(f"{error.filename}: cannot be read ({error.strerror}); fix its permissions or move it out "
                        "of the data directory")

    for directory, subdirs, names in os.walk(root, onerror=refuse):
        subdirs.sort()
        for name in sorted(names):
            path = Path(directory) / name
            status = _lstat(path)
            if status is not None and stat.S_ISREG(status.st_mode) and not name.startswith("."):
                files.append(path)
    if not files:
        raise TaskError(f"{root}: holds no files")
    return files


def _documents(file: Path, data: bytes, separator: str | None, text_field: str) -> Iterator[str]:
    """The documents of one file (see the module doc)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TaskError(f"{file}: not UTF-8 text ({shorten(str(error), 100)})") from None
    if file.suffix == ".jsonl":
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except (ValueError, RecursionError) as error:  # nesting deep enough to exhaust the parser's stack
                raise TaskError(f"{file}:{number}: not a JSON object ({shorten(str(error), 80)})") from None
            if not isinstance(item, dict) or not isinstance(item.get(text_field), str):
                raise TaskError(f"{file}:{number}: a JSON-lines corpus has an object per line with the document in "
                                f"`{text_field}` (a string); set `text_field` to the field it uses")
            if item[text_field]:
                yield item[text_field]
    elif separator:
        yield from (part for part in text.split(separator) if part.strip())
    elif text.strip():
        yield text


def corpus_key(files: list[Path], root: Path, tokenizer: Tokenizer, separator: str | None, text_field: str,
               val_fraction: float) -> str:
    """The cache key: every file's relative path and content hash, the tokenizer, the options."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": FORMAT, "tokenizer": tokenizer.identity(), "separator": separator,
                              "text_field": text_field, "val_fraction": val_fraction}, sort_keys=True).encode())
    for file in files:
        name = file.name if file == root else file.relative_to(root).as_posix()
        digest.update(name.encode() + b"\0" + hashlib.sha256(read_bytes(file)).digest())
    return digest.hexdigest()


def tokenized(root: Path | str, tokenizer: Tokenizer, *, separator: str | None = None, text_field: str = "text",
              val_fraction: float = 0.1, progress: Progress | None = None) -> Corpus:
    """The corpus at ``root`` tokenised with ``tokenizer``: from the cache, or tokenised now (calling
    ``progress`` as it goes) and cached. Raises TaskError for a corpus that is missing, unreadable, not
    UTF-8, over :data:`MAX_DATA_BYTES`, or holds no document."""
    root = Path(root)
    files = regular_files(root)
    total = sum(file_size(f) for f in files)
    if total > MAX_DATA_BYTES:
        raise TaskError(f"{root}: {total:,} bytes, over the limit of {MAX_DATA_BYTES:,} for one corpus; split it")
    key = corpus_key(files, root, tokenizer, separator, text_field, val_fraction)
    entry = cache_directory() / "corpora" / key
    if _lstat(entry) is None:  # an entry is renamed into place whole: one without its corpus.json is damaged
        _tokenize(files, root, tokenizer, entry, separator, text_field, val_fraction, total, progress)
    return _open(entry, key, tokenizer)


def _tokenize(files: list[Path], root: Path, tokenizer: Tokenizer, entry: Path, separator: str | None,
              text_field: str, val_fraction: float, total: int, progress: Progress | None) -> None:
    """Tokenise every document into a scratch directory beside ``entry``, split it, and rename it into place."""
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        lengths: list[int] = []
        done = 0
        with open(scratch / "all.bin", "wb") as out:
            for file in files:
                data = read_bytes(file)
                batch: list[str] = []
                for document in _documents(file, data, separator, text_field):
                    batch.append(document)
                    if len(batch) == ENCODE_BATCH:
                        _write(out, tokenizer, batch, lengths, dtype)
                        batch = []
                _write(out, tokenizer, batch, lengths, dtype)
                if len(lengths) > MAX_DOCUMENTS:
                    raise TaskError(f"{root}: more than {MAX_DOCUMENTS:,} documents")
                done += len(data)
                if progress is not None:
                    progress(done, total)
        if not lengths:
            raise TaskError(f"{root}: holds no document (every file is empty or blank)")
        tokens = np.fromfile(scratch / "all.bin", dtype=dtype)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        if len(lengths) >= 2:  # the last documents are the validation part
            held = min(len(lengths) - 1, max(1, math.ceil(len(lengths) * val_fraction)))
            cut = int(starts[len(lengths) - held])
            parts = {"train": (tokens[:cut], starts[:-held]), "val": (tokens[cut:], starts[-held:] - cut)}
        else:  # one document: the last val_fraction of its tokens
            cut = len(tokens) - max(1, math.ceil(len(tokens) * val_fraction))
            if cut < 2 or len(tokens) - cut < 2:  # each split predicts at least one token from one
                raise TaskError(f"{root}: one document of {len(tokens):,} tokens, and val_fraction {val_fraction} "
                                f"leaves {cut:,} of them to train on and {len(tokens) - cut:,} to validate on (at "
                                "least 2 each); choose another val_fraction or add documents")
            parts = {"train": (tokens[:cut], starts), "val": (tokens[cut:], np.zeros(1, dtype=np.int64))}
        for split, (ids, offsets) in parts.items():
            ids.tofile(scratch / f"{split}.bin")
            offsets.tofile(scratch / f"{split}.starts.bin")
        (scratch / "all.bin").unlink()
        meta = {"format": FORMAT, "attnspec_version": VERSION, "tokenizer": tokenizer.identity(),
                "dtype": np.dtype(dtype).name, "files": len(files), "bytes": total, "documents": len(lengths),
                "tokens": {split: int(len(ids)) for split, (ids, _) in parts.items()},
                "split_documents": {split: int(len(offsets)) for split, (_, offsets) in parts.items()},
                "separator": separator, "text_field": text_field, "val_fraction": val_fraction}
        write_atomic(scratch / "corpus.json", json.dumps(meta, indent=2) + "\n")
        try:
            os.replace(scratch, entry)
        except OSError:  # another process cached the same corpus first: its entry is the same (_open checks it)
            if _lstat(entry) is None:
                raise TaskError(f"{entry}: cannot write the corpus cache entry") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write(out, tokenizer: Tokenizer, batch: list[str], lengths: list[int], dtype) -> None:
    """Append the ids of ``batch``'s documents, each followed by the end-of-document id."""
    if not batch:
        return
    for ids in tokenizer.encode_batch(batch):
        ids.append(tokenizer.eos_id)
        np.asarray(ids, dtype=dtype).tofile(out)
        lengths.append(len(ids))


def _open(entry: Path, key: str, tokenizer: Tokenizer) -> Corpus:
    """The cache entry ``entry``, its files checked against its ``corpus.json`` before anything trains on
    them (a damaged entry, cut short, of another dtype or with starts out of order, would train on other
    data without a word); a TaskError saying to remove it otherwise."""
    def damaged(why: str) -> TaskError:
        return TaskError(f"{entry}: a damaged corpus cache entry ({why}); remove it to tokenise the corpus again")

    try:
        meta = read_json(entry / "corpus.json")
    except AttnSpecError as error:
        raise damaged(shorten(str(error), 120)) from None
    counts = {split: _count(meta, "tokens", name) for split, name in SPLITS}
    documents = {split: _count(meta, "split_documents", name) for split, name in SPLITS}
    dtype = meta.get("dtype") if isinstance(meta, dict) else None
    if dtype not in ("uint16", "uint32") or None in counts.values() or None in documents.values():
        raise damaged("corpus.json lacks its dtype or its counts")
    if meta.get("tokenizer") != tokenizer.identity():
        raise damaged("corpus.json records another tokenizer")
    tokens, starts = {}, {}
    for split, name in SPLITS:
        ids, offsets = entry / f"{name}.bin", entry / f"{name}.starts.bin"
        for path, size in ((ids, counts[split] * np.dtype(dtype).itemsize), (offsets, documents[split] * 8)):
            status = _lstat(path)
            if status is None or not stat.S_ISREG(status.st_mode):  # a FIFO or a device would block or never end
                raise damaged(f"{path.name} is not a regular file")
            if status.st_size != size:
                raise damaged(f"{path.name} holds {status.st_size:,} bytes, corpus.json's counts make {size:,}")
        if counts[split] < 2 or documents[split] < 1:
            raise damaged(f"the {name} split holds {counts[split]} tokens in {documents[split]} documents")
        try:
            tokens[split] = np.memmap(ids, dtype=dtype, mode="r")
            starts[split] = np.fromfile(offsets, dtype=np.int64)
        except (OSError, ValueError) as error:
            raise damaged(shorten(str(error), 80)) from None
        found = starts[split]
        if found[0] != 0 or (np.diff(found) <= 0).any() or found[-1] >= counts[split]:
            raise damaged(f"{offsets.name}: document starts not increasing from 0 within the {counts[split]:,} tokens")
        if int(tokens[split].max()) >= tokenizer.vocab_size:
            raise damaged(f"{ids.name} holds id {int(tokens[split].max()):,}, past the tokenizer's vocabulary of "
                          f"{tokenizer.vocab_size:,}")
    return Corpus(tokens, starts, key, meta)


SPLITS = (("train", "train"), ("test", "val"))
"""The task's split names and the cache entry's file names of them."""


def _count(meta: object, field: str, split: str) -> int | None:
    """``meta[field][split]`` where it is a count (a non-negative integer), else None."""
    value = meta.get(field, {}).get(split) if isinstance(meta, dict) and isinstance(meta.get(field), dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 48 else None


__all__ = ["Corpus", "corpus_key", "file_size", "read_bytes", "regular_files", "tokenized"]
