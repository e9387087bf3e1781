"""`lora:` in the training configuration: low-rank adapters on the linear maps its globs name, their maps frozen.
An adapter starts at zero (the model as it was), trains alone beside its frozen map, and is merged into the weights
in every checkpoint (a plain model of the spec, equal to the adapted one to float rounding) with the exact state
beside it, from which a resumed run continues bit for bit; bad targets are located errors that leave nothing."""

from __future__ import annotations

import json

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.io import checkpoint_tensors, latest_checkpoint
from attnspec.training import lora
from tests.training.test_train import MQAR, SPECS, TINY, _tiny_run

TARGETS = ["blocks.*.mixer.q_proj", "blocks.*.mixer.v_proj", "blocks.*.mlp.up"]
LORA = {"targets": TARGETS, "rank": 2, "alpha": 4.0}


def _initial():
    return attnspec.build(SPECS / "softmax-transformer.yaml", *TINY, "position=learned")


def test_an_adapter_starts_at_zero_and_its_merge_equals_the_adapted_model():
    model = _initial().double().eval()
    tokens = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    before = model(tokens)
    adapted = lora.attach_adapters(model, TARGETS, rank=3, alpha=6.0, dropout=0.5)
    assert adapted == ["blocks.0.mixer.q_proj", "blocks.0.mixer.v_proj", "blocks.0.mlp.up"]
    assert torch.equal(model(tokens), before)  # B = 0
    with torch.no_grad():
        for linear in lora.adapted_maps(model).values():
            linear.lora.up.weight.normal_()
    changed = model(tokens)
    assert (changed - before).abs().max() > 0.1
    merged, adapters = lora.split_state(model)
    assert not any(".lora." in name for name in merged) and set(merged) == set(_initial().state_dict())
    plain = _initial().double().eval()
    plain.load_state_dict(merged)
    assert torch.allclose(plain(tokens), changed, rtol=0, atol=1e-12)  # float64: rounding alone
    lora.merge_adapters(model)
    assert not lora.adapted_maps(model) and torch.allclose(model(tokens), changed, rtol=0, atol=1e-12)
    assert all(p.requires_grad for p in model.parameters())


def test_the_adapters_train_their_maps_stay_and_every_checkpoint_holds_the_merged_model(tmp_path):
    run = _tiny_run(tmp_path / "run", steps=6, eval_every=3, lora=LORA)
    start, record = _initial(), json.loads((tmp_path / "run" / "run.json").read_text())
    adapted = ["blocks.0.mixer.q_proj", "blocks.0.mixer.v_proj", "blocks.0.mlp.up"]
    assert record["lora"]["adapted"] == adapted
    assert record["lora"]["parameters"] == 2 * (16 + 16) + 2 * (16 + 16) + 2 * (16 + 64)
    # as peft: the whole base model is frozen, the adapters alone train (lora.train would name more)
    assert set(record["frozen"]) == {name for name, _ in start.named_parameters()}
    trained = {name for group in record["groups"] for name in group["parameters"]}
    assert {f"{name}.lora.{part}.weight" for name in adapted for part in ("down", "up")} == trained
    _, where, _ = latest_checkpoint(tmp_path / "run")
    weights, adapters = checkpoint_tensors(where, "model"), checkpoint_tensors(where, "adapters")
    assert set(weights) == set(start.state_dict())  # a plain model of the spec
    for name in adapted:  # the map's own weight is the one it started from; the checkpoint's is merged
        assert torch.equal(adapters[f"{name}.weight"], start.state_dict()[f"{name}.weight"])
        delta = adapters[f"{name}.lora.up.weight"].double() @ adapters[f"{name}.lora.down.weight"].double() * 2.0
        assert delta.abs().max() > 0
        assert torch.allclose(weights[f"{name}.weight"].double(), adapters[f"{name}.weight"].double() + delta,
                              rtol=0, atol=1e-6)
    assert not lora.adapted_maps(run.model)  # the run's model is merged too
    assert torch.equal(run.model.state_dict()["blocks.0.mixer.q_proj.weight"], weights["blocks.0.mixer.q_proj.weight"])
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(1))
    reloaded = attnspec.load(tmp_path / "run")  # as eval and export read a run
    with torch.no_grad():
        assert torch.allclose(reloaded(tokens), run.model(tokens), rtol=0, atol=1e-5)
    assert run.losses[-1] < run.losses[0]


def test_a_resumed_adapted_run_reproduces_the_uninterrupted_one_bit_for_bit(tmp_path):
    whole = _tiny_run(tmp_path / "whole", checkpoint_every=5, steps=10, lora={**LORA, "dropout": 0.1})
    _tiny_run(tmp_path / "split", checkpoint_every=5, steps=10, stop_after=5, lora={**LORA, "dropout": 0.1})
    resumed = attnspec.train(None, output=tmp_path / "split", resume=True)
    lines = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in lines if r["split"] == "train"] == whole.losses
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_an_adapters_file_holds_only_the_adapted_maps_and_agrees_with_the_merged_weights(tmp_path):
    """The audit's case: an adapters file carrying a model tensor (a zeroed ``embed.weight``) overrode
    ``model.safetensors`` on resume, while ``build`` and ``eval`` of the same checkpoint read the other file.
    Now the file may hold each adapted map's own W, A and B only, of the model's shapes and dtypes, finite,
    W + (alpha / rank) B A the merged weight; anything else is a RunError naming the file, and the run
    directory is left as it was."""
    from safetensors.torch import save_file

    from attnspec.errors import RunError

    _tiny_run(tmp_path / "split", checkpoint_every=5, steps=10, stop_after=5, lora=LORA)
    _, where, _ = latest_checkpoint(tmp_path / "split")
    path = where / "adapters.safetensors"
    original = dict(checkpoint_tensors(where, "adapters"))
    original = {name: tensor.clone() for name, tensor in original.items()}
    q = "blocks.0.mixer.q_proj"
    damaged = {
        "a model tensor": ({**original, "embed.weight": torch.zeros(32, 16)}, "also holds embed.weight"),
        "a missing A": ({n: t for n, t in original.items() if n != f"{q}.lora.down.weight"}, "has no"),
        "another W": ({**original, f"{q}.weight": original[f"{q}.weight"] + 0.01}, "do not make the merged weight"),
        "another B": ({**original, f"{q}.lora.up.weight": original[f"{q}.lora.up.weight"] * 1.5},
                      "do not make the merged weight"),
        "another shape": ({**original, f"{q}.lora.down.weight": original[f"{q}.lora.down.weight"][:1]}, "where the model"),
        "another dtype": ({**original, f"{q}.lora.up.weight": original[f"{q}.lora.up.weight"].double()},
                          "where the model"),
        "NaN": ({**original, f"{q}.lora.up.weight": original[f"{q}.lora.up.weight"] * float("nan")}, "NaN"),
    }
    for case, (tensors, words) in damaged.items():
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(path))
        before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "split").rglob("*"))
        with pytest.raises(RunError, match=words) as refused:
            attnspec.train(None, output=tmp_path / "split", resume=True)
        assert str(path) in str(refused.value), case
        assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "split").rglob("*")) == before, case
    save_file(original, str(path))  # the file as the run wrote it resumes
    assert len(attnspec.train(None, output=tmp_path / "split", resume=True).losses) == 5


@pytest.mark.parametrize("settings, where, words", [
    ({"targets": ["blocks.*.mixer.w_proj"]}, "lora.targets[0]", "names no linear map"),
    ({"targets": ["blocks.*.mixer.q_proj", "head"]}, "lora.targets[1]", "names no linear map"),
    ({"targets": ["blocks.*.mixer.q_proj"], "rank": 0}, "lora.rank", "greater than 0"),
])
def test_adapters_on_nothing_are_located_errors_and_write_nothing(tmp_path, settings, where, words):
    with pytest.raises(SpecError) as refused:
        attnspec.train(SPECS / "softmax-transformer.yaml", overrides=[*TINY, "position=learned"], task="mqar",
                       task_overrides=MQAR, output=tmp_path / "run", steps=2, lora=settings)
    assert where in str(refused.value) and words in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_freezing_what_the_adapters_leave_is_a_located_error(tmp_path):
    with pytest.raises(SpecError, match="freeze every parameter.*adapters' maps are frozen already"):
        _tiny_run(tmp_path / "run", steps=2, lora={"targets": ["blocks.*.mixer.q_proj"]},
                  freeze=["embed.*", "position.*", "blocks.*.norm*", "blocks.*.mixer.[kvo]*", "blocks.*.mixer.out*",
                          "blocks.*.mlp.*", "final_norm.*", "blocks.*.mixer.q_proj.lora.*"])
    assert not (tmp_path / "run").exists()


def test_a_map_the_model_reads_through_its_weight_is_no_lora_target():
    """Mamba reads ``dt_proj`` and ``x_proj`` through their ``.weight`` (never calling them): an adapter there
    would never run (its B would stay 0, nothing trained). Naming them is a located error; the maps it calls
    (``in_proj``, ``out_proj``) adapt, and their adapters receive gradients."""
    model = attnspec.build(SPECS / "mamba.yaml", "d_model=16", "layers[0].repeat=1", "input.vocab_size=32")
    for target in ("blocks.*.mixer.dt_proj", "blocks.*.mixer.x_proj"):
        with pytest.raises(SpecError, match=r"lora\.targets\[1\].*reads through their weight"):
            lora.attach_adapters(model, ["blocks.*.mixer.out_proj", target], rank=2, alpha=2.0, dropout=0.0)
    with pytest.raises(SpecError, match="dt_proj"):  # a glob reaching them is refused the same way
        lora.attach_adapters(model, ["blocks.*.mixer.*_proj"], rank=2, alpha=2.0, dropout=0.0)
    names = lora.attach_adapters(model, ["blocks.*.mixer.in_proj", "blocks.*.mixer.out_proj"], rank=2, alpha=2.0,
                                 dropout=0.0)
    assert names == ["blocks.0.mixer.in_proj", "blocks.0.mixer.out_proj"]
    with torch.no_grad():  # B = 0 gives A no gradient at the start; a nonzero B shows both are reached
        for linear in lora.adapted_maps(model).values():
            linear.lora.up.weight.normal_()
    model.train()
    model(torch.randint(0, 32, (2, 7))).square().mean().backward()
    for linear in lora.adapted_maps(model).values():
        assert linear.lora.up.weight.grad.abs().sum() > 0 and linear.lora.down.weight.grad.abs().sum() > 0
