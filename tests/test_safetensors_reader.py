"""attnspec's safetensors reader (:mod:`attnspec.io`) judges a file as the ``safetensors`` library does.

The library validates each file (:func:`attnspec.io._judged_by_safetensors`); attnspec reads the header a
second time only for the byte offsets its copy-on-write memory map needs. So the two must agree: every
damage class the library refuses (stray bytes after the header, overlapping ranges, duplicate names,
gaps, trailing data, a byte size that is not the shape's, offsets past the data) is a RunError naming
the file, and a seeded fuzz of header and framing damage finds no file attnspec reads differently from
the library: refused by one means refused by the other (but for attnspec's own stricter limits, counted),
and accepted means every tensor equal to the library's.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from attnspec.errors import RunError
from attnspec.io import map_safetensors, read_safetensors_tensor

SEED = 20261129
FUZZED = 400


def _file(path: Path, header: dict | str, data: bytes, between: bytes = b"") -> Path:
    text = header if isinstance(header, str) else json.dumps(header)
    path.write_bytes(struct.pack("<Q", len(text.encode())) + text.encode() + between + data)
    return path


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


TWO = {"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 8, 16)}
DAMAGE = {  # name -> (header, data, bytes between header and data)
    "stray bytes after the header": (TWO, bytes(16), b"\0\0\0\0"),
    "overlapping ranges": ({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 4, 12)}, bytes(12), b""),
    "duplicate names": ('{"a": %s, "a": %s}' % (json.dumps(_entry("F32", [2], 0, 8)),
                                                json.dumps(_entry("F32", [2], 8, 16))), bytes(16), b""),
    "duplicate names at one range": ('{"a": %s, "a": %s}' % ((json.dumps(_entry("F32", [2], 0, 8)),) * 2),
                                     bytes(8), b""),
    "a gap between tensors": ({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 12, 20)}, bytes(20), b""),
    "trailing data": ({"a": _entry("F32", [2], 0, 8)}, bytes(12), b""),
    "a size that is not the shape's": ({"a": _entry("F32", [3], 0, 8)}, bytes(8), b""),
    "a range past the data": ({"a": _entry("F32", [4], 0, 16)}, bytes(8), b""),
    "a shape overflowing": ({"a": _entry("F32", [1 << 62, 4], 0, 8)}, bytes(8), b""),
    "reversed offsets": ({"a": _entry("F32", [0], 8, 0)}, bytes(8), b""),
    "metadata not strings": ({"a": _entry("F32", [2], 0, 8), "__metadata__": {"n": 1}}, bytes(8), b""),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_damage_class_the_library_refuses_is_a_run_error_naming_the_file(tmp_path, damage):
    from safetensors import SafetensorError, safe_open

    header, data, between = DAMAGE[damage]
    path = _file(tmp_path / "weights.safetensors", header, data, between)
    with pytest.raises(RunError, match=str(path)):
        map_safetensors(path)
    with pytest.raises(RunError, match=str(path)):
        read_safetensors_tensor(path, "a")
    if damage != "duplicate names at one range":  # the library keeps one of two equal entries; attnspec refuses
        with pytest.raises(SafetensorError):
            safe_open(str(path), framework="pt")


def _library(path: Path) -> dict | str:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as opened:
            return {name: opened.get_tensor(name) for name in opened.keys()}
    except Exception as error:  # noqa: BLE001 - the library's refusal, of any class
        return f"{type(error).__name__}: {error}"


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, compared bit for bit (a NaN equals itself)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _mutate(rng: random.Random, raw: bytes) -> tuple[str, bytes]:
    """One damage to a valid file's bytes: its length prefix, its header's bytes or values, or its framing."""
    length = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + length]), raw[8 + length:]
    kind = rng.choice(["length", "header byte", "offset", "shape", "dtype", "insert", "cut", "append", "swap"])
    if kind == "length":
        raw = struct.pack("<Q", max(0, length + rng.choice([-9, -1, 1, 7, 8, 1 << 40]))) + raw[8:]
    elif kind == "header byte":
        at = 8 + rng.randrange(length)
        raw = raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1:]
    elif kind in ("offset", "shape", "dtype", "swap"):
        name = rng.choice([n for n in header if n != "__metadata__"])
        entry = header[name]
        if kind == "offset":
            side = rng.randrange(2)
            entry["data_offsets"][side] += rng.choice([-4, -1, 1, 2, 4, 1 << 40])
        elif kind == "shape":
            shape = entry["shape"]
            entry["shape"] = rng.choice([[], [0], shape + [1], [shape[0] + 1, *shape[1:]] if shape else [2],
                                         list(reversed(shape)), [1 << 40]])
        elif kind == "dtype":
            entry["dtype"] = rng.choice(["F16", "I64", "U8", "BF16", "F8_E8M0", "C64", "f32", ""])
        else:
            other = rng.choice([n for n in header if n not in ("__metadata__", name)])
            entry["data_offsets"], header[other]["data_offsets"] = header[other]["data_offsets"], entry["data_offsets"]
        text = json.dumps(header).encode()
        raw = struct.pack("<Q", len(text)) + text + data
    elif kind == "insert":
        at = rng.randrange(8 + length, len(raw) + 1)
        raw = raw[:at] + rng.randbytes(rng.choice([1, 4, 8])) + raw[at:]
    elif kind == "cut":
        at = rng.randrange(8, len(raw))
        raw = raw[:at] + raw[at + rng.choice([1, 4, 8]):]
    else:
        raw += rng.randbytes(rng.choice([1, 4, 64]))
    return kind, raw


def test_a_fuzzed_file_is_read_as_the_library_reads_it_or_refused_by_both(tmp_path, capsys):
    """400 seeded damages of a valid file of four tensors (three dtypes, a scalar, an empty one)."""
    from safetensors.torch import save_file

    rng = random.Random(SEED)
    original = tmp_path / "original.safetensors"
    save_file({"w": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64), "s": torch.tensor(2.5,
               dtype=torch.float64), "e": torch.zeros(0, 4, dtype=torch.bfloat16)}, str(original),
              metadata={"format": "pt"})
    valid = original.read_bytes()
    counts, findings = Counter(), []
    for index in range(FUZZED):
        kind, raw = _mutate(rng, valid)
        path = tmp_path / f"fuzzed-{index}.safetensors"
        path.write_bytes(raw)
        library = _library(path)
        try:
            ours = map_safetensors(path)
        except RunError as error:
            ours = f"RunError: {error}"
            assert str(path) in str(error)
        counts["inputs"] += 1
        if isinstance(ours, str) and isinstance(library, str):
            counts["refused by both"] += 1
        elif isinstance(ours, dict) and isinstance(library, dict):
            same = ours.keys() == library.keys() and all(
                ours[n].dtype == library[n].dtype and ours[n].shape == library[n].shape
                and torch.equal(_bytes(ours[n]), _bytes(library[n])) for n in ours)
            counts["read alike" if same else "silent-wrong"] += 1
            if not same:
                findings.append(f"{index} {kind}: read otherwise than the library")
        elif isinstance(ours, str):
            counts["refused by attnspec's own limits"] += 1
            if "which attnspec does not read" not in ours:  # only attnspec's dtype limit may refuse more
                findings.append(f"{index} {kind}: refused ({ours[:200]}) where the library reads it")
        else:
            counts["silent-wrong"] += 1
            findings.append(f"{index} {kind}: accepted where the library says {library[:200]}")
        path.unlink()
    with capsys.disabled():
        print("\nfuzzed safetensors files:", dict(sorted(counts.items())))
    assert not findings, "\n".join(findings)
    assert counts["refused by both"] > FUZZED // 2 and counts["read alike"] > 0


def test_import_hf_refuses_weights_with_stray_bytes_after_the_header(tmp_path):
    """The audit's case: a checkpoint whose weights file has 4 bytes after its header (every tensor shifted
    by one element, all finite) is a located error, exit 2, nothing written; it used to import."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_attention_heads=2,
                                 num_key_value_heads=1, num_hidden_layers=1)).save_pretrained(tmp_path / "llama")
    weights = tmp_path / "llama" / "model.safetensors"
    raw = weights.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    weights.write_bytes(raw[:8 + length] + b"\0\0\0\0" + raw[8 + length:])
    result = subprocess.run([sys.executable, "-m", "attnspec", "import-hf", str(tmp_path / "llama"), "-o",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "model.safetensors" in result.stderr and "file not fully covered" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
