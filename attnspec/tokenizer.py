"""Tokenizers from local files: a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library) or a
tiktoken BPE file (``*.tiktoken``, the ``tiktoken`` library, with the pattern of the named OpenAI
encoding). Nothing is downloaded; a file is parsed by its library's own reader (JSON, base64 lines),
never unpickled, and bounded in size first.

A received tokenizer is data with a bounded cost. Its regular expressions and normalizers are programs
(exponential, multiplying, or panicking in the library), so the library never runs in this process: a
:class:`Tokenizer` hands its file, and then each text to encode and each id list to decode, to a child
process (:mod:`attnspec.tokenizer_worker`) that answers each request within a time and a memory
allowance of the request's size. A request past either, a panic of the library, or an answer larger
than a real tokenizer's is a :class:`TokenizerError` naming the file. One child serves every
:class:`Tokenizer` of the same file's content in this process, started on first use.

A :class:`Tokenizer` has an identity (:meth:`Tokenizer.identity`: kind, SHA-256 of the file, vocabulary
size, end-of-document token) that runs, token caches and builds record, so a resume or an evaluation with
another tokenizer is refused rather than silently reading ids that mean other words.
"""

from __future__ import annotations

import array
import atexit
import hashlib
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from attnspec import tokenizer_worker as worker
from attnspec.errors import AttnSpecError, shorten
from attnspec.tokenizer_worker import EOS_CANDIDATES, TIKTOKEN_EOS

MAX_TOKENIZER_BYTES = 64 << 20
"""A tokenizer file attnspec reads (the largest released ``tokenizer.json`` files are ~20 MB)."""
REQUEST_BYTES = 16 << 20
"""Texts are sent to the tokenizer's process in requests of at most this many bytes (a longer single text
goes alone), so each request's allowances stay those of its own size."""


class TokenizerError(AttnSpecError):
    """A tokenizer file cannot be used: missing, too large, malformed, without an end-of-document token,
    or past its time or memory allowance on a text (a pathological pattern or normalizer)."""


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: ``encode(text) -> ids``, ``decode(ids) -> text``, ``vocab_size`` ids (every id
    it produces is below it), and ``eos_id``, the end-of-document token packed documents are separated by.
    Plain data (copied and compared as such); the library runs in a child process shared by every
    Tokenizer of the same file content (see the module's docstring)."""

    kind: str
    path: Path
    sha256: str
    vocab_size: int
    eos: str
    eos_id: int
    encoding: str | None = None
    """tiktoken's encoding whose pattern the file's merges are read with (None for a tokenizer.json)."""
    bos: str | None = None
    """The beginning-of-sequence token its configuration names (a released model's ``bos_token``), or None."""
    bos_id: int | None = None

    def encode(self, text: str, special: bool = False) -> list[int]:
        """The ids of ``text``: none added (documents get their ``eos_id`` where they end), or with
        ``special`` what the tokenizer's own template adds (as transformers' ``encode`` does by default:
        Gemma's BOS; a tiktoken encoding adds nothing)."""
        return self.encode_batch([text], special)[0]

    @property
    def prefix_id(self) -> int:
        """The token a scored text is conditioned on first: the BOS where the tokenizer has one, else the EOS
        (lm-evaluation-harness's ``prefix_token_id``)."""
        return self.eos_id if self.bos_id is None else self.bos_id

    @property
    def prefix(self) -> str:
        """:attr:`prefix_id`'s token."""
        return self.eos if self.bos is None else self.bos

    def encode_batch(self, texts: list[str], special: bool = False) -> list[list[int]]:
        """:meth:`encode` of each text, sent to the tokenizer's process in requests of at most
        :data:`REQUEST_BYTES` (the library encodes a request's texts in parallel)."""
        found: list[list[int]] = []
        request: list[bytes] = []
        for text in texts:
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise TokenizerError(f"{self.path}: a text to tokenise is not valid Unicode ({error.reason} at "
                                     f"character {error.start})") from None
            if request and sum(map(len, request)) + len(data) > REQUEST_BYTES:
                found += _encode(self, request, special)
                request = []
            request.append(data)
        return found + (_encode(self, request, special) if request else [])

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``. An id past the vocabulary (a model's padded embedding rows) is the
        library's to handle: a Hugging Face tokenizer skips it, tiktoken refuses it (a TokenizerError)."""
        ids = list(ids)
        bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 1 << 32), None)
        if bad is not None:
            raise TokenizerError(f"{self.path}: cannot decode {shorten(bad)}, not a token id")
        payload = array.array("I", ids).tobytes()
        _, text = _process(self).request({"op": "decode"}, payload,
                                         worker.BYTES_PER_ID * len(ids) + (1 << 20), f"decoding {len(ids):,} ids")
        return text.decode("utf-8", "surrogatepass")

    def identity(self) -> dict:
        """What a run, a token cache or a build records to refuse another tokenizer later (and, for a
        tiktoken file, the encoding to read it with)."""
        found = {"kind": self.kind, "sha256": self.sha256, "vocab_size": self.vocab_size, "eos": self.eos}
        if self.bos is not None:
            found["bos"] = self.bos
        return found if self.kind == "huggingface" else {**found, "encoding": self.encoding}


def _encode(tokenizer: Tokenizer, texts: list[bytes], special: bool = False) -> list[list[int]]:
    """One encode request: ``texts`` (UTF-8) to their ids (``special``: with the template's), the answer
    checked against the request."""
    size = sum(map(len, texts))
    most = worker.IDS_PER_BYTE * size + 16 * len(texts) + 1024
    header, payload = _process(tokenizer).request({"op": "encode", "sizes": [len(t) for t in texts],
                                                   "special": special},
                                                  b"".join(texts), worker.ID_BYTES * most,
                                                  f"tokenising {size:,} bytes")
    counts = header.get("counts")
    ids = array.array("I")
    ids.frombytes(payload)
    if (not isinstance(counts, list) or len(counts) != len(texts) or sum(counts) != len(ids)
            or any(not isinstance(c, int) or c < 0 for c in counts)):
        raise TokenizerError(f"{tokenizer.path}: its process answered a request with ids that do not match it")
    if len(ids) and max(ids) >= tokenizer.vocab_size:
        raise TokenizerError(f"{tokenizer.path}: produced id {max(ids):,}, past its vocabulary of "
                             f"{tokenizer.vocab_size:,}")
    found, start = [], 0
    for count in counts:
        found.append(ids[start: start + count].tolist())
        start += count
    return found


class _Process:
    """The child process running one tokenizer file's library object: requests in, answers out, each
    within its allowances (:mod:`attnspec.tokenizer_worker`)."""

    def __init__(self, path: Path):
        from attnspec.io import start_python

        self.path = path
        self.log = tempfile.TemporaryFile()  # the child's stderr: the library's last words, read on failure
        # few malloc arenas: each reserves 64 MB of the address space the memory allowance counts
        self.process = start_python("attnspec.tokenizer_worker", env={"MALLOC_ARENA_MAX": "2", "RUST_BACKTRACE": "0"},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.log):
            stream.close()

    def request(self, header: dict, payload: bytes, max_answer: int, what: str) -> tuple[dict, bytes]:
        """Send one request and return its answer (header, payload), or raise TokenizerError: an error the
        library answered, no answer within :func:`~attnspec.tokenizer_worker.time_allowance` (the child is
        killed), a child that died (past its memory allowance), or an answer over ``max_answer`` bytes."""
        with self.lock:
            seconds = worker.time_allowance(len(payload))
            try:
                self.process.stdin.write(worker.encode_frame(header, payload))
                self.process.stdin.flush()
                answer = self._read(time.monotonic() + seconds, max_answer)
            except BrokenPipeError:
                answer = None
            except ValueError as error:  # an answer over its limits
                self.close()
                raise TokenizerError(f"{self.path}: {what} gave an answer larger than any real tokenizer's "
                                     f"({error})") from None
            except TimeoutError:
                self.close()
                raise TokenizerError(f"{self.path}: {what} took over {seconds:.0f} s, the limit for that size; the "
                                     "tokenizer's patterns or normalizers are pathological on this text (a "
                                     "backtracking regex?): use another tokenizer") from None
            if answer is None:
                raise TokenizerError(f"{self.path}: {what} stopped the tokenizer ({self._last_words()}); it may "
                                     f"allocate {worker.memory_allowance(len(payload)) >> 20:,} MiB for that "
                                     "size: a normalizer that multiplies the text?")
            if "error" in answer[0]:  # the library refused the file, or failed on the text (a panic)
                failed = f"{what} failed in the tokenizer library: " if answer[0].get("failed") else ""
                raise TokenizerError(f"{self.path}: {failed}{answer[0]['error']}")
            return answer

    def _read(self, deadline: float, max_answer: int) -> tuple[dict, bytes] | None:
        """One frame from the child by ``deadline`` (TimeoutError past it); None where the child ended."""
        import json

        stream = self.process.stdout.fileno()
        buffer = bytearray()

        def take(count: int) -> bytes | None:
            while len(buffer) < count:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([stream], [], [], left)[0]:
                    raise TimeoutError
                chunk = os.read(stream, max(count - len(buffer), 1 << 16))
                if not chunk:
                    return None
                buffer.extend(chunk)
            data = bytes(buffer[:count])
            del buffer[:count]
            return data

        head = take(worker.FRAME_HEAD.size)
        if head is None:
            return None
        header_bytes, payload_bytes = worker.decode_head(head, max_answer)
        header, payload = take(header_bytes), take(payload_bytes)
        if header is None or payload is None:
            return None
        found = json.loads(header)
        if not isinstance(found, dict):
            raise ValueError("a header that is not an object")
        return found, payload

    def _last_words(self) -> str:
        code = self.process.wait()
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - 4096))
        lines = [line.strip() for line in self.log.read().decode(errors="replace").splitlines()
                 if line.strip() and not line.startswith("note: ")]  # Rust's hint about backtraces
        try:
            died = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        except ValueError:  # a signal Python has no name for
            died = f"killed by signal {-code}"
        return died + (f": {shorten(lines[-1], 160)}" if lines else "")


_PROCESSES: dict[tuple, _Process] = {}
_PROCESSES_LOCK = threading.Lock()


def _key(kind: str, sha256: str, encoding: str | None) -> tuple:
    return os.getpid(), kind, sha256, encoding  # the pid: a forked process starts its own


def _process(tokenizer: Tokenizer) -> _Process:
    """The live process of ``tokenizer``'s file; started anew (the file re-read, its hash checked) where
    there is none, or it was killed (its time ran out, its creating thread ended)."""
    key = _key(tokenizer.kind, tokenizer.sha256, tokenizer.encoding)
    found = _PROCESSES.get(key)
    if found is not None and found.alive():
        return found
    raw = _read(tokenizer.path)
    if hashlib.sha256(raw).hexdigest() != tokenizer.sha256:
        raise TokenizerError(f"{tokenizer.path}: changed since it was read; load it again")
    return _start(tokenizer.kind, tokenizer.path, raw, tokenizer.sha256, tokenizer.eos, None, tokenizer.encoding,
                  tokenizer.bos)[0]


def _start(kind: str, path: Path, raw: bytes, digest: str, eos: str | None, eos_id: int | None,
           encoding: str | None, bos: str | None = None) -> tuple[_Process, dict]:
    """A process holding the library tokenizer of ``raw`` (registered for its content), and the facts its
    load answered."""
    key = _key(kind, digest, encoding)
    with _PROCESSES_LOCK:
        process = _PROCESSES.get(key)
        if process is None or not process.alive():
            if process is not None:
                process.close()
            process = _PROCESSES[key] = _Process(path)
    facts, _ = process.request({"op": "load", "kind": kind, "sha256": digest, "eos": eos, "eos_id": eos_id,
                                "encoding": encoding, "bos": bos}, raw, 0, "loading it")
    return process, facts


@atexit.register
def _stop_processes() -> None:
    for process in _PROCESSES.values():
        process.close()
    _PROCESSES.clear()


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
                   eos_id: int | None = None, bos: str | None = None) -> Tokenizer:
    """The tokenizer in the local file ``path``, loaded in its own process (the module's docstring).

    Args:
        path: a Hugging Face ``tokenizer.json``, or a tiktoken BPE file (``*.tiktoken``: base64 token and
            rank per line), or a directory holding ``tokenizer.json``.
        eos: the end-of-document token (its text, e.g. ``"</s>"``); None: the first of
            :data:`EOS_CANDIDATES` the vocabulary holds.
        encoding: for a tiktoken file, the OpenAI encoding whose pattern it uses (``cl100k_base``, ...;
            default: the file's name without ``.tiktoken``).
        eos_id: where ``eos`` is None, the end-of-document token by its id (a transformers config's
            ``eos_token_id``), before the usual names are tried.
        bos: the beginning-of-sequence token its configuration names (``tokenizer_config.json``'s
            ``bos_token``; a GGUF file's), which evaluations condition on first; None: it has none.

    Raises:
        TokenizerError: the file is missing, too large or malformed, the library is not installed, there
            is no end-of-document token, or loading it passes its allowances.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    raw = _read(path)
    digest = hashlib.sha256(raw).hexdigest()
    kind = "tiktoken" if path.suffix == ".tiktoken" else "huggingface"
    if kind == "tiktoken":
        encoding = encoding or path.stem
    elif encoding is not None:
        raise TokenizerError(f"{path}: `encoding` names a tiktoken encoding; a tokenizer.json has its own patterns")
    _, facts = _start(kind, path, raw, digest, eos, eos_id if isinstance(eos_id, int) else None, encoding, bos)
    bos_id = facts.get("bos_id")
    if bos is not None and (type(bos_id) is not int or not 0 <= bos_id < facts["vocab_size"]):
        raise TokenizerError(f"{path}: its process answered no id for the beginning-of-sequence token {bos!r}")
    return Tokenizer(kind, path, digest, facts["vocab_size"], facts["eos"], facts["eos_id"], facts["encoding"],
                     bos, None if bos is None else bos_id)


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
        if tokenizer.bos is not None:
            config["bos_token"] = tokenizer.bos
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


def _configured_bos(directory: Path) -> str | None:
    """A Hugging Face directory's beginning-of-sequence token: ``tokenizer_config.json``'s ``bos_token``
    (what transformers' tokenizer reports as its ``bos_token``), or None."""
    token = _configured(directory, "tokenizer_config.json", "bos_token")
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


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
        bos = (identity or {}).get("bos") if identity is not None else \
            _configured_bos(directory) if kind == "huggingface" else None
        found = load_tokenizer(path, eos, (identity or {}).get("encoding"), eos_id, bos)
        if identity is not None and found.identity() != identity:
            raise TokenizerError(f"{path}: not the tokenizer {directory} records (its SHA-256 is {found.sha256[:12]}.., "
                                 f"the record's {str(identity.get('sha256'))[:12]}..); restore the file")
        return found
    if identity is not None:
        raise TokenizerError(f"{directory}: records a tokenizer but holds no {' or '.join(FILES.values())}")
    return None


__all__ = ["EOS_CANDIDATES", "FILES", "MAX_TOKENIZER_BYTES", "TIKTOKEN_EOS", "Tokenizer", "TokenizerError",
           "load_tokenizer", "save_tokenizer", "tokenizer_in"]
