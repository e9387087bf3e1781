"""GGUF files in: import-hf reads llama.cpp's format and equals transformers' own reading of the same file.

Tiny files are written here as llama.cpp's converter writes them (tests/hf/gguf_files.py); the real
released models are tests/hf/test_real_models.py's. Hostile files: every header field past its bound is
a located InteropError (exit 2 from the CLI, nothing written).
"""

from __future__ import annotations

import struct

import pytest
import torch

from attnspec.errors import InteropError
from attnspec.interop.convert import import_hf, spec_from_checkpoint
from attnspec.interop.gguf import GGUFCheckpoint, read_gguf
from tests.hf.gguf_files import TOKENS, tiny_gemma3, tiny_llama, write_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.mark.parametrize("make, arch, qtype", [(tiny_llama, "llama", "Q8_0"), (tiny_llama, "llama", "Q4_1"),
                                                (tiny_llama, "llama", "F16"), (tiny_gemma3, "gemma3", "Q8_0")])
def test_a_gguf_file_imports_equal_to_transformers_reading_it(tmp_path, make, arch, qtype):
    model, keys = make()
    path = write_gguf(model, tmp_path / "model.gguf", arch, qtype, keys)
    result = import_hf(path, tmp_path / "build", compile_check=False, calibrate=False, dtype="float32")
    check = result.import_check
    assert check.skipped is None, check.skipped
    # float32 both sides from the same dequantised values: only summation order differs
    assert check.relative_logit_diff < 1e-5 and check.agrees, check.summary()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf",
                                                              dtype=torch.float32).eval()
    import attnspec

    ours = attnspec.load(tmp_path / "build")
    tokens = torch.randint(0, len(TOKENS), (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, found = theirs(tokens).logits, ours(tokens)
    assert (found - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_a_gguf_import_defaults_to_bfloat16_and_names_its_source(tmp_path):
    model, keys = tiny_llama()
    path = write_gguf(model, tmp_path / "model.gguf", "llama", "Q8_0", keys)
    data, spec, model_type = spec_from_checkpoint(tmp_path)  # the directory holding one .gguf
    assert (model_type, spec.dtype) == ("llama", "bfloat16")
    assert "GGUF" in spec.description and spec.name == "model"
    assert GGUFCheckpoint(path).config["tie_word_embeddings"] is False


def test_the_tokenizer_built_from_gguf_encodes_as_transformers_reading_the_file(tmp_path):
    model, keys = tiny_llama()
    path = write_gguf(model, tmp_path / "model.gguf", "llama", "Q8_0", keys)
    from attnspec.interop.gguf_tokenizer import gguf_tokenizer

    ours = gguf_tokenizer(GGUFCheckpoint(path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="model.gguf")
    text = "the theory, then<|endoftext|> other things: 12345 ünïcode\n\n  tab\tend"
    assert ours.encode(text) == theirs(text, add_special_tokens=False).input_ids
    assert ours.encode(text, special=True) == theirs(text).input_ids  # the template's special tokens too
    assert ours.eos == "<|endoftext|>" and ours.eos_id == len(TOKENS) - 1
    assert (ours.bos, ours.bos_id, ours.prefix_id) == (theirs.bos_token, theirs.bos_token_id, theirs.bos_token_id)


# --------------------------------------------------------------------------- hostile files


def _header(tensors: int = 0, entries: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, entries)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _entry(key: bytes, kind: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + payload


def _tensor(name: bytes, dims: list[int], ggml_type: int, offset: int) -> bytes:
    return _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + \
        struct.pack("<IQ", ggml_type, offset)


def _aligned(head: bytes, data: bytes) -> bytes:
    return head + b"\0" * (-len(head) % 32) + data


HOSTILE = {
    "not GGUF": (b"GGML" + bytes(20), "not a GGUF file"),
    "version 1": (_header(version=1), "GGUF version 1"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "2^60 tensors": (_header(tensors=1 << 60), "declares"),
    "truncated header": (_header(entries=1)[:-3], "ends early"),
    "string past the file": (_header(entries=1) + struct.pack("<Q", 1 << 40), "string of"),
    "array of 2^40": (_header(entries=1) + _entry(b"a", 9, struct.pack("<IQ", 4, 1 << 40)), "array of"),
    "array past the file": (_header(entries=1) + _entry(b"a", 9, struct.pack("<IQ", 4, 1000)), "ends early"),
    "nested array": (_header(entries=1) + _entry(b"a", 9, struct.pack("<IQ", 9, 1)), "an array of type 9"),
    "unknown value type": (_header(entries=1) + _entry(b"a", 77, b""), "value type 77"),
    "NaN value": (_header(entries=1) + _entry(b"a", 6, struct.pack("<f", float("nan"))), "not a finite"),
    "key twice": (_header(entries=2) + _entry(b"a", 4, b"\1\0\0\0") * 2, "given twice"),
    "key not UTF-8": (_header(entries=1) + _entry(b"\xff\xfe", 4, b"\1\0\0\0"), "not UTF-8"),
    "bad alignment": (_header(entries=1) + _entry(b"general.alignment", 4, struct.pack("<I", 3)), "power of two"),
    "5 dimensions": (_header(tensors=1) + _tensor(b"t", [1] * 5, 0, 0), "5 dimensions"),
    "2^62 elements": (_header(tensors=1) + _tensor(b"t", [1 << 31, 1 << 31], 0, 0), "past attnspec's limit"),
    "zero extent": (_header(tensors=1) + _tensor(b"t", [0], 0, 0), "past attnspec's limit"),
    "unknown type": (_header(tensors=1) + _tensor(b"t", [4], 99, 0), "ggml type 99"),
    "partial block": (_header(tensors=1) + _tensor(b"t", [33], 8, 0), "whole number"),
    "data past the end": (_aligned(_header(tensors=1) + _tensor(b"t", [64], 0, 0), bytes(16)), "past the end"),
    "misaligned": (_aligned(_header(tensors=1) + _tensor(b"t", [4], 0, 4), bytes(64)), "misaligned"),
    "overlapping": (_aligned(_header(tensors=2) + _tensor(b"a", [16], 0, 0) + _tensor(b"b", [16], 0, 32),
                             bytes(128)), "overlap"),
    "listed twice": (_aligned(_header(tensors=2) + _tensor(b"a", [8], 0, 0) + _tensor(b"a", [8], 0, 32),
                              bytes(64)), "listed twice"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_gguf_header_is_a_located_error(tmp_path, name):
    raw, message = HOSTILE[name]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(raw)
    with pytest.raises(InteropError, match=message) as raised:
        read_gguf(path)
    assert str(path) in str(raised.value)


def test_a_nan_weight_or_an_unmapped_architecture_refuses_the_import_and_writes_nothing(tmp_path):
    model, keys = tiny_llama()
    with torch.no_grad():
        model.model.norm.weight[3] = float("nan")
    path = write_gguf(model, tmp_path / "model.gguf", "llama", "F32", keys)
    with pytest.raises(InteropError, match="tensor 'output_norm.weight' holds NaN"):
        import_hf(path, tmp_path / "out", compile_check=False, calibrate=False, check=False)
    assert not (tmp_path / "out").exists()
    path.write_bytes(_aligned(_header(entries=1) + _entry(b"general.architecture", 8, _string(b"mamba")), b""))
    with pytest.raises(InteropError, match="general.architecture 'mamba'.*attnspec imports GGUF files of gemma2"):
        import_hf(path, tmp_path / "out", compile_check=False, calibrate=False, check=False)


def test_the_cli_refuses_a_hostile_gguf_with_exit_2_and_no_traceback(tmp_path):
    import subprocess
    import sys

    (tmp_path / "bad.gguf").write_bytes(HOSTILE["array of 2^40"][0])
    done = subprocess.run([sys.executable, "-m", "attnspec", "import-hf", str(tmp_path / "bad.gguf"), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    assert "array of" in done.stderr + done.stdout and not (tmp_path / "out").exists()
