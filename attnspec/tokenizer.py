"""Tokenizers from local files: a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library) or a
tiktoken BPE file (``*.tiktoken``, the ``tiktoken`` library, with the pattern of the named OpenAI
encoding). Nothing is downloaded; a file is parsed by its library's own reader (JSON, base64 lines),
never unpickled, and bounded in size first.

A :class:`Tokenizer` has an identity (:meth:`Tokenizer.identity`: kind, SHA-256 of the file, vocabulary
size, end-of-document token) that runs, token caches and builds record, so a resume or an evaluation with
another tokenizer is refused rather than silently reading ids that mean other words.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnspec.errors import AttnSpecError, shorten

MAX_TOKENIZER_BYTES = 64 << 20
"""A tokenizer file attnspec reads (the largest released ``tokenizer.json`` files are ~20 MB)."""
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>", "[SEP]", "<|end|>")
"""End-of-document tokens looked up, in order, when a task or build names none."""
TIKTOKEN_EOS = "<|endoftext|>"
"""The end-of-document token of tiktoken's OpenAI encodings."""


class TokenizerError(AttnSpecError):
    """A tokenizer file cannot be used: missing, too large, malformed, or without an end-of-document token."""


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: ``encode(text) -> ids``, ``decode(ids) -> text``, ``vocab_size`` ids (every id
    it produces is below it), and ``eos_id``, the end-of-document token packed documents are separated by."""

    kind: str
    path: Path
    sha256: str
    vocab_size: int
    eos: str
    eos_id: int
    _impl: Any = field(repr=False, compare=False)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (no special tokens added: documents get their ``eos_id`` where they end)."""
        if self.kind == "huggingface":
            return self._impl.encode(text, add_special_tokens=False).ids
        return self._impl.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text (in parallel where the library does it)."""
        if self.kind == "huggingface":
            return [e.ids for e in self._impl.encode_batch(texts, add_special_tokens=False)]
        return self._impl.encode_ordinary_batch(texts)

    def decode(self, ids: list[int]) -> str:
        return self._impl.decode(list(ids))

    def identity(self) -> dict:
        """What a run, a token cache or a build records to refuse another tokenizer later (and, for a
        tiktoken file, the encoding to read it with)."""
        found = {"kind": self.kind, "sha256": self.sha256, "vocab_size": self.vocab_size, "eos": self.eos}
        return found if self.kind == "huggingface" else {**found, "encoding": self._impl.name}


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise TokenizerError(f"{path}: no such tokenizer file; give a tokenizer.json (Hugging Face tokenizers) or a "
                             ".tiktoken file")
    if path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise TokenizerError(f"{path}: larger than {MAX_TOKENIZER_BYTES:,} bytes, the limit of a tokenizer file")
    try:
        return path.read_bytes()
    except OSError as error:
        raise TokenizerError(f"{path}: cannot be read ({error.strerror})") from None


def load_tokenizer(path: str | Path, eos: str | None = None, encoding: str | None = None,
                   eos_id: int | None = None) -> Tokenizer:
    """The tokenizer in the local file ``path``.

    Args:
        path: a Hugging Face ``tokenizer.json``, or a tiktoken BPE file (``*.tiktoken``: base64 token and
            rank per line), or a directory holding ``tokenizer.json``.
        eos: the end-of-document token (its text, e.g. ``"</s>"``); None: the first of
            :data:`EOS_CANDIDATES` the vocabulary holds.
        encoding: for a tiktoken file, the OpenAI encoding whose pattern it uses (``cl100k_base``, ...;
            default: the file's name without ``.tiktoken``).
        eos_id: where ``eos`` is None, the end-of-document token by its id (a transformers config's
            ``eos_token_id``), before the usual names are tried.

    Raises:
        TokenizerError: the file is missing, too large or malformed, the library is not installed, or
            there is no end-of-document token.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    raw = _read(path)
    digest = hashlib.sha256(raw).hexdigest()
    if path.suffix == ".tiktoken":
        return _tiktoken(path, raw, digest, eos, encoding or path.stem)
    try:
        from tokenizers import Tokenizer as HuggingFaceTokenizer
    except ImportError:
        raise TokenizerError("reading a tokenizer.json needs the `tokenizers` library: pip install "
                             "'attnspec[text]'") from None
    try:
        impl = HuggingFaceTokenizer.from_str(raw.decode("utf-8"))
    except Exception as error:  # the Rust parser's errors are plain Exceptions
        raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json ({shorten(str(error), 160)})") from None
    vocab = impl.get_vocab_size(with_added_tokens=True)
    vocab = max(vocab, 1 + max(impl.get_vocab(with_added_tokens=True).values(), default=-1))
    if eos is None and isinstance(eos_id, int) and not isinstance(eos_id, bool):
        eos = impl.id_to_token(eos_id)
    names = (eos,) if eos is not None else EOS_CANDIDATES
    found = next(((name, i) for name in names if (i := impl.token_to_id(name)) is not None), None)
    if found is None:
        raise TokenizerError(f"{path}: the vocabulary has no end-of-document token "
                             f"{'`' + eos + '`' if eos else 'among ' + ', '.join(EOS_CANDIDATES)}; name the one it "
                             "has with `eos:`")
    return Tokenizer("huggingface", path, digest, vocab, found[0], found[1], impl)


def _tiktoken(path: Path, raw: bytes, digest: str, eos: str | None, encoding: str) -> Tokenizer:
    """A tiktoken OpenAI encoding (its pattern and special tokens: tiktoken's own definition in
    ``tiktoken_ext.openai_public``) over the merges in the local file, checked against the hash that
    definition expects. The definition's downloader is swapped for the local file while it runs, so
    nothing is fetched."""
    try:
        import tiktoken
        import tiktoken_ext.openai_public as public
    except ImportError:
        raise TokenizerError("reading a .tiktoken file needs the `tiktoken` library: pip install 'attnspec[text]'"
                             ) from None
    names = sorted(getattr(public, "ENCODING_CONSTRUCTORS", {}))
    if encoding not in names:
        raise TokenizerError(f"{path}: {encoding!r} is not one of tiktoken's encodings ({', '.join(names)}); name it "
                             "with `encoding:` (the file holds the merges, the encoding their pattern)")
    import base64

    def local(source: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if expected_hash is not None and digest != expected_hash:
            raise TokenizerError(f"{path}: not the {encoding} merges file (its SHA-256 is {digest[:12]}.., "
                                 f"{encoding}'s is {expected_hash[:12]}..)")
        ranks = {}
        try:
            for number, line in enumerate(raw.splitlines(), start=1):
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as error:
            raise TokenizerError(f"{path}:{number}: not a tiktoken BPE line ({shorten(str(error), 80)})") from None
        return ranks

    downloader = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = local
    try:
        definition = public.ENCODING_CONSTRUCTORS[encoding]()
    except TokenizerError:
        raise
    except Exception as error:  # an encoding whose definition reads more than one file (gpt2's vocab + merges)
        raise TokenizerError(f"{path}: tiktoken's {encoding} cannot be made from one local file "
                             f"({shorten(str(error), 120)}); use cl100k_base, o200k_base, r50k_base or p50k_base"
                             ) from None
    finally:
        public.load_tiktoken_bpe = downloader
    try:
        impl = tiktoken.Encoding(**definition)
    except (AssertionError, ValueError) as error:  # tiktoken checks the vocabulary's size with an assert
        raise TokenizerError(f"{path}: does not make tiktoken's {encoding} ({shorten(str(error), 80) or 'its size'})"
                             ) from None
    name = eos or TIKTOKEN_EOS
    if name not in definition["special_tokens"]:
        raise TokenizerError(f"{path}: {encoding} has no special token {name!r} (it has "
                             f"{', '.join(definition['special_tokens'])})")
    return Tokenizer("tiktoken", path, digest, impl.n_vocab, name, definition["special_tokens"][name], impl)


FILES = {"huggingface": "tokenizer.json", "tiktoken": "tokenizer.tiktoken"}
"""The file a build, run or Hugging Face directory holds its tokenizer in, by kind."""
TOKENIZER_CONFIG = "tokenizer_config.json"
"""What transformers' ``AutoTokenizer`` reads beside ``tokenizer.json``."""


def save_tokenizer(tokenizer: Tokenizer, directory: Path, max_len: int | None = None) -> dict:
    """Copy ``tokenizer``'s file into ``directory`` (as :data:`FILES` names it; checked unchanged since it was
    read) and return its identity, for the directory's record. With ``max_len`` (a transformers directory),
    a Hugging Face tokenizer also gets the ``tokenizer_config.json`` that ``AutoTokenizer`` reads."""
    import json

    from attnspec.io import write_atomic

    raw = _read(tokenizer.path)
    if hashlib.sha256(raw).hexdigest() != tokenizer.sha256:
        raise TokenizerError(f"{tokenizer.path}: changed since it was read; run again")
    write_atomic(Path(directory) / FILES[tokenizer.kind], raw)
    if max_len is not None and tokenizer.kind == "huggingface":
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tokenizer.eos,
                  "model_max_length": max_len, "clean_up_tokenization_spaces": False}
        write_atomic(Path(directory) / TOKENIZER_CONFIG, json.dumps(config, indent=2) + "\n")
    return tokenizer.identity()


def _configured(directory: Path, name: str, key: str):
    """``key`` of the JSON file ``name`` in a Hugging Face directory, or None where it is not there."""
    from attnspec.io import read_json

    path = directory / name
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = read_json(path)
    except AttnSpecError:  # a file attnspec cannot read names no token: the usual names are tried
        return None
    return data.get(key) if isinstance(data, dict) else None


def _configured_eos(directory: Path) -> tuple[str | None, int | None]:
    """A Hugging Face directory's end-of-document token: ``tokenizer_config.json``'s ``eos_token``, and
    ``config.json``'s ``eos_token_id`` (the first, where it lists several)."""
    token = _configured(directory, "tokenizer_config.json", "eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    number = _configured(directory, "config.json", "eos_token_id")
    number = number[0] if isinstance(number, list) and number else number
    return (token if isinstance(token, str) else None), (number if isinstance(number, int) else None)


def tokenizer_in(directory: Path | str, identity: dict | None = None) -> Tokenizer | None:
    """The tokenizer a build, run or Hugging Face directory holds (:data:`FILES`), None where it holds none.
    ``identity``: what the directory records of it (its manifest's, its run.json's); the file must be
    that tokenizer (a TokenizerError says so where it is not)."""
    directory = Path(directory)
    for kind, name in FILES.items():
        path = directory / name
        if path.is_symlink() or not path.is_file():
            continue
        eos, eos_id = _configured_eos(directory)
        eos = (identity or {}).get("eos") or eos
        found = load_tokenizer(path, eos, (identity or {}).get("encoding"), eos_id)
        if identity is not None and found.identity() != identity:
            raise TokenizerError(f"{path}: not the tokenizer {directory} records (its SHA-256 is {found.sha256[:12]}.., "
                                 f"the record's {str(identity.get('sha256'))[:12]}..); restore the file")
        return found
    if identity is not None:
        raise TokenizerError(f"{directory}: records a tokenizer but holds no {' or '.join(FILES.values())}")
    return None


__all__ = ["EOS_CANDIDATES", "FILES", "MAX_TOKENIZER_BYTES", "Tokenizer", "TokenizerError", "load_tokenizer",
           "save_tokenizer", "tokenizer_in"]
