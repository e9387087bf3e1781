"""The child process that runs a received tokenizer, and the frames it is spoken to in.

A tokenizer file is a program: a ``tokenizer.json`` names regular expressions (run by a backtracking
engine, Oniguruma, whose time is exponential in the text for patterns such as ``(a|aa)+$``) and
normalizers (a chain of ``Replace`` rules multiplies the text's length at each step), and the library
panics (a ``BaseException``) where its regex engine gives up. No allowlist of patterns can make that
bounded: the patterns real tokenizers use differ from model to model, and even GPT-2's is quadratic in a
run of spaces. So attnspec never runs a tokenizer library in its own process. It runs it here, in a
child (:func:`serve`) that holds one library tokenizer and answers requests, each under two limits:

* **memory**: before each request the child sets its address-space limit (``RLIMIT_AS``) to what it
  uses now plus :func:`memory_allowance` of the request's size, so an allocation past it fails (the Rust
  library then aborts the child, which the parent reports);
* **time**: the parent (``attnspec.tokenizer``) waits for an answer until :func:`time_allowance` of the
  request's size has passed, then kills the child.

Both allowances grow with the request (a 20 MB document is legitimate), and both are far above what
real tokenizers need (measured in ``benchmarks/tokenizer_limits.py``). A panic or any other error of
the library is caught here and answered as an error message the parent raises as a located
``TokenizerError``.

Frames: a 16-byte head (two little-endian uint64: the JSON header's length and the payload's), the
header (UTF-8 JSON, an object) and the payload (bytes: texts as UTF-8, ids as native uint32). This
module imports no other part of attnspec but the errors, so the child starts in about 0.15 s.
"""

from __future__ import annotations

import array
import base64
import json
import os
import struct
import sys
from typing import IO, Any

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>", "[SEP]", "<|end|>")
"""End-of-document tokens looked up, in order, when a task or build names none."""
TIKTOKEN_EOS = "<|endoftext|>"
"""The end-of-document token of tiktoken's OpenAI encodings."""
FRAME_HEAD = struct.Struct("<QQ")
MAX_HEADER_BYTES = 16 << 20
"""The largest JSON header of a frame (a request's list of text sizes, a batch of 10^6 documents' counts)."""
ID_BYTES = 4
"""Ids cross the pipe as native uint32 (every vocabulary attnspec reads is below 2^32)."""

MEMORY_FLOOR = 512 << 20
"""Memory a request may allocate past what the child holds when it starts, whatever its size: the
library's working buffers and its thread pool's stacks."""
MEMORY_PER_BYTE = 1024
"""And per byte of the request (text for encoding, ids for decoding, the file for loading): the library
keeps about 16 bytes of alignment per normalised byte, several copies of it, and ~100 bytes per token it
returns; measured peak 137-202 bytes per byte of one 8 MB document (benchmarks/tokenizer_limits.py),
so this leaves 5x."""
TIME_FLOOR = 10.0
"""Seconds any request may take, whatever its size (the child's start, a cold page cache)."""
BYTES_PER_SECOND = 16 << 10
"""And the slowest rate of tokenising a request may run at before it is stopped: real tokenizers' structures
run at 0.40-2.6 MB/s through the child on 2 cores (benchmarks/tokenizer_limits.py), 24x this or more, so it
stops only a pathological one, with room for a loaded machine."""
IDS_PER_BYTE = 64
"""The most ids an encoding may return per byte of text (byte fallback after NFKC's widest expansion is
~18); more is a normalizer that multiplies the text, refused."""
BYTES_PER_ID = 1024
"""The most bytes of text a decoding may return per id (the longest tokens of released vocabularies are
a few hundred bytes)."""


def memory_allowance(request_bytes: int) -> int:
    """Bytes a request of ``request_bytes`` may allocate in the child (:data:`MEMORY_FLOOR` plus
    :data:`MEMORY_PER_BYTE` each)."""
    return MEMORY_FLOOR + MEMORY_PER_BYTE * request_bytes


def time_allowance(request_bytes: int) -> float:
    """Seconds the parent waits for the answer to a request of ``request_bytes``."""
    return TIME_FLOOR + request_bytes / BYTES_PER_SECOND


# ----------------------------------------------------------------------------- frames


def encode_frame(header: dict, payload: bytes = b"") -> bytes:
    """One frame: head, JSON ``header``, ``payload``."""
    text = json.dumps(header).encode()
    return FRAME_HEAD.pack(len(text), len(payload)) + text + payload


def decode_head(head: bytes, max_payload: int) -> tuple[int, int]:
    """The header's and payload's lengths in a frame's 16-byte ``head``; ValueError past the limits."""
    header_bytes, payload_bytes = FRAME_HEAD.unpack(head)
    if header_bytes > MAX_HEADER_BYTES or payload_bytes > max_payload:
        raise ValueError(f"a frame of {header_bytes:,} + {payload_bytes:,} bytes, over the limits")
    return header_bytes, payload_bytes


def _read_exactly(stream: IO[bytes], count: int) -> bytes | None:
    data = stream.read(count)
    return data if data is not None and len(data) == count else None


def _read_request(stream: IO[bytes]) -> tuple[dict, bytes] | None:
    """The next request on ``stream``; None at its end (the parent closed the pipe)."""
    head = _read_exactly(stream, FRAME_HEAD.size)
    if head is None:
        return None
    header_bytes, payload_bytes = decode_head(head, 1 << 40)  # the parent bounds what it sends
    header, payload = _read_exactly(stream, header_bytes), _read_exactly(stream, payload_bytes)
    if header is None or payload is None:
        return None
    return json.loads(header), payload


# ----------------------------------------------------------------------------- the libraries


class LibraryTokenizer:
    """One tokenizer library object (``tokenizers.Tokenizer`` or ``tiktoken.Encoding``), in this process."""

    def __init__(self, kind: str, impl: Any):
        self.kind, self.impl = kind, impl

    def encode_batch(self, texts: list[str], special: bool = False) -> list[list[int]]:
        """Each text's ids; ``special``: with what the tokenizer's own template adds (a tokenizer.json's
        post-processor: Gemma's BOS; a tiktoken encoding adds nothing)."""
        if self.kind == "huggingface":
            return [e.ids for e in self.impl.encode_batch(texts, add_special_tokens=special)]
        return self.impl.encode_ordinary_batch(texts)

    def decode(self, ids: list[int]) -> str:
        return self.impl.decode(ids)


class LoadError(Exception):
    """The library cannot make a tokenizer of the file (the message says why, for the parent to locate)."""


def open_library(kind: str, raw: bytes, eos: str | None, eos_id: int | None, encoding: str | None,
                 digest: str, bos: str | None = None) -> tuple[LibraryTokenizer, dict]:
    """The library tokenizer of the file's bytes ``raw`` and its facts (``vocab_size``, ``eos``,
    ``eos_id``, ``bos``, ``bos_id``, ``encoding``). ``bos``: the beginning-of-sequence token the
    tokenizer's configuration names (None: it names none, and the facts say none). Runs in the child;
    raises LoadError with the reason."""
    if kind == "tiktoken":
        if bos is not None:
            raise LoadError(f"a tiktoken encoding has no beginning-of-sequence token {bos!r} of its own")
        return _tiktoken(raw, digest, eos, encoding)
    try:
        from tokenizers import Tokenizer as HuggingFaceTokenizer
    except ImportError:
        raise LoadError("reading a tokenizer.json needs the `tokenizers` library: pip install 'attnspec[text]'"
                        ) from None
    try:
        impl = HuggingFaceTokenizer.from_str(raw.decode("utf-8"))
    except Exception as error:  # the Rust parser's errors are plain Exceptions
        raise LoadError(f"not a Hugging Face tokenizer.json ({_shorten(error, 160)})") from None
    vocab = impl.get_vocab_size(with_added_tokens=True)
    vocab = max(vocab, 1 + max(impl.get_vocab(with_added_tokens=True).values(), default=-1))
    if eos is None and isinstance(eos_id, int) and not isinstance(eos_id, bool) and 0 <= eos_id < 1 << 32:
        eos = impl.id_to_token(eos_id)
    names = (eos,) if eos is not None else EOS_CANDIDATES
    found = next(((name, i) for name in names if (i := impl.token_to_id(name)) is not None), None)
    if found is None:
        raise LoadError(f"the vocabulary has no end-of-document token "
                        f"{'`' + eos + '`' if eos else 'among ' + ', '.join(EOS_CANDIDATES)}; name the one it has "
                        "with `eos:`")
    bos_id = None if bos is None else impl.token_to_id(bos)
    if bos is not None and bos_id is None:
        raise LoadError(f"the vocabulary has no beginning-of-sequence token `{bos}`, which its configuration names")
    return LibraryTokenizer(kind, impl), {"vocab_size": vocab, "eos": found[0], "eos_id": found[1],
                                          "bos": bos, "bos_id": bos_id, "encoding": None}


def _tiktoken(raw: bytes, digest: str, eos: str | None, encoding: str | None) -> tuple[LibraryTokenizer, dict]:
    """A tiktoken OpenAI encoding (its pattern and special tokens: tiktoken's own definition in
    ``tiktoken_ext.openai_public``) over the merges in the local file, checked against the hash that
    definition expects. The definition's downloader is swapped for the local bytes while it runs, so
    nothing is fetched."""
    try:
        import tiktoken
        import tiktoken_ext.openai_public as public
    except ImportError:
        raise LoadError("reading a .tiktoken file needs the `tiktoken` library: pip install 'attnspec[text]'"
                        ) from None
    names = sorted(getattr(public, "ENCODING_CONSTRUCTORS", {}))
    if encoding not in names:
        raise LoadError(f"{encoding!r} is not one of tiktoken's encodings ({', '.join(names)}); name it with "
                        "`encoding:` (the file holds the merges, the encoding their pattern)")

    def local(source: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if expected_hash is not None and digest != expected_hash:
            raise LoadError(f"not the {encoding} merges file (its SHA-256 is {digest[:12]}.., {encoding}'s is "
                            f"{expected_hash[:12]}..)")
        ranks = {}
        try:
            for number, line in enumerate(raw.splitlines(), start=1):
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as error:
            raise LoadError(f"line {number}: not a tiktoken BPE line ({_shorten(error, 80)})") from None
        return ranks

    downloader = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = local
    try:
        definition = public.ENCODING_CONSTRUCTORS[encoding]()
    except LoadError:
        raise
    except Exception as error:  # an encoding whose definition reads more than one file (gpt2's vocab + merges)
        raise LoadError(f"tiktoken's {encoding} cannot be made from one local file ({_shorten(error, 120)}); use "
                        "cl100k_base, o200k_base, r50k_base or p50k_base") from None
    finally:
        public.load_tiktoken_bpe = downloader
    try:
        impl = tiktoken.Encoding(**definition)
    except (AssertionError, ValueError) as error:  # tiktoken checks the vocabulary's size with an assert
        raise LoadError(f"does not make tiktoken's {encoding} ({_shorten(error, 80) or 'its size'})") from None
    name = eos or TIKTOKEN_EOS
    if name not in definition["special_tokens"]:
        raise LoadError(f"{encoding} has no special token {name!r} (it has {', '.join(definition['special_tokens'])})")
    return LibraryTokenizer("tiktoken", impl), {"vocab_size": impl.n_vocab, "eos": name,
                                                "eos_id": definition["special_tokens"][name], "bos": None,
                                                "bos_id": None, "encoding": encoding}


def _shorten(error: BaseException, limit: int) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------- the child


def _limit_memory(request_bytes: int) -> None:
    """Cap this process's address space at what it maps now plus the request's allowance."""
    import resource

    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc (not Linux): the time allowance alone bounds a request
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + memory_allowance(request_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


class _Server:
    """The child's one library tokenizer (made by the first request, ``load``) and its answers."""

    def __init__(self) -> None:
        self.library: LibraryTokenizer | None = None

    def answer(self, header: dict, payload: bytes) -> tuple[dict, bytes]:
        """The answer to one request (``op``: load, encode or decode)."""
        op = header.get("op")
        if op == "load":
            self.library, facts = open_library(header["kind"], payload, header.get("eos"), header.get("eos_id"),
                                               header.get("encoding"), header["sha256"], header.get("bos"))
            return facts, b""
        if self.library is None:
            raise LoadError("no tokenizer loaded")
        if op == "encode":
            texts, start = [], 0
            for size in header["sizes"]:
                texts.append(payload[start: start + size].decode("utf-8"))
                start += size
            found = self.library.encode_batch(texts, special=header.get("special") is True)
            ids = array.array("I", [i for one in found for i in one])
            return {"counts": [len(one) for one in found]}, ids.tobytes()
        if op == "decode":
            ids = array.array("I")
            ids.frombytes(payload)
            return {}, self.library.decode(ids.tolist()).encode("utf-8", "surrogatepass")
        raise LoadError(f"unknown request {op!r}")


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer requests from ``requests`` on ``answers`` until the parent closes the pipe: each under the
    memory limit of its size; an error of the library (a panic included) is answered as
    ``{"error": message}``."""
    server = _Server()
    while (request := _read_request(requests)) is not None:
        header, payload = request
        _limit_memory(len(payload))
        try:
            answer, data = server.answer(header, payload)
        except LoadError as error:
            answer, data = {"error": str(error)}, b""
        except MemoryError:
            answer, data = {"error": "ran out of its memory allowance", "failed": True}, b""
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # pyo3's PanicException is a BaseException: a panic is the library's answer
            answer, data = {"error": f"{type(error).__name__}: {_shorten(error, 300)}", "failed": True}, b""
        answers.write(encode_frame(answer, data))
        answers.flush()


def main() -> None:
    """The child's entry: frames on the pipe given as the original stdout; anything the libraries print
    goes to stderr (the parent's log of the child), never into the frames."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
