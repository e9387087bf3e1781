"""GGUF files (llama.cpp's format) as transformers checkpoints: a config, named tensors, a tokenizer.

A GGUF file holds the model's hyper-parameters as metadata under llama.cpp's key names, its tokenizer
as arrays (tokens, merges or scores, token types, special ids), and its tensors, quantised or not, under
llama.cpp's tensor names. :class:`GGUFCheckpoint` presents it as what a transformers directory is to
:mod:`attnspec.interop.convert`: the ``config.json`` transformers' own GGUF loader rebuilds from the same
metadata (its key map, defaults and tied head: transformers is the check), tensors by their transformers
names (llama.cpp's names found through the ``gguf`` library's own name map, each tensor dequantised by the
``gguf`` library, then undoing what llama.cpp's converter did: Llama's rotary row order, Gemma's +1 on
norms), and a ``tokenizer.json`` (:mod:`attnspec.interop.gguf_tokenizer`).

The file is data. Its header is parsed here with every count, string, array and dimension bounded by what
is left of the file and by :data:`MAX_HEADER_BYTES` before anything is allocated; every tensor's byte range
is computed from its type and shape, aligned, inside the file and overlapping no other; nothing in it is
executed or evaluated. A tensor is read with one bounded ``read`` when the import reaches it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnspec.errors import InteropError, shorten
from attnspec.io import all_finite
from attnspec.spec import limits

MAGIC = b"GGUF"
MAX_HEADER_BYTES = 256 << 20
"""Metadata and tensor table together (the largest vocabularies, 256k tokens with merges, take ~15 MB)."""
MAX_TENSORS = 1 << 17
MAX_ENTRIES = 1 << 16
MAX_ARRAY = 1 << 22
"""Elements of one metadata array (vocabularies reach 262,144 tokens)."""
MAX_STRING = 1 << 24
MAX_DIMS = 4
MAX_ALIGNMENT = 1 << 16
DEFAULT_ALIGNMENT = 32

# metadata value types (GGUF spec): scalar struct formats, little-endian
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
_UNQUANTISED = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16, 28: torch.float64}
"""ggml types stored as plain floating point (F32, F16, BF16, F64), read without the gguf library."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a GGUF file: its name, shape in PyTorch's order (llama.cpp lists it innermost first),
    ggml type, and where its bytes are (absolute offset, byte count)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type {self.ggml_type}"


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's header: ``metadata`` (key -> int, float, bool, str or list of them) and ``tensors``
    (name -> :class:`TensorEntry`), in the file's order."""

    path: Path
    version: int
    metadata: dict
    tensors: dict[str, TensorEntry]


class _Cursor:
    """Bounded little-endian reads from the header bytes: every read past them is an InteropError."""

    def __init__(self, data: bytes, path: Path, complete: bool):
        self.data, self.position, self.path, self.complete = data, 0, path, complete

    def take(self, count: int) -> bytes:
        if count < 0 or self.position + count > len(self.data):
            raise InteropError(f"{self.path}: the GGUF header ends early" if self.complete else
                               f"{self.path}: the GGUF header is larger than {MAX_HEADER_BYTES:,} bytes, or it "
                               "declares more than the file holds")
        start = self.position
        self.position += count
        return self.data[start:self.position]

    def scalar(self, kind: int):
        form = _SCALARS[kind]
        return struct.unpack(form, self.take(struct.calcsize(form)))[0]

    def string(self, what: str) -> str:
        length = self.scalar(10)
        if length > MAX_STRING:
            raise InteropError(f"{self.path}: {what} is a string of {length:,} bytes (at most {MAX_STRING:,})")
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise InteropError(f"{self.path}: {what} is not UTF-8 text") from None


def _value(cursor: _Cursor, kind: int, key: str, depth: int = 0):
    if kind in _SCALARS:
        value = cursor.scalar(kind)
        if isinstance(value, float) and not math.isfinite(value):
            raise InteropError(f"{cursor.path}: metadata {shorten(key)} is {value}, not a finite number")
        return bool(value) if kind == 7 else value
    if kind == _STRING:
        return cursor.string(f"metadata {shorten(key)}")
    if kind == _ARRAY and depth == 0:
        element, count = cursor.scalar(4), cursor.scalar(10)
        if count > MAX_ARRAY:
            raise InteropError(f"{cursor.path}: metadata {shorten(key)} is an array of {count:,} elements (at most "
                               f"{MAX_ARRAY:,})")
        if element in _NUMPY:  # numbers in one read, their size checked by take()
            size = np.dtype(_NUMPY[element]).itemsize
            values = np.frombuffer(cursor.take(size * count), dtype=_NUMPY[element])
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                raise InteropError(f"{cursor.path}: metadata {shorten(key)} holds NaN or infinite numbers")
            return [bool(v) for v in values] if element == 7 else values.tolist()
        if element == _STRING:
            return [cursor.string(f"metadata {shorten(key)}[{index}]") for index in range(count)]
        raise InteropError(f"{cursor.path}: metadata {shorten(key)} is an array of type {element}, which GGUF "
                           "files of language models do not hold")
    raise InteropError(f"{cursor.path}: metadata {shorten(key)} has value type {kind}, not one GGUF defines"
                       f"{' (arrays of arrays are not read)' if kind == _ARRAY else ''}")


def read_gguf(path: Path | str) -> GGUFFile:
    """The header of the GGUF file ``path`` (a regular file, links followed), every size checked.

    Raises:
        InteropError: not a GGUF file, a version other than 2 or 3, a count, string, array or
            dimension past its limit or past the file, a tensor of an unknown type, misaligned,
            outside the file or overlapping another, or a name given twice.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    if not path.is_file():
        raise InteropError(f"{path}: {'missing' if not path.exists() else 'not a regular file'}; give a .gguf file")
    size = path.stat().st_size
    try:
        with open(path, "rb") as file:
            head = file.read(min(size, MAX_HEADER_BYTES))
    except OSError as error:
        raise InteropError(f"{path}: cannot be read ({error.strerror})") from None
    cursor = _Cursor(head, path, complete=size <= MAX_HEADER_BYTES)
    if head[:4] != MAGIC:
        raise InteropError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    cursor.take(4)
    version = cursor.scalar(4)
    if version not in (2, 3):
        hint = " (a big-endian file, which attnspec does not read)" if version > 0xFFFF else ""
        raise InteropError(f"{path}: GGUF version {version}{hint}; attnspec reads versions 2 and 3")
    tensor_count, entry_count = cursor.scalar(10), cursor.scalar(10)
    if tensor_count > MAX_TENSORS or entry_count > MAX_ENTRIES:
        raise InteropError(f"{path}: declares {tensor_count:,} tensors and {entry_count:,} metadata entries (at "
                           f"most {MAX_TENSORS:,} and {MAX_ENTRIES:,})")
    metadata: dict = {}
    for _ in range(entry_count):
        key = cursor.string("a metadata key")
        if key in metadata:
            raise InteropError(f"{path}: metadata {shorten(key)} is given twice")
        metadata[key] = _value(cursor, cursor.scalar(4), key)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (isinstance(alignment, bool) or not isinstance(alignment, int) or not 1 <= alignment <= MAX_ALIGNMENT
            or alignment & (alignment - 1)):
        raise InteropError(f"{path}: general.alignment {shorten(alignment)} is not a power of two up to "
                           f"{MAX_ALIGNMENT:,}")
    listed = []
    for _ in range(tensor_count):
        name = cursor.string("a tensor name")
        dims = cursor.scalar(4)
        if not 1 <= dims <= MAX_DIMS:
            raise InteropError(f"{path}: tensor {shorten(name)} has {dims} dimensions (1 to {MAX_DIMS})")
        extents = [cursor.scalar(10) for _ in range(dims)]
        ggml_type, offset = cursor.scalar(4), cursor.scalar(10)
        if any(not 1 <= e <= limits.MAX_PARAMETERS for e in extents) or math.prod(extents) > limits.MAX_PARAMETERS:
            raise InteropError(f"{path}: tensor {shorten(name)} has shape {extents}, past attnspec's limit of "
                               f"{limits.MAX_PARAMETERS:,} elements")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise InteropError(f"{path}: tensor {shorten(name)} has ggml type {ggml_type}, which the gguf library "
                               "does not know") from None
        if extents[0] % block:
            raise InteropError(f"{path}: tensor {shorten(name)} has rows of {extents[0]} values, not a whole number "
                               f"of its type's blocks of {block}")
        listed.append((name, tuple(reversed(extents)), ggml_type, offset,
                       math.prod(extents) // block * block_bytes))
    data_start = -(-cursor.position // alignment) * alignment
    tensors: dict[str, TensorEntry] = {}
    for name, shape, ggml_type, offset, nbytes in listed:
        if name in tensors:
            raise InteropError(f"{path}: tensor {shorten(name)} is listed twice")
        if offset % alignment or data_start + offset + nbytes > size:
            raise InteropError(f"{path}: tensor {shorten(name)}'s data ({nbytes:,} bytes at offset {offset:,}) is "
                               f"{'misaligned' if offset % alignment else 'past the end of the file'}")
        tensors[name] = TensorEntry(name, shape, ggml_type, data_start + offset, nbytes)
    ordered = sorted(tensors.values(), key=lambda entry: entry.offset)
    for before, after in zip(ordered, ordered[1:]):
        if before.offset + before.nbytes > after.offset:
            raise InteropError(f"{path}: the data of tensors {shorten(before.name)} and {shorten(after.name)} "
                               "overlap")
    return GGUFFile(path, version, metadata, tensors)


def read_tensor(file: GGUFFile, name: str) -> torch.Tensor:
    """The tensor ``name`` of ``file`` in float32 (float64 for F64), dequantised by the ``gguf`` library
    (its reference dequantisation of every ggml block type), shaped as PyTorch holds it.

    Raises:
        InteropError: the file changed or cannot be read, the type cannot be dequantised, or a value is
            not finite.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    entry = file.tensors[name]
    try:
        with open(file.path, "rb") as handle:
            handle.seek(entry.offset)
            raw = handle.read(entry.nbytes)
    except OSError as error:
        raise InteropError(f"{file.path}: cannot be read ({error.strerror})") from None
    if len(raw) != entry.nbytes:
        raise InteropError(f"{file.path}: tensor {shorten(name)} ends past the file (it changed while being read)")
    if entry.ggml_type in _UNQUANTISED:
        tensor = torch.frombuffer(bytearray(raw), dtype=_UNQUANTISED[entry.ggml_type]).reshape(entry.shape)
        tensor = tensor if tensor.dtype == torch.float64 else tensor.float()
    else:
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(*entry.shape[:-1], -1)
        try:
            values = dequantize(blocks, GGMLQuantizationType(entry.ggml_type))
        except NotImplementedError:
            raise InteropError(f"{file.path}: tensor {shorten(name)} is {entry.type_name}, which the gguf library "
                               "cannot dequantise; convert the model with llama.cpp to a type it reads (Q4_0, Q4_1, "
                               "Q4_K, Q5_0, Q5_K, Q6_K, Q8_0, F16, BF16, F32)") from None
        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(entry.shape)
    if not all_finite(tensor):
        raise InteropError(f"{file.path}: tensor {shorten(name)} holds NaN or infinite values")
    return tensor


# ------------------------------------------------------------------ GGUF as a transformers checkpoint


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one llama.cpp architecture reads as a transformers model type: the config keys (llama.cpp's,
    after the architecture's prefix -> transformers' field), as transformers' GGUF loader maps them; and
    what llama.cpp's converter did to the tensors, undone here."""

    model_type: str
    keys: dict[str, str]
    rotary_rows: bool = False
    """Llama: llama.cpp stores q and k with each head's rotary pairs interleaved; their rows are put back."""
    norm_offset: bool = False
    """Gemma: llama.cpp stores each norm's weight + 1; transformers' Gemma norms hold the weight itself."""


_COMMON = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
           "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
           "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
           "attention.head_count_kv": "num_key_value_heads", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
           "vocab_size": "vocab_size"}
ARCHITECTURES = {
    "llama": GGUFArchitecture("llama", {**_COMMON, "rope.dimension_count": "head_dim"}, rotary_rows=True),
    "qwen2": GGUFArchitecture("qwen2", _COMMON),
    "qwen3": GGUFArchitecture("qwen3", _COMMON),
    "phi3": GGUFArchitecture("phi3", _COMMON),
    "gemma2": GGUFArchitecture("gemma2", {**_COMMON, "attention.key_length": "head_dim",
                                          "attention.sliding_window": "sliding_window"}, norm_offset=True),
    "gemma3": GGUFArchitecture("gemma3_text", {**_COMMON, "attention.key_length": "head_dim",
                                               "attention.sliding_window": "sliding_window"}, norm_offset=True),
}
"""The llama.cpp architectures attnspec imports from GGUF: those transformers' GGUF loader maps whose
tensors llama.cpp stores one to one (no fused or split experts) and whose family attnspec has."""
TOKENIZER_KEYS = {"tokenizer.ggml.bos_token_id": "bos_token_id", "tokenizer.ggml.eos_token_id": "eos_token_id",
                  "tokenizer.ggml.unknown_token_id": "unk_token_id", "tokenizer.ggml.padding_token_id": "pad_token_id"}


def gguf_config(file: GGUFFile) -> dict:
    """The transformers ``config.json`` of ``file``, as transformers' GGUF loader rebuilds it: its mapped
    keys, the special token ids, ``vocab_size`` from the tokens where the file states none, and a tied
    head where the file stores no ``output.weight``.

    Raises:
        InteropError: no architecture, or one attnspec does not import from GGUF.
    """
    architecture = file.metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise InteropError(f"{file.path}: general.architecture {shorten(architecture)}: attnspec imports GGUF files "
                           f"of {', '.join(sorted(ARCHITECTURES))}; import the release's safetensors checkpoint "
                           "instead")
    mapped = ARCHITECTURES[architecture]
    config = {"model_type": mapped.model_type, "tie_word_embeddings": "output.weight" not in file.tensors}
    prefix = f"{architecture}."
    for key, value in file.metadata.items():
        if key.startswith(prefix) and key[len(prefix):] in mapped.keys:
            config[mapped.keys[key[len(prefix):]]] = value
        elif key in TOKENIZER_KEYS:
            config[TOKENIZER_KEYS[key]] = value
    tokens = file.metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and isinstance(tokens, list):
        config["vocab_size"] = len(tokens)
    return config


class GGUFCheckpoint:
    """A GGUF file read as a transformers checkpoint (module docstring): ``config``, the tensor ``names``
    (transformers' names of the tensors the file holds) and :meth:`read`."""

    def __init__(self, path: Path | str):
        self.path = self.gguf = Path(path)
        self.file = read_gguf(self.path)
        self.config = gguf_config(self.file)
        self.architecture = ARCHITECTURES[self.file.metadata["general.architecture"]]
        self._stored: dict[str, str] = {}

    def bind(self, names: list[str]) -> set[str]:
        """Map the transformers tensor ``names`` a family's links read onto the file's tensors (through the
        ``gguf`` library's name map of the architecture) and return the names the file has. The file's
        tensors no name reaches are returned as they are, so the caller reports them as left over."""
        from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

        arch = next(key for key, value in MODEL_ARCH_NAMES.items()
                    if value == self.file.metadata["general.architecture"])
        name_map = get_tensor_name_map(arch, int(self.config.get("num_hidden_layers", 0)))
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            stored = name_map.get_name(stem) if dot else None
            if stored is not None and f"{stored}.{suffix}" in self.file.tensors:
                self._stored[name] = f"{stored}.{suffix}"
        reached = set(self._stored.values())
        return set(self._stored) | {name for name in self.file.tensors if name not in reached}

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor transformers calls ``name`` (after :meth:`bind`), dequantised, with llama.cpp's
        conversion undone, as ``dtype`` (None: float32)."""
        stored = self._stored.get(name)
        if stored is None:
            raise InteropError(f"{self.path}: has no tensor for {shorten(name)}")
        tensor = read_tensor(self.file, stored)
        if self.architecture.rotary_rows and stored.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = self.config.get("num_attention_heads" if ".attn_q." in stored else "num_key_value_heads")
            tensor = _unpermute_rotary(tensor, heads, self.path, stored)
        if self.architecture.norm_offset and stored.endswith("norm.weight"):
            tensor = tensor - 1
        return tensor if dtype is None else tensor.to(dtype)


def _unpermute_rotary(weight: torch.Tensor, heads, path: Path, name: str) -> torch.Tensor:
    """Undo llama.cpp's Llama conversion of a q or k projection (rows, d): within each of ``heads`` heads
    it stores the rotary pair (i, i + half) as rows 2i, 2i + 1; transformers' order is the halves."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or weight.shape[0] % (2 * heads):
        raise InteropError(f"{path}: tensor {name} has {weight.shape[0]} rows, which {shorten(heads)} heads of "
                           "rotary pairs cannot split")
    return weight.reshape(heads, -1, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def find_gguf(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself, or the one ``.gguf`` in a directory without a ``config.json``;
    None where ``path`` is a transformers directory.

    Raises:
        InteropError: a directory with several ``.gguf`` files and no config (name the file).
    """
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
        if len(found) > 1:
            raise InteropError(f"{path}: holds {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}); "
                               "give the one to import")
        return found[0] if found else None
    return None


__all__ = ["ARCHITECTURES", "GGUFCheckpoint", "GGUFFile", "TensorEntry", "find_gguf", "gguf_config", "read_gguf",
           "read_tensor"]
