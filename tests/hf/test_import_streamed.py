"""import-hf at a released model's cost: its dtype kept, its weights converted tensor by tensor straight into
the build's one ``model.safetensors`` (no exported programs unless asked), and the import checked against
transformers on a short prompt. The sizes themselves (135M, 360M) are measured in benchmarks/scale.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

import attnspec
from attnspec.errors import RunError
from attnspec.interop.convert import convert_weights, import_hf, spec_from_checkpoint
from attnspec.io import TensorFileWriter
from tests.test_cli import attnspec as attnspec_cli

CONFIG = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def bfloat16_llama(tmp_path_factory):
    """A tiny Llama saved in bfloat16, as released checkpoints are (weights perturbed, seeded)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, dtype="bfloat16")).to(torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    directory = tmp_path_factory.mktemp("llama") / "checkpoint"
    model.save_pretrained(directory)
    return model.eval(), directory


def test_import_keeps_the_checkpoint_dtype_and_writes_its_weights_once(bfloat16_llama, tmp_path):
    reference, checkpoint = bfloat16_llama
    result = import_hf(checkpoint, tmp_path / "build", compile_check=False, calibrate=False)
    build = tmp_path / "build"
    assert result.manifest["dtype"] == "bfloat16" and sorted(p.name for p in build.iterdir()) == \
        ["generation_config.json", "manifest.json", "model.safetensors", "spec.yaml"]  # the release's decoding defaults
    with safe_open(str(build / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(name).get_dtype() for name in handle.keys()} == {"BF16"}
    checkpoint_bytes = (checkpoint / "model.safetensors").stat().st_size
    written = sum(path.stat().st_size for path in build.iterdir())
    assert written <= 1.25 * checkpoint_bytes  # the bound; at 135M it is 1.00x (benchmarks/scale.py)
    # the streamed file holds what the in-memory conversion gives, tensor for tensor
    spec = spec_from_checkpoint(checkpoint)[1]
    streamed = load_file(build / "model.safetensors")
    converted = convert_weights(spec, checkpoint, "llama")
    assert streamed.keys() == converted.keys() and all(torch.equal(streamed[k], converted[k]) for k in streamed)
    # and the model computes transformers' function at bfloat16 (the check import-hf prints)
    check = result.import_check
    assert check.skipped is None and check.agrees and check.relative_logit_diff < 2 ** -5, check
    model = attnspec.load(build)
    tokens = torch.randint(0, CONFIG["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens).float(), reference(tokens).logits.float()
    assert (ours - theirs).abs().max() <= 2 ** -5 * theirs.abs().max()  # 8 units of bfloat16 at 3 blocks


def test_the_import_check_does_not_mask_a_prompt_token_equal_to_the_pad_id(tmp_path):
    """The check's prompt may hold token 0, transformers' pad id there: its ``generate`` must be told the mask
    (without one it masks those tokens and its greedy tokens differ from its own forward's)."""
    from attnspec.interop.check import PROMPT_TOKENS, check_import

    config = LlamaConfig(**{**CONFIG, "vocab_size": 320})  # the check's seeded prompt holds a 0 at this vocabulary
    prompt = torch.randint(0, 320, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    assert 0 in prompt.tolist()[0]
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "checkpoint")
    import_hf(tmp_path / "checkpoint", tmp_path / "build", compile_check=False, calibrate=False, check=False)
    check = check_import(tmp_path / "checkpoint", lambda: attnspec.load(tmp_path / "build"))
    assert check.skipped is None and check.max_logit_diff < 1e-5 and check.agrees, check


def test_import_hf_cli_dtype_programs_and_check_options(bfloat16_llama, tmp_path):
    _, checkpoint = bfloat16_llama
    done = attnspec_cli("import-hf", str(checkpoint), "-o", str(tmp_path / "f32"), "--dtype", "float32",
                        "--programs", "step", "--no-check", "--no-compile", "--no-calibrate")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "f32" / "manifest.json").read_text())
    assert manifest["dtype"] == "float32" and "step.pt2" in manifest["files"] and "model.pt2" not in manifest["files"]
    assert "checked against transformers" not in done.stdout
    ran = attnspec_cli("run", str(tmp_path / "f32"), "--tokens", "1 2 3", "--generate", "3", "--programs")
    assert ran.returncode == 2 and "holds no model.pt2" in ran.stderr and "attnspec export" in ran.stderr
    assert "Traceback" not in ran.stderr
    for args, message in ((["--dtype", "int8"], "--dtype 'int8'"), (["--programs", "model,graph"], "--programs: 'graph'")):
        refused = attnspec_cli("import-hf", str(checkpoint), "-o", str(tmp_path / "no"), *args, "--no-compile")
        assert refused.returncode == 2 and message in refused.stderr and not (tmp_path / "no").exists()


def test_tensor_file_writer_streams_a_safetensors_file_and_refuses_what_it_did_not_declare(tmp_path):
    tensors = {"b": torch.randn(3, 5, dtype=torch.bfloat16), "a": torch.arange(4), "c": torch.randn(0, 2)}
    writer = TensorFileWriter(tmp_path / "w.safetensors", {name: (tuple(t.shape), str(t.dtype)[6:])
                                                           for name, t in tensors.items()}, {"format": "pt"})
    for name in ("c", "b", "a"):  # any order: each goes to its offset
        writer.write(name, tensors[name])
    writer.close()
    loaded = load_file(tmp_path / "w.safetensors")
    assert all(torch.equal(loaded[name], tensors[name]) for name in tensors)
    writer = TensorFileWriter(tmp_path / "x.safetensors", {"a": ((2,), "float32"), "b": ((1,), "float32")})
    with pytest.raises(RunError, match="declared float32"):
        writer.write("a", torch.zeros(3))
    writer.write("a", torch.zeros(2))
    with pytest.raises(RunError, match="never written"):
        writer.close()


def test_written_tensors_start_on_64_byte_boundaries_and_load_anywhere(tmp_path):
    """save_tensors (every file attnspec writes) aligns the data and every tensor whose size is a multiple of 64
    bytes, those first (the format allows no gaps); a mapped model's weights then start on a cache line. An
    exception inside the writer's block leaves no check to trip over: the file is closed, the error passes."""
    import json

    from attnspec.io import TENSOR_ALIGNMENT, map_safetensors, save_tensors

    tensors = {"norm": torch.randn(3, dtype=torch.bfloat16), "w": torch.randn(4, 48, dtype=torch.bfloat16),
               "v": torch.randn(96), "flag": torch.tensor(True), "empty": torch.zeros(0)}
    save_tensors(tmp_path / "t.safetensors", tensors, {"format": "pt"})
    raw = (tmp_path / "t.safetensors").read_bytes()
    start = 8 + int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:start])
    assert start % TENSOR_ALIGNMENT == 0 and header["__metadata__"] == {"format": "pt"}
    assert all(header[name]["data_offsets"][0] % TENSOR_ALIGNMENT == 0 for name in ("w", "v", "empty", "flag"))
    mapped = map_safetensors(tmp_path / "t.safetensors")
    assert all(mapped[name].data_ptr() % TENSOR_ALIGNMENT == 0 for name in ("w", "v"))
    assert all(torch.equal(load_file(tmp_path / "t.safetensors")[name], t) for name, t in tensors.items())
    with pytest.raises(ValueError, match="stop"):
        with TensorFileWriter(tmp_path / "u.safetensors", {"a": ((2,), "float32")}):
            raise ValueError("stop")


@pytest.mark.parametrize("where", [0, 5, 6, 16, 22])
def test_all_finite_checks_every_chunk(monkeypatch, where):
    """The chunked check finds one NaN or infinity wherever it is (chunks of 6: first, inside, on a chunk's
    edge, in the last and partial chunk), in any dtype and layout."""
    import attnspec.io as io

    monkeypatch.setattr(io, "FINITE_CHUNK", 6)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        tensor = torch.randn(23, dtype=dtype)
        assert io.all_finite(tensor) and io.all_finite(tensor[:0]) and io.all_finite(tensor.view(23, 1).T)
        for bad in (float("nan"), float("inf"), -float("inf")):
            poisoned = tensor.clone()
            poisoned[where] = bad
            assert not io.all_finite(poisoned) and not io.all_finite(poisoned.view(1, 23).T)


def test_a_releases_generation_config_travels_through_import_and_export(bfloat16_llama, tmp_path):
    """import-hf carries the checked fields of the checkpoint's generation_config.json (hashed in the manifest),
    export-hf writes them back, and transformers' generate reads them for the exported model; a field that is not
    what transformers writes there is a located error and nothing is written; a changed file is refused."""
    import shutil

    from transformers import AutoModelForCausalLM

    from attnspec.compiler.generation import GENERATION_FILE
    from attnspec.interop.convert import export_hf

    _, original = bfloat16_llama
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(original, checkpoint)
    release = {"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.6, "top_p": 0.9,
               "transformers_version": "5.24.0", "custom_generate": "someone/else"}
    (checkpoint / GENERATION_FILE).write_text(json.dumps(release))
    import_hf(checkpoint, tmp_path / "build", compile_check=False, calibrate=False, check=False)
    manifest = json.loads((tmp_path / "build" / "manifest.json").read_text())
    assert GENERATION_FILE in manifest["files"]
    carried = {key: value for key, value in release.items() if key not in ("transformers_version", "custom_generate")}
    assert json.loads((tmp_path / "build" / GENERATION_FILE).read_text()) == carried
    export_hf(tmp_path / "build", tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").generation_config
    assert (loaded.eos_token_id, loaded.do_sample, loaded.temperature, loaded.top_p) == ([2, 7], True, 0.6, 0.9)
    (tmp_path / "build" / GENERATION_FILE).write_text(json.dumps({**carried, "temperature": 2.0}))
    refused = attnspec_cli("export-hf", str(tmp_path / "build"), "-o", str(tmp_path / "hf2"))
    assert refused.returncode == 2 and GENERATION_FILE in refused.stderr and not (tmp_path / "hf2").exists()
    for field, value in (("eos_token_id", CONFIG["vocab_size"]), ("temperature", "hot"), ("top_p", 1.5)):
        (checkpoint / GENERATION_FILE).write_text(json.dumps({**release, field: value}))
        refused = attnspec_cli("import-hf", str(checkpoint), "-o", str(tmp_path / "no"), "--no-compile", "--no-check")
        assert refused.returncode == 2 and f"{GENERATION_FILE}: {field}" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and not (tmp_path / "no").exists()
