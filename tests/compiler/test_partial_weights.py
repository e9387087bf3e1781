"""Edited imports build (issue 36): weights for another spec's model load where they fit.

A two-block softmax model's weights are built into a spec whose second block is a Gated DeltaNet
layer (new tensors: the beta and gate projections, the short convolutions) and whose first MLP is
wider (the same names at other shapes). Every tensor whose name and shape fit is loaded, exactly;
the rest keep the spec's initialisation, exactly as a build without weights draws it; the manifest
and the summary list every initialised tensor, every shape mismatch and every left-over tensor.
``--strict-weights`` refuses instead, naming them, and writes nothing.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file

import attnspec
from attnspec.compiler.build import build_directory
from attnspec.errors import BuildError

BASE = {
    "name": "two-blocks", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 32,
    "layers": [{"mixer": {"kind": "softmax", "heads": 2}, "mlp": {"kind": "mlp", "expansion": 2}},
               {"mixer": {"kind": "softmax", "heads": 2}, "mlp": {"kind": "mlp", "expansion": 2}}],
}
EDITS = ["blocks[1].mixer={kind: delta, heads: 2, output_gate: swish, group_norm: true, conv: short, "
         "transition: {kind: mamba}}", "blocks[0].mlp.expansion=3"]
FAST = {"compile_check": False, "calibrate": False}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The base build (what an import writes) and the edited spec built without weights."""
    root = tmp_path_factory.mktemp("partial")
    base = build_directory(BASE, root / "base", **FAST)
    plain = build_directory(BASE, root / "plain", overrides=EDITS, **FAST)
    return root, base, plain


def test_an_edited_spec_builds_with_what_fits_and_lists_the_rest(imported):
    root, base, plain = imported
    weights = base.directory / "model.safetensors"
    edited = build_directory(BASE, root / "edited", overrides=EDITS, weights=weights, **FAST)
    source, fresh = load_file(str(weights)), load_file(str(plain.directory / "model.safetensors"))
    built = load_file(str(edited.directory / "model.safetensors"))
    fit = edited.manifest["weights"]
    mismatched = {entry["name"]: (entry["file"], entry["model"]) for entry in fit["mismatched"]}
    assert mismatched == {"blocks.0.mlp.up.weight": ([32, 16], [48, 16]), "blocks.0.mlp.up.bias": ([32], [48]),
                          "blocks.0.mlp.down.weight": ([16, 32], [16, 48])}
    new = {name for name in built if name not in source}  # the delta layer's own: beta, gate, convs, Mamba gate
    assert len(new) == 9 and all(name.startswith("blocks.1.mixer.") for name in new)
    assert set(fit["initialised"]) == new | set(mismatched)
    assert fit["loaded"] == len(built) - len(fit["initialised"])
    assert set(fit["ignored"]) == {name for name in source if name not in built}
    for name, tensor in built.items():  # loaded exactly; the rest exactly the spec's own initialisation
        expected = fresh[name] if name in fit["initialised"] else source[name]
        assert tensor.equal(expected), name
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):  # the delta layer starts from the attention's q/k/v/o
        assert built[f"blocks.1.mixer.{name}.weight"].equal(source[f"blocks.1.mixer.{name}.weight"])


def test_strict_weights_refuse_naming_every_misfit_and_write_nothing(imported):
    root, base, _ = imported
    with pytest.raises(BuildError) as error:
        build_directory(BASE, root / "strict", overrides=EDITS, weights=base.directory / "model.safetensors",
                        strict_weights=True, **FAST)
    message = str(error.value)
    assert "missing" in message and "blocks.1.mixer.beta_proj.weight" in message and "--strict-weights" in message
    assert not (root / "strict").exists()


def test_load_takes_other_weights_where_they_fit_and_warns(imported):
    _, base, plain = imported
    with pytest.raises(BuildError, match="does not fit"):
        attnspec.load(plain.directory, weights=base.directory / "model.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = attnspec.load(plain.directory, weights=base.directory / "model.safetensors", strict=False)
    assert any("initialised" in str(w.message) or "missing" in str(w.message) for w in caught)
    source = load_file(str(base.directory / "model.safetensors"))
    state = model.state_dict()
    assert model.weights_fit.loaded and all(state[name].equal(source[name]) for name in model.weights_fit.loaded)


@pytest.mark.slow
def test_the_build_summary_lists_what_was_initialised(imported, tmp_path):
    import subprocess
    import sys

    _, base, _ = imported
    spec = tmp_path / "two.yaml"
    spec.write_text(__import__("json").dumps(BASE))  # JSON is YAML
    command = [sys.executable, "-m", "attnspec", "build", str(spec), "-o", str(tmp_path / "out"), "--no-compile",
               "--no-calibrate", "--weights", str(base.directory / "model.safetensors")]
    for edit in EDITS:
        command += ["--set", edit]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split()).replace("│ ", "")
    assert "25 tensor(s) loaded" in shown and "mixer.beta_proj.weight" in shown, shown
    assert "mlp.up.weight, mlp.up.bias, mlp.down.weight in blocks 0" not in shown  # shapes differ: their own groups
    assert "mlp.up.weight in blocks 0: file (32, 16), model (48, 16)" in shown, shown
    assert "give those blocks the file's widths" in shown
    # off a terminal the table fits 100 columns, its cells wrapped between words, never inside one
    # (the "Next:" commands after it stay whole lines, to copy)
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert len(table) > 10 and max(map(len, table)) <= 100
    from attnspec.cli.display import weights_text

    words = set(result.stdout.replace("│", " ").split())
    fit = json.loads((tmp_path / "out" / "manifest.json").read_text())["weights"]
    assert set(weights_text(fit).split()) <= words


def test_the_weights_summary_groups_tensors_across_blocks():
    """A 30-block import with every attention swapped lists its 60 misfit k/v projections in one group."""
    from attnspec.cli.display import weights_text

    mismatched = [{"name": f"blocks.{block}.mixer.{name}.weight", "file": [192, 576], "model": [576, 576],
                   "file_dtype": "bfloat16", "model_dtype": "bfloat16"} for block in range(30) for name in "kv"]
    fit = {"loaded": 210, "initialised": [entry["name"] for entry in mismatched] + ["blocks.3.mixer.A", "blocks.5.mixer.A"],
           "mismatched": mismatched, "ignored": ["head.weight"]}
    lines = weights_text(fit).splitlines()
    assert lines[1] == "2 not in the file, initialised by the spec's init: mixer.A in blocks 3, 5"
    assert lines[2] == ("60 of another shape or dtype, initialised: mixer.k.weight, mixer.v.weight in blocks 0-29: "
                        "file (192, 576), model (576, 576)")
    assert lines[-1] == "1 in the file the model has no place for, ignored: head.weight"


def test_a_weight_is_finite_as_the_model_holds_it_and_a_dtype_mismatch_is_named(imported, tmp_path):
    """float64 1e300 is inf in a float32 parameter: refused at the load, naming the tensor and why (before,
    the finite check ran on the float64 values and verification blamed the spec's initialisation). An int32
    tensor of the right shape is initialised, listed by its dtype."""
    import torch
    from safetensors.torch import save_file

    from attnspec.cli.display import weights_text
    from attnspec.compiler.load import load_weights

    root, base, _ = imported
    model = attnspec.load(base.directory)
    tensors = {name: tensor.clone() for name, tensor in load_file(str(base.directory / "model.safetensors")).items()}
    tensors["blocks.0.mlp.up.weight"] = tensors["blocks.0.mlp.up.weight"].double()
    tensors["blocks.0.mlp.up.weight"][0, 0] = 1e300
    save_file(tensors, str(tmp_path / "huge.safetensors"))
    with pytest.raises(BuildError, match=r"'blocks.0.mlp.up.weight' holds NaN or infinite values as float32 \(its "
                                         r"float64 values are past float32's range\)"):
        attnspec.load(base.directory, weights=tmp_path / "huge.safetensors", strict=False)
    with pytest.raises(BuildError, match="past float32's range"):
        build_directory(BASE, tmp_path / "out", weights=tmp_path / "huge.safetensors", **FAST)
    assert not (tmp_path / "out").exists()
    tensors["blocks.0.mlp.up.weight"] = torch.ones(32, 16, dtype=torch.int32)
    save_file(tensors, str(tmp_path / "int.safetensors"))
    fit = load_weights(model, tmp_path / "int.safetensors", strict=False)
    assert fit.mismatched == [("blocks.0.mlp.up.weight", [32, 16], [32, 16], "int32", "float32")]
    assert "mlp.up.weight in blocks 0: file (32, 16) int32, model (32, 16) float32" in weights_text(fit.to_json())
    assert fit.problems().endswith("1 of another shape or dtype: 'blocks.0.mlp.up.weight' (32, 16) int32 (model "
                                   "(32, 16) float32)")
    with pytest.raises(BuildError, match=r"tensor 'blocks.0.mlp.up.weight' is int32 \(32, 16\), the spec's model has "
                                         r"float32 \(32, 16\)"):
        load_weights(model, {**load_file(str(tmp_path / "int.safetensors"))}, strict=True)


def test_an_edited_build_carries_the_tokenizer_of_the_build_its_weights_come_from(tmp_path):
    """`build --weights DIR/model.safetensors` of an edited import: run --text and export-hf need the tokenizer."""
    from attnspec.compiler.load import tokenizer_of
    from tests.tokenizer_files import write_tokenizer

    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", "bpe", vocab=300)
    spec = {**BASE, "input": {"kind": "tokens", "vocab_size": 320}}
    base = build_directory(spec, tmp_path / "base", tokenizer=tokenizer, **FAST)
    edited = build_directory(spec, tmp_path / "edited", overrides=EDITS,
                             weights=base.directory / "model.safetensors", **FAST)
    assert tokenizer_of(edited.directory).identity() == tokenizer_of(base.directory).identity()
    bare = build_directory(spec, tmp_path / "bare", **FAST)  # weights from a build without one: none carried
    again = build_directory(spec, tmp_path / "again", weights=bare.directory / "model.safetensors", **FAST)
    assert tokenizer_of(again.directory) is None


GQA = {
    "name": "gqa", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 24, "max_len": 32,
    "layers": [{"mixer": {"kind": "softmax", "heads": 6, "kv_heads": 2, "qkv_bias": True, "position": {"kind": "rope"}},
                "mlp": {"kind": "glu", "expansion": 2}}] * 2,
}


@pytest.mark.parametrize("source, target", [(2, 6), (1, 3), (3, None), (2, 2)])
def test_more_key_value_heads_repeat_the_shared_ones_and_the_attention_keeps_its_function(tmp_path, source, target):
    """Grouped keys and values (6 query heads reading 1, 2 or 3 key/value heads) loaded into the same attention
    with a multiple of them (or none: one per head) repeat each shared head for the queries it served: the
    model computes the same function (float64, to rounding), and the manifest says so; the same count
    loads as it is."""
    spec = {**GQA, "dtype": "float64", "layers": [{**GQA["layers"][0], "mixer": {**GQA["layers"][0]["mixer"],
                                                                                "kv_heads": source}}] * 2}
    base = build_directory(spec, tmp_path / "base", **FAST)
    value = "null" if target is None else target
    edited = build_directory(spec, tmp_path / "edited", weights=base.directory / "model.safetensors",
                             overrides=[f"blocks[1].mixer.kv_heads={value}"], **FAST)
    fit = edited.manifest["weights"]
    assert fit["initialised"] == [] and fit["ignored"] == []
    width = 6 if target is None else target
    assert {entry["name"]: entry["model"] for entry in fit["repeated"]} == ({} if width == source else {
        f"blocks.1.mixer.{name}.{part}": [width * 4] + ([24] if part == "weight" else [])
        for name in ("k_proj", "v_proj") for part in ("weight", "bias")})
    tokens = torch.randint(0, 32, (2, 17), generator=torch.Generator().manual_seed(0))
    before, after = attnspec.load(base.directory), attnspec.load(edited.directory)
    torch.testing.assert_close(after(tokens), before(tokens), rtol=0, atol=1e-12)
    keys = load_file(str(base.directory / "model.safetensors"))["blocks.1.mixer.k_proj.weight"]  # (source * 4, 24)
    repeated = load_file(str(edited.directory / "model.safetensors"))["blocks.1.mixer.k_proj.weight"]
    for head in range(width):  # head h of the new layer is the source's head h // (width / source)
        assert repeated[head * 4:(head + 1) * 4].equal(keys[head // (width // source) * 4:][:4])


def test_a_key_value_count_that_is_no_multiple_is_initialised_and_named(tmp_path):
    base = build_directory(GQA, tmp_path / "base", **FAST)
    edited = build_directory(GQA, tmp_path / "edited", weights=base.directory / "model.safetensors",
                             overrides=["blocks[1].mixer.kv_heads=3"], **FAST)
    fit = edited.manifest["weights"]
    assert fit["repeated"] == [] and sorted(entry["name"] for entry in fit["mismatched"]) == [
        "blocks.1.mixer.k_proj.bias", "blocks.1.mixer.k_proj.weight", "blocks.1.mixer.v_proj.bias",
        "blocks.1.mixer.v_proj.weight"]


def test_a_swapped_mixer_takes_the_attention_s_keys_and_values_repeated(tmp_path):
    """Gated DeltaNet in place of a grouped-query attention (6 heads, 2 key/value heads): q and o load as they
    are, k and v with each shared head repeated for its 3 query heads (Liger's and Mamba-in-the-Llama's
    initialisation); a swap whose widths differ from the source's lists the misfits with what to do."""
    base = build_directory(GQA, tmp_path / "base", **FAST)
    weights = base.directory / "model.safetensors"
    edited = build_directory(GQA, tmp_path / "gdn", weights=weights, **FAST,
                             overrides=["blocks[1].mixer={kind: delta, heads: 6, transition: {kind: mamba}}"])
    fit = edited.manifest["weights"]
    assert sorted(entry["name"] for entry in fit["repeated"]) == ["blocks.1.mixer.k_proj.weight",
                                                                   "blocks.1.mixer.v_proj.weight"]
    assert "blocks.1.mixer.k_proj.bias" in fit["ignored"]  # the new mixer has no q/k/v biases
    source, built = load_file(str(weights)), load_file(str(edited.directory / "model.safetensors"))
    expected = source["blocks.1.mixer.v_proj.weight"].unflatten(0, (2, 4)).repeat_interleave(3, 0).flatten(0, 1)
    assert built["blocks.1.mixer.v_proj.weight"].equal(expected)
    assert built["blocks.1.mixer.q_proj.weight"].equal(source["blocks.1.mixer.q_proj.weight"])
    assert built["blocks.1.mixer.out_proj.weight"].equal(source["blocks.1.mixer.out_proj.weight"])
    narrower = build_directory(GQA, tmp_path / "narrow", weights=weights, **FAST,
                               overrides=["blocks[1].mixer={kind: delta, heads: 2, d_qk: 4, d_v: 4}"])
    from attnspec.cli.display import weights_text

    shown = weights_text(narrower.manifest["weights"])
    assert "mixer.q_proj.weight in blocks 1: file (24, 24), model (8, 24)" in shown
    assert "give those blocks the file's widths" in shown
