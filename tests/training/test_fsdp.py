"""Sharded training (``parallel: fsdp``, FSDP2 on 2 gloo processes) and activation checkpointing.

Every distributed run here is a real ``torchrun`` of 2 CPU processes on a tiny float64 model that has
what the sharding policy treats specially: a mixture-of-experts MLP, a shared block called from two
depths (its tensors held by every use's view), a Mamba mixer whose decays stay float32, and tied
embeddings. The reference is the same run in one process (:func:`attnspec.train`).

Tolerances: the losses of one process and of two agree to 1e-5, the bound the DDP test uses: the
cross-entropy is summed in float32 (``_micro_loss``), so splitting a batch over processes regroups
float32 sums (measured here: 2e-7). FSDP against DDP on the same 2 processes: 1e-12 (the same
reductions of float64 gradients; measured equal to the last digit).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnspec
from attnspec.nn.model import build_model_from_spec
from attnspec.spec import load_spec
from attnspec.training.recompute import blocks_to_recompute, recompute_blocks

SHARED = {"name": "memory", "reads": "hidden", "block": {"mixer": {"kind": "softmax", "heads": 2, "causal": True},
                                                          "mlp": {"kind": "glu", "hidden": 24}, "norm": "rmsnorm"}}
SPEC = {"name": "fsdp-zoo", "dtype": "float64", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16,
        "max_len": 16, "position": "learned", "shared": [SHARED], "final_norm": "rmsnorm",
        "layers": [{"mixer": {"kind": "delta", "heads": 2, "causal": True}, "norm": "rmsnorm",
                    "mlp": {"kind": "moe", "experts": 4, "top_k": 2, "hidden": 8}},
                   {"mixer": {"kind": "mamba", "d_inner": 32}, "norm": "rmsnorm", "mlp": "none",
                    "shared": {"name": "memory"}},
                   {"mixer": {"kind": "softmax", "heads": 2, "causal": True}, "norm": "rmsnorm",
                    "mlp": {"kind": "glu", "hidden": 24}, "shared": {"name": "memory"}}]}
CONFIG = {"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32, "num_kv_pairs": 2}, "steps": 6, "batch_size": 8,
          "accumulate": 2, "eval_every": 0, "test_examples": 16, "lr": 3e-3, "checkpoint_every": 3}

DRIVER = """
import json, sys
from attnspec.training.loop import train
spec, config, output, stop, resume = json.loads(sys.argv[1])
train(spec, config, output=output, stop_after=stop, resume=resume)
"""


def _torchrun(tmp_path: Path, spec, config, output: Path, stop: int | None = None, resume: bool = False) -> None:
    """``train`` on 2 gloo processes under torchrun (``stop``: stop after that step, as interrupted)."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(driver), json.dumps([spec, config, str(output), stop, resume])],
                            capture_output=True, text=True, env=env, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]


def _losses(directory: Path) -> list[float]:
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


def _config(**changes) -> dict:
    return {**copy.deepcopy(CONFIG), **changes}


@pytest.mark.slow
def test_fsdp_trains_as_ddp_and_as_one_process(tmp_path):
    """The same 6 steps (2 micro-batches each) alone, with DDP and with FSDP on 2 processes; the FSDP
    run's checkpoint holds each process's shard, and `attnspec build RUN_DIR` puts them together."""
    alone = attnspec.train(SPEC, _config(), output=tmp_path / "one")
    _torchrun(tmp_path, SPEC, _config(), tmp_path / "ddp")
    _torchrun(tmp_path, SPEC, _config(parallel="fsdp"), tmp_path / "fsdp")
    one, ddp, fsdp = alone.losses, _losses(tmp_path / "ddp"), _losses(tmp_path / "fsdp")
    assert len(one) == len(fsdp) == 6
    assert max(abs(a - b) for a, b in zip(one, fsdp)) < 1e-5, (one, fsdp)
    assert max(abs(a - b) for a, b in zip(ddp, fsdp)) < 1e-12, (ddp, fsdp)
    record = json.loads((tmp_path / "fsdp" / "run.json").read_text())
    assert record["world_size"] == 2 and record["config"]["parallel"] == "fsdp"

    from attnspec.compiler.build import build_directory
    from attnspec.io import latest_checkpoint, shard_file

    folder = latest_checkpoint(tmp_path / "fsdp")[1]
    assert sorted(path.name for path in folder.iterdir()) == [shard_file(0), shard_file(1), "state.json"]
    build_directory(tmp_path / "fsdp", tmp_path / "build", compile_check=False, calibrate=False, programs=())
    model = attnspec.load(tmp_path / "build")  # the shards put together, loaded strictly: every tensor whole
    trained = dict(alone.model.named_parameters())
    assert max(float((p - trained[n]).detach().abs().max()) for n, p in model.named_parameters()) < 1e-4


@pytest.mark.slow
def test_fsdp_resumes_at_another_world_size(tmp_path):
    """Stopped at step 3 on 2 processes and resumed alone (the shards put together), or stopped alone and
    resumed on 2 (whole tensors sharded), or stopped on 2 and resumed on 2 (each reads its shard's pieces):
    the losses of the uninterrupted run."""
    config = _config(parallel="fsdp")
    whole = attnspec.train(SPEC, config).losses
    _torchrun(tmp_path, SPEC, config, tmp_path / "two-one", stop=3)
    assert len(_losses(tmp_path / "two-one")) == 3
    attnspec.train(None, output=tmp_path / "two-one", resume=True)
    attnspec.train(SPEC, config, output=tmp_path / "one-two", stop_after=3)
    _torchrun(tmp_path, None, None, tmp_path / "one-two", resume=True)
    _torchrun(tmp_path, SPEC, config, tmp_path / "two-two", stop=3)
    _torchrun(tmp_path, None, None, tmp_path / "two-two", resume=True)
    for name in ("two-one", "one-two", "two-two"):
        resumed = _losses(tmp_path / name)
        assert len(resumed) == 6 and max(abs(a - b) for a, b in zip(whole, resumed)) < 1e-5, (name, whole, resumed)
        assert json.loads((tmp_path / name / "run.json").read_text())["status"] == "done"


def test_activation_checkpointing_keeps_losses_and_gradients():
    """Recomputing every block, or every second, gives the plain model's loss and gradients bit for bit
    (float64; the recomputation repeats the forward's random draws), and a run's losses alike."""
    spec = load_spec(SPEC)
    tokens = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(0))
    results = []
    for setting in ("none", "blocks", 2):
        model = build_model_from_spec(spec).train()
        chosen = blocks_to_recompute(setting, len(model.blocks))
        recompute_blocks(model, chosen)
        loss = model(tokens).logsumexp(-1).mean()
        loss.backward()
        results.append((chosen, float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert [chosen for chosen, _, _ in results] == [[], [0, 1, 2], [0, 2]]
    for _, loss, grads in results[1:]:
        assert loss == results[0][1]
        assert all(torch.equal(grads[n], results[0][2][n]) for n in grads)
    plain = attnspec.train(SPEC, _config(steps=3, accumulate=1)).losses
    recomputed = attnspec.train(SPEC, _config(steps=3, accumulate=1, activation_checkpointing="blocks")).losses
    assert plain == recomputed


def test_training_configuration_refuses_unknown_parallel_and_recompute_settings():
    from attnspec.errors import SpecError
    from attnspec.training.config import load_config

    for field, value in (("parallel", "zero3"), ("activation_checkpointing", "some"),
                         ("activation_checkpointing", 0)):
        with pytest.raises(SpecError, match=field):
            load_config(_config(**{field: value}))


def _sharded_folder(folder: Path, pieces: list[dict[str, tuple[torch.Tensor, list[int]]]]) -> Path:
    """A sharded checkpoint folder as FSDP runs write it: one file per process, each piece with its offset."""
    from safetensors.torch import save_file

    from attnspec.io import shard_file

    folder.mkdir()
    for rank, tensors in enumerate(pieces):
        info = {name: {"saved_offsets": offset} for name, (_, offset) in tensors.items()}
        save_file({name: tensor.clone().contiguous() for name, (tensor, _) in tensors.items()},
                  str(folder / shard_file(rank)),
                  metadata={"DCP_SHARDING_INFO": json.dumps(info)})
    (folder / "state.json").write_text(json.dumps({"step": 3, "shards": len(pieces)}))
    return folder


def test_a_sharded_checkpoints_pieces_make_whole_tensors_or_are_refused(tmp_path):
    """Pieces of a first-dimension shard put together; a gap, an overlap, a piece of another shape, an offset
    in another dimension or no placement at all is a damaged checkpoint (RunError), never a wrong tensor."""
    from attnspec.errors import RunError
    from attnspec.io import checkpoint_tensors

    weight = torch.arange(15.0).reshape(5, 3)
    good = _sharded_folder(tmp_path / "good", [
        {"model.w": (weight[:3], [0, 0]), "optimizer.w.exp_avg": (weight[:3], [0, 0])},
        {"model.w": (weight[3:], [3, 0]), "optimizer.w.exp_avg": (weight[3:], [3, 0]),
         "optimizer.w.step": (torch.tensor(3.0), [])}])
    assert torch.equal(checkpoint_tensors(good, "model")["w"], weight)
    moments = checkpoint_tensors(good, "optimizer")
    assert torch.equal(moments["w.exp_avg"], weight) and float(moments["w.step"]) == 3.0
    damaged = {"gap": [{"model.w": (weight[:2], [0, 0])}, {"model.w": (weight[3:], [3, 0])}],
               "overlap": [{"model.w": (weight[:3], [0, 0])}, {"model.w": (weight[2:], [2, 0])}],
               "shape": [{"model.w": (weight[:3], [0, 0])}, {"model.w": (weight[3:, :2], [3, 0])}],
               "second dimension": [{"model.w": (weight[:, :2], [0, 0])}, {"model.w": (weight[:, 2:], [0, 2])}],
               "late start": [{"model.w": (weight[1:3], [1, 0])}, {"model.w": (weight[3:], [3, 0])}]}
    for name, pieces in damaged.items():
        folder = _sharded_folder(tmp_path / name.replace(" ", "-"), pieces)
        with pytest.raises(RunError, match="tile it|placement"):
            checkpoint_tensors(folder, "model")
    from safetensors.torch import save_file

    from attnspec.io import shard_file

    bare = tmp_path / "bare"
    bare.mkdir()
    save_file({"model.w": weight}, str(bare / shard_file(0)), metadata={"DCP_SHARDING_INFO": "{}"})
    (bare / "state.json").write_text(json.dumps({"step": 3, "shards": 1}))
    with pytest.raises(RunError, match="placement"):
        checkpoint_tensors(bare, "model")
    for count in ("two", 0, 10 ** 9, True):  # a shard count no run writes, never a loop over it
        (bare / "state.json").write_text(json.dumps({"step": 3, "shards": count}))
        with pytest.raises(RunError, match="shard count"):
            checkpoint_tensors(bare, "model")
