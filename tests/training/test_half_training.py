"""Training a spec whose parameters are bfloat16 (``dtype: bfloat16``, an imported release's dtype).

The run keeps float32 master weights (AdamW's updates are below bfloat16's resolution at a learning
rate of 1e-3 x a weight of 1) and computes in bfloat16 (autocast), which is exactly a float32 spec
trained with ``precision: bfloat16``: the losses are compared bit for bit. Its checkpoints hold the
float32 master weights; building the run casts them to the spec's bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

import attnspec
from attnspec.errors import SpecError
from attnspec.io import latest_checkpoint
from tests.conftest import ROOT

SPECS = ROOT / "specs"
TINY = ["d_model=16", "layers[0].repeat=1", "max_len=16", "input.vocab_size=32", "position=learned"]
SETTINGS = dict(task="mqar", task_overrides=["seq_len=16", "vocab_size=32", "num_kv_pairs=2"], steps=4, batch_size=4,
                eval_every=0, test_examples=8, lr=3e-3)


def test_a_bfloat16_spec_trains_float32_master_weights_in_bfloat16_products(tmp_path):
    half = attnspec.train(SPECS / "mamba2.yaml", overrides=[*TINY, "dtype=bfloat16"], output=tmp_path / "run",
                          **SETTINGS)
    mixed = attnspec.train(SPECS / "mamba2.yaml", overrides=[*TINY, "dtype=float32"], precision="bfloat16",
                           **SETTINGS)
    assert half.losses == mixed.losses and len(half.losses) == 4
    weights = latest_checkpoint(tmp_path / "run")[1] / "model.safetensors"
    with safe_open(str(weights), "pt") as file:
        assert {file.get_slice(name).get_dtype() for name in file.keys()} == {"F32"}

    from attnspec.compiler.build import build_directory

    build_directory(tmp_path / "run", tmp_path / "build", compile_check=False, calibrate=False, programs=())
    built = attnspec.load(tmp_path / "build")
    assert built.embed.weight.dtype == torch.bfloat16
    assert built.blocks[0].mixer.transition.A_log.dtype == torch.float32  # the family's decay stays float32
    with safe_open(str(weights), "pt") as file:
        master = file.get_tensor("embed.weight")
    assert torch.equal(built.embed.weight, master.to(torch.bfloat16))


def test_float16_training_and_a_float32_precision_for_a_bfloat16_spec_are_refused_located(tmp_path):
    with pytest.raises(SpecError, match="dtype.*float16.*loss scaling"):
        attnspec.train(SPECS / "softmax-transformer.yaml", overrides=[*TINY, "dtype=float16"], output=tmp_path / "a",
                       **SETTINGS)
    with pytest.raises(SpecError, match="precision.*contradicts"):
        attnspec.train(SPECS / "softmax-transformer.yaml", overrides=[*TINY, "dtype=bfloat16"], precision="float32",
                       output=tmp_path / "b", **SETTINGS)
    assert not any(tmp_path.iterdir())
