"""Edited imports build (issue 36): weights for another spec's model load where they fit.

A two-block softmax model's weights are built into a spec whose second block is a Gated DeltaNet
layer (new tensors: the beta and gate projections, the short convolutions) and whose first MLP is
wider (the same names at other shapes). Every tensor whose name and shape fit is loaded, exactly;
the rest keep the spec's initialisation, exactly as a build without weights draws it; the manifest
and the summary list every initialised tensor, every shape mismatch and every left-over tensor.
``--strict-weights`` refuses instead, naming them, and writes nothing.
"""

from __future__ import annotations

import warnings

import pytest
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
    shown = " ".join(result.stdout.split())
    assert "25 tensor(s) loaded" in shown and "blocks.1.mixer.beta_proj.weight" in shown
    assert "blocks.0.mlp.up.weight (file (32, 16), model (48, 16))" in shown.replace("│ ", "")


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
    assert "blocks.0.mlp.up.weight (file (32, 16) int32, model (32, 16) float32)" in weights_text(fit.to_json())
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
