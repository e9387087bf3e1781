"""Models whose parameters are bfloat16 or float16 (``dtype: bfloat16``: a released checkpoint's own dtype),
against the exact function.

Every shipped spec at ``dtype: bfloat16`` and ``float16``: the parameters are stored in the dtype but for
those the families keep in float32 (their decays) and those ``keep_float32`` names; the decoding state is
float32; the model (forward and step) is finite and within 64 units in the last place of the dtype of the
float64 model with the same weights, relative to the output's largest magnitude (measured: bfloat16 1 to 10
units, the LRU 40; float16 the same in its own units: the error is the dtype's rounding, not the
mixers'); and the build's per-block check against float64 (``verify_model``) passes. A decay rounded to
bfloat16 or a float32 result fed to a bfloat16 product raises or differs by the output's whole size.
"""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.compiler.verify import HALF_TOLERANCE, verify_model
from attnspec.nn.model import float32_names
from tests.compiler.conftest import small_overrides
from tests.conftest import SPECS

HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _pair(spec, dtype: str):
    """The spec's model at ``dtype`` and the float64 model with the very same (rounded) weights."""
    half = attnspec.build(spec, *small_overrides(spec), f"dtype={dtype}").eval()
    exact = attnspec.build(spec, *small_overrides(spec), "dtype=float64").eval()
    exact.load_state_dict({name: tensor.double() if tensor.is_floating_point() else tensor
                           for name, tensor in half.state_dict().items()})
    return half, exact


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("spec", SPECS, ids=lambda path: path.stem)
def test_half_precision_parameters_compute_the_exact_function_to_their_rounding(spec, dtype):
    half, exact = _pair(spec, dtype)
    kept = float32_names(half, half.spec)
    for name, parameter in half.named_parameters():
        assert parameter.dtype == (torch.float32 if name in kept else HALF[dtype]), name
    assert all(t.dtype in (torch.float32, torch.long) for t in half.init_state(1)) if half.has_step else True
    inputs = attnspec.compiler.tracing.example_input(half, 2, 37, torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = half(inputs), exact(inputs.double() if inputs.is_floating_point() else inputs)
    assert got.dtype == HALF[dtype] and torch.isfinite(got).all()
    tolerance = HALF_TOLERANCE[HALF[dtype]]
    assert (got.double() - want).abs().max() <= tolerance * want.abs().max()
    if half.has_step:  # the decoding step, from its float32 state, agrees with the full pass
        state = half.init_state(2)
        with torch.no_grad():
            for t in range(5):
                logits, *state = half.step(inputs[:, t], *state)
            step_want = exact(inputs[:, :5])[:, -1]
        assert (logits.double() - step_want).abs().max() <= tolerance * step_want.abs().max()
    assert verify_model(half).ok


def test_families_keep_their_decays_in_float32_and_keep_float32_adds_more():
    spec = SPECS[0].parent / "qwen3-next-style.yaml"
    model = attnspec.build(spec, *small_overrides(spec), "dtype=bfloat16", "keep_float32=['*norm*']")
    kept = float32_names(model, model.spec)
    assert {name.rsplit(".", 1)[-1] for name in kept} >= {"A_log", "dt_bias", "weight"}
    assert all("norm" in name or name.rsplit(".", 1)[-1] in ("A_log", "dt_bias", "D") for name in kept)
    assert model.embed.weight.dtype == torch.bfloat16 and model.final_norm.weight.dtype == torch.float32
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 64, (1, 9)))).all()
    plain = attnspec.build(spec, *small_overrides(spec))  # a float32 spec keeps nothing apart
    assert float32_names(plain, plain.spec) == set()


def test_a_model_with_empty_parameters_takes_its_weights_file_tensors_once(tmp_path):
    """``attnspec.load`` makes the parameters on the meta device and assigns the file's tensors: the
    model equals the built one, and a file lacking a parameter is refused (never left on the meta device)."""
    from safetensors.torch import load_file, save_file

    from attnspec.compiler.build import build_directory
    from attnspec.errors import BuildError

    spec = SPECS[0].parent / "softmax-transformer.yaml"
    built = build_directory(spec, tmp_path / "b", overrides=small_overrides(spec) + ["dtype=bfloat16"],
                            compile_check=False, calibrate=False, programs=())
    assert sorted(built.manifest["files"]) == ["model.safetensors", "spec.yaml"]
    model = attnspec.load(tmp_path / "b")
    reference = attnspec.build(spec, *small_overrides(spec), "dtype=bfloat16")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert not any(p.is_meta for p in model.parameters())
    tensors = load_file(tmp_path / "b" / "model.safetensors")
    tensors.pop(next(iter(tensors)))
    save_file(tensors, tmp_path / "partial.safetensors")
    from attnspec.compiler.load import load_weights
    from attnspec.nn.model import build_model_from_spec

    empty = build_model_from_spec(model.spec, empty=True)
    with pytest.raises(BuildError, match="does not fit"):
        load_weights(empty, tmp_path / "partial.safetensors")


def test_keep_float32_refuses_a_linear_maps_weight_located():
    from attnspec.errors import SpecError

    spec = SPECS[0].parent / "softmax-transformer.yaml"
    with pytest.raises(SpecError, match="keep_float32.*Linear"):
        attnspec.build(spec, *small_overrides(spec), "dtype=bfloat16", "keep_float32=['*.q_proj.weight']")
