"""``manifest.json``: the strict schema of a build directory's manifest, and reading it as data.

A build directory may come from someone else, so its manifest is untrusted input: it is read with
a size limit, parsed as JSON without NaN or infinities, and validated against :class:`Manifest`
(strict types, unknown keys refused). The ``files`` table is required and names only the files
a build writes; each is checked to be a regular file (never a symlink) inside the directory, of
the recorded size and sha256. The hashes prove integrity against corruption and accidents, not
authenticity: whoever can write the directory can rewrite the manifest too (docs/trust.md).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attnspec.errors import BuildError, RunError, shorten
from attnspec.io import RUN_FILE, read_json
from attnspec.spec import limits

FORMAT = 2
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
REQUIRED_FILES = ("spec.yaml", "model.safetensors")
OPTIONAL_FILES = ("model.pt2", "step.pt2", "prefill.pt2", "model.aoti.pt2", "step.aoti.pt2", "prefill.aoti.pt2",
                  "tokenizer.json", "tokenizer.tiktoken", "generation_config.json")
FILE_NAMES = REQUIRED_FILES + OPTIONAL_FILES
"""Every file a build may write besides the manifest: plain names, so nothing outside the directory
can be named."""

Text = Annotated[str, Field(max_length=4096)]
Mode = Literal["recurrent", "scan", "chunk", "quadratic"]
BackendName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class FileEntry(_Strict):
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    bytes: Annotated[int, Field(ge=0, le=1 << 44)]


class PlanLayer(_Strict):
    path: Text
    mixer: Text
    full_mode: Mode
    decode_mode: Literal["recurrent", "cache", "borrowed", "prefix"] | None
    cost: dict[Text, float]
    reason: Text
    candidates: dict[Text, float]
    measured: dict[Text, float] | None = None
    skipped: dict[Text, Text] = Field(default_factory=dict)
    spread: dict[Text, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    backend: BackendName = "graph"
    export_backend: BackendName = "graph"
    decode_cache: Annotated[int, Field(gt=0, le=limits.MAX_LEN)] | None = None


class PlanRecord(_Strict):
    length: Annotated[int, Field(gt=0, le=limits.MAX_LEN)]
    batch: Annotated[int, Field(gt=0, le=1 << 20)] = 1
    training: bool = False
    device: Literal["cpu", "cuda"] = "cpu"
    packed_documents: bool = False
    layers: Annotated[list[PlanLayer], Field(max_length=limits.MAX_BLOCKS)]


class StateEntry(_Strict):
    shape: Annotated[list[Annotated[int, Field(ge=0, le=1 << 31)]], Field(max_length=8)]
    """Without the batch; ``max_len`` on the capacity axis."""
    dtype: Literal["float32", "float64", "int64"]
    capacity_axis: Annotated[int, Field(ge=0, le=7)] | None = None
    """The axis of ``shape`` sized to the positions a generation reaches (full caches, kept inputs): the step
    takes a state of any capacity there (2..max_len). Builds before that record none and take ``max_len``."""


Speed = Annotated[float, Field(ge=0)]


class StepExport(_Strict):
    state: Annotated[list[StateEntry], Field(max_length=4 * limits.MAX_BLOCKS + 1)]
    tokens_per_second: Speed | None = None
    """Decoding speed of the program (batch 1, ``speed_at``); ``eager_…`` that of ``attnspec.load``'s model."""
    eager_tokens_per_second: Speed | None = None
    speed_at: dict[Text, int] | None = None


class ModelExport(_Strict):
    checked_length: int
    max_abs_diff_vs_eager: float
    tokens_per_second: Speed | None = None
    """Full-sequence speed of the program at ``speed_at`` (batch, length), without gradients."""
    eager_tokens_per_second: Speed | None = None
    speed_at: dict[Text, int] | None = None


class PrefillExport(ModelExport):
    takes_state: bool = False
    """``prefill(tokens, *state)`` writes the state it is given (allocated at the generation's capacity)
    in place; builds before it take ``prefill(tokens)`` and return a state of ``max_len`` positions."""


class AotExport(_Strict):
    tokens_per_second: Speed
    speed_at: dict[Text, int]


class ExportRecord(_Strict):
    model: ModelExport | None = Field(default=None, alias="model.pt2")
    step: StepExport | None = Field(default=None, alias="step.pt2")
    prefill: PrefillExport | None = Field(default=None, alias="prefill.pt2")
    """The prompt's pass to logits at its last position and the decoding state (builds before it have none)."""
    model_aoti: AotExport | None = Field(default=None, alias="model.aoti.pt2")
    step_aoti: AotExport | None = Field(default=None, alias="step.aoti.pt2")
    prefill_aoti: AotExport | None = Field(default=None, alias="prefill.aoti.pt2")


class MismatchRecord(_Strict):
    name: Text
    file: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=16)]
    model: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=16)]
    file_dtype: Annotated[str, Field(max_length=32)] | None = None  # None: a build before dtypes were recorded
    model_dtype: Annotated[str, Field(max_length=32)] | None = None


class WeightsRecord(_Strict):
    """How ``--weights`` fitted the model (:class:`~attnspec.compiler.load.WeightsFit`)."""

    loaded: Annotated[int, Field(ge=0)]
    initialised: Annotated[list[Text], Field(max_length=1 << 20)]
    mismatched: Annotated[list[MismatchRecord], Field(max_length=1 << 20)]
    ignored: Annotated[list[Text], Field(max_length=1 << 20)]
    # loaded with each shared key/value head repeated for the heads it served (None: a build before this)
    repeated: Annotated[list[MismatchRecord], Field(max_length=1 << 20)] | None = None


class Manifest(_Strict):
    """What ``attnspec build`` writes to ``manifest.json`` (format 2)."""

    format: Literal[2]
    name: Annotated[str, Field(max_length=limits.MAX_NAME_CHARS)]
    attnspec_version: Annotated[str, Field(max_length=64)]
    torch_version: Annotated[str, Field(max_length=64)]
    parameters: Annotated[int, Field(ge=0, le=limits.MAX_PARAMETERS)]
    input: Literal["tokens", "features"]
    vocab_size: Annotated[int, Field(gt=0, le=limits.MAX_VOCAB)] | None
    head: Literal["lm", "classifier", "none"]
    causal: bool
    """Every mixer is causal (position t sees only positions <= t)."""
    max_len: Annotated[int, Field(gt=0, le=limits.MAX_LEN)]
    dtype: Literal["float32", "float64", "bfloat16", "float16"]
    device: Literal["cpu", "cuda"] = "cpu"
    """The device type the exported programs were made for (``attnspec build --device``)."""
    plan: PlanRecord
    spec: dict[Text, Any]
    """The resolved spec as data (what spec.yaml says), validated by the IR when loaded."""
    verification: dict[Text, Any]
    compile: dict[Text, Any] | None
    export: ExportRecord
    has_step: bool
    """The model decodes one token at a time (``Model.has_step``); ``step.pt2`` is there where the build wrote
    its programs (``export``)."""
    decode_limit: Annotated[int, Field(gt=0, le=limits.MAX_LEN)] | None = None
    """The most positions a sequence can reach by decoding (``Model.decode_limit``); None: unbounded."""
    stage_seconds: dict[Text, float]
    files: dict[Literal[FILE_NAMES], FileEntry]  # type: ignore[valid-type]
    weights: WeightsRecord | None = None
    """How ``--weights`` fitted (None: the spec's initialisation, or no weights given)."""
    tokenizer: TokenizerRecord | None = None
    """The tokenizer the build carries (``attnspec.tokenizer``'s identity), None: token ids only."""


class TokenizerRecord(_Strict):
    """A carried tokenizer's identity (:meth:`attnspec.tokenizer.Tokenizer.identity`)."""

    kind: Literal["huggingface", "tiktoken"]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    vocab_size: Annotated[int, Field(gt=0, le=limits.MAX_VOCAB)]
    eos: Annotated[str, Field(min_length=1, max_length=256)]
    encoding: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    bos: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # None: it names none (or a build before)


Manifest.model_rebuild()


def sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def regular_file(path: Path, what: str) -> os.stat_result:
    """``lstat`` of ``path``, refusing symlinks and anything but a regular file (BuildError)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise BuildError(f"{path}: missing; {what}") from None
    except OSError as error:
        raise BuildError(f"{path}: cannot read ({error.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise BuildError(f"{path} is a symbolic link; a build directory holds only regular files (rebuild it)")
    if not stat.S_ISREG(info.st_mode):
        raise BuildError(f"{path} is not a regular file; rebuild the directory")
    return info


def parse_manifest(directory: Path) -> Manifest:
    """The manifest of ``directory`` validated against the schema, without checking the files."""
    if not directory.is_dir():
        raise BuildError(f"{directory} is not a directory; give a build directory written by `attnspec build`")
    path = directory / MANIFEST
    if not os.path.lexists(path) and os.path.lexists(directory / RUN_FILE):
        raise BuildError(f"{directory} is a training run directory, not a build; make a build of its latest "
                         f"checkpoint with `attnspec build {directory} -o {directory}-build` and give that "
                         "(`attnspec eval`, `export-hf` and `attnspec.load` take the run itself)")
    if not os.path.lexists(path):
        raise BuildError(f"{directory} is not a build directory (no {MANIFEST}); build one with "
                         "`attnspec build SPEC -o DIR`")
    regular_file(path, "rebuild the directory")
    try:
        data = read_json(path, MAX_MANIFEST_BYTES)
    except RunError as error:
        raise BuildError(f"{error}; rebuild the directory") from None
    if isinstance(data, dict) and data.get("format") != FORMAT and isinstance(data.get("format"), int):
        raise BuildError(f"{path} has format {data['format']}; this attnspec reads format {FORMAT}: rebuild the "
                         "directory with `attnspec build`")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise BuildError(f"{path} is not a valid attnspec manifest: {where}: {shorten(first['msg'], 200)} "
                         f"({error.error_count()} problem(s)); rebuild the directory") from None
    exported = [name for name, entry in manifest.export.model_dump(by_alias=True).items() if entry is not None]
    missing = [name for name in (*REQUIRED_FILES, *exported) if name not in manifest.files]
    if missing:
        raise BuildError(f"{path} does not list {', '.join(missing)} in its files table; rebuild the directory")
    return manifest


def read_manifest(directory: Path | str, check_files: bool = True) -> Manifest:
    """The validated manifest of a build directory; with ``check_files``, every listed file must be a
    regular file with the recorded size and sha256."""
    directory = Path(directory)
    manifest = parse_manifest(directory)
    if check_files:
        for name, entry in manifest.files.items():
            check_listed_file(directory / name, entry)
    return manifest


def check_listed_file(path: Path, entry: FileEntry) -> None:
    """``path`` is a regular file of the size and sha256 its manifest ``entry`` records (else BuildError)."""
    info = regular_file(path, "it is listed in manifest.json; rebuild the directory")
    if info.st_size != entry.bytes or sha256(path) != entry.sha256:
        raise BuildError(f"{path} does not match the sha256 and size recorded in manifest.json (the build "
                         "directory was modified or corrupted); rebuild it with `attnspec build`")


__all__ = ["Manifest", "FORMAT", "MANIFEST", "FILE_NAMES", "check_listed_file", "read_manifest", "parse_manifest",
           "sha256", "regular_file"]
