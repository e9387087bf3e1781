"""Shared blocks (``shared:`` in a spec; Zamba's shared attention): one parameter set called from several
blocks, each call with its own input ([hidden, embeddings] here), its own output map, its own low-rank
adapters and its own decoding state. Held to the same computation written another way: each call's
adapters merged into a standalone copy of the shared block's weights (W + B A), in float64, forward and
backward (tolerance 1e-12: the same operations but for the order of the LoRA sum); decoding to the
full-sequence forward; and to transformers' Zamba2 in tests/hf/test_interop.py."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from safetensors.torch import save

from attnspec.errors import SpecError
from attnspec.nn.model import build_model_from_spec
from attnspec.nn.shared import VIEW
from attnspec.spec import load_spec

SHARED = {"name": "memory", "reads": "hidden_and_embeddings", "adapter_rank": 3,
          "block": {"mixer": {"kind": "softmax", "heads": 2, "causal": True, "position": "rope"},
                    "mlp": {"kind": "glu", "hidden": 24}, "norm": "rmsnorm", "residual": False}}
DELTA = {"kind": "delta", "heads": 2, "causal": True}


def _data() -> dict:
    layers = [{"mixer": DELTA, "norm": "rmsnorm", "mlp": "none", **({"shared": {"name": "memory"}} if i else {})}
              for i in range(3)]
    return {"name": "zamba-like", "dtype": "float64", "input": {"kind": "tokens", "vocab_size": 40}, "d_model": 16,
            "max_len": 48, "shared": [copy.deepcopy(SHARED)], "layers": layers, "final_norm": "rmsnorm"}


def _model(data: dict | None = None):
    model = build_model_from_spec(load_spec(data or _data()))
    with torch.no_grad():  # adapters start at B = 0 (a no-op): give each its own nonzero B
        for block in model.blocks:
            if block.shared_use is not None:
                for adapter in block.shared_use.adapters.values():
                    adapter.up.weight.normal_(0.0, 0.3)
    return model


def _merged(model, block) -> torch.nn.Module:
    """The shared block with this call's adapters merged into its weights, standalone (no ties)."""
    alone = copy.deepcopy(model.shared_blocks["memory"])
    adapters = block.shared_use.adapters
    with torch.no_grad():
        for name in "qkv":
            low = adapters[name]
            getattr(alone.mixer, f"{name}_proj").weight += low.up.weight @ low.down.weight
        hidden = alone.mlp.up.out_features
        delta = adapters["mlp"].up.weight @ adapters["mlp"].down.weight
        alone.mlp.up.weight += delta[:hidden]
        alone.mlp.gate.weight += delta[hidden:]
    return alone


def test_a_call_of_a_shared_block_is_its_merged_weights_on_hidden_and_embeddings_added_before_the_norm():
    model = _model()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 13, 16, dtype=torch.float64, generator=g, requires_grad=True)
    embeddings = torch.randn(2, 13, 16, dtype=torch.float64, generator=g)
    for block in model.blocks[1:]:
        alone = _merged(model, block)
        feed = block.shared_use.proj(alone(torch.cat([x, embeddings], -1)))
        expected = x + block.mixer(block.norm1(x + feed))
        out = block(x, None, embeddings)
        assert (out - expected).abs().max() < 1e-12
        (grad,) = torch.autograd.grad(out.pow(2).sum(), x)
        (wanted,) = torch.autograd.grad(expected.pow(2).sum(), x)
        assert (grad - wanted).abs().max() < 1e-10


def test_every_call_trains_the_one_shared_weight_which_the_state_dict_holds_once():
    model = _model()
    canonical = model.shared_blocks["memory"]
    views = [getattr(block.shared_use, VIEW) for block in model.blocks[1:]]
    assert all(view.mixer.out_proj.weight is canonical.mixer.out_proj.weight for view in views)
    assert all(view.mixer.q_proj.base.weight is canonical.mixer.q_proj.weight for view in views)
    state = model.state_dict()
    assert not any(f".{VIEW}." in name for name in state)
    assert sum(name.startswith("shared_blocks.memory.") for name in state) == len(list(canonical.state_dict()))
    save(state)  # one tensor per name: safetensors refuses tensors that share memory
    assert len({id(p) for p in model.parameters()}) == len(list(model.named_parameters()))
    tokens = torch.randint(0, 40, (2, 11), generator=torch.Generator().manual_seed(2))
    model(tokens).logsumexp(-1).sum().backward()
    # the shared weight's gradient is the sum over its two calls: each call alone gives a part of it
    total = canonical.mixer.k_proj.weight.grad.clone()
    parts = []
    for keep in (1, 2):
        other = _model()
        other.load_state_dict(model.state_dict())
        other.blocks[3 - keep].shared_use.tied_view.mixer.k_proj.base.weight = torch.nn.Parameter(
            canonical.mixer.k_proj.weight.detach().clone())  # untie the other call from the shared weight
        other(tokens).logsumexp(-1).sum().backward()
        parts.append(other.shared_blocks["memory"].mixer.k_proj.weight.grad)
    assert (parts[0] + parts[1] - total).abs().max() < 1e-10 and parts[0].abs().max() > 0 and parts[1].abs().max() > 0
    fresh = build_model_from_spec(load_spec(_data()))
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh(tokens), model(tokens).detach())


def test_a_model_made_empty_takes_its_weights_file_with_every_call_tied_to_the_shared_weight(tmp_path):
    """``attnspec.load`` and the compile check make the model with empty parameters and assign the file's
    tensors: each call's view must hold the loaded shared tensors, not the empty ones it was made with."""
    from attnspec.compiler.load import load_weights
    from attnspec.io import save_tensors

    model = _model()
    save_tensors(tmp_path / "model.safetensors", {k: v.detach().contiguous() for k, v in model.state_dict().items()})
    empty = build_model_from_spec(load_spec(_data()), empty=True)
    load_weights(empty, tmp_path / "model.safetensors")
    canonical = empty.shared_blocks["memory"]
    for block in empty.blocks[1:]:
        view = getattr(block.shared_use, VIEW)
        assert view.mixer.out_proj.weight is canonical.mixer.out_proj.weight
        assert view.mixer.q_proj.base.weight is canonical.mixer.q_proj.weight
    held = [tensor for module in empty.modules() for tensor in [*module._parameters.values(), *module._buffers.values()]]
    assert not any(tensor.is_meta for tensor in held if tensor is not None)
    tokens = torch.randint(0, 40, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (empty(tokens) - model(tokens)).abs().max() < 1e-12  # float64; the file's tensors, mapped


def test_decoding_keeps_a_cache_per_call_and_continues_the_prefill_as_the_forward_computes():
    model = _model()
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(tokens)
        layout = model.state_layout()
        assert layout[1] == layout[0] + 3  # the shared attention's keys, values and decay bias at each call
        state = model.init_state(2)
        stepped = []
        for t in range(12):
            logits, *state = model.step(tokens[:, t], *state)
            stepped.append(logits)
        assert (torch.stack(stepped, 1) - expected).abs().max() < 1e-12
        logits, *state = model.prefill(tokens[:, :7])
        for t in range(7, 12):
            last, *state = model.step(tokens[:, t], *state)
        assert (logits - expected[:, :7]).abs().max() < 1e-12 and (last - expected[:, -1]).abs().max() < 1e-12


@pytest.mark.slow  # compiles the model twice over (about 40 s here): the full suite runs it
def test_a_model_with_shared_blocks_compiles_whole_and_at_every_length_without_recompiling():
    model = _model()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for length in (9, 17):
        tokens = torch.randint(0, 40, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile" if length == 17 else "default"):
            assert (compiled(tokens) - model(tokens)).abs().max() < 1e-10


def _with(change) -> dict:
    data = _data()
    change(data)
    return data


@pytest.mark.parametrize("change, path, words", [
    (lambda d: d["layers"][1]["shared"].update(name="nope"), "layers[1].shared.name", "no shared block is named"),
    (lambda d: d["shared"].append({**copy.deepcopy(SHARED), "name": "spare"}), "shared[1].name", "no block calls"),
    (lambda d: d["shared"].append(copy.deepcopy(SHARED)), "shared[1].name", "named 'memory' already"),
    (lambda d: d["shared"][0]["block"].update(residual=True), "shared[0].block.residual", "residual: {mixer: false}"),
    (lambda d: d["shared"][0]["block"].update(mixer={"kind": "mamba"}), "shared[0].block.mixer.kind",
     "projects its input"),
    (lambda d: d["shared"][0]["block"].update(mlp={"kind": "moe", "experts": 2, "top_k": 1, "hidden": 8}),
     "shared[0].adapt", "dense MLP"),
    (lambda d: d["layers"][1].update(norm_placement="post"), "layers[1].norm_placement", "`pre` placement"),
    (lambda d: d["layers"][1].update(mixer="none", mlp="glu"), "layers[1].shared", "has no mixer"),
    (lambda d: d["shared"][0]["block"].update(shared={"name": "memory"}), "shared[0].block.shared", "cannot itself"),
    (lambda d: d["shared"][0].update(adapt=["q", "v", "q"]), "shared[0].adapt", "names `q` more than once"),
])
def test_an_impossible_use_of_a_shared_block_is_a_located_error(change, path, words):
    with pytest.raises(SpecError) as caught:
        load_spec(_with(change))
    problems = [(problem.path, problem.message) for problem in caught.value.problems]
    assert any(where == path and words in message for where, message in problems), problems


@pytest.mark.parametrize("mixer", [
    {"kind": "linear", "heads": 2, "causal": True, "transition": "data",
     "conv": {"kind": "short", "projections": ["q", "k", "v"]}, "output_gate": "sigmoid"},
    {"kind": "delta", "heads": 2, "causal": True, "transition": {"kind": "mamba"}},
    {"kind": "mlstm", "heads": 2, "group_norm": True, "norm_center": True, "output_gate": "sigmoid"},
    {"kind": "scatterbrain", "heads": 2, "causal": True},
], ids=lambda mixer: mixer["kind"])
def test_every_family_that_projects_its_input_reads_hidden_and_embeddings_and_decodes(mixer):
    """The families `projects_input` names take the 2 d_model input in every input map (projections,
    data-dependent gates and transitions) and decode as their forward computes."""
    data = _data()
    data["shared"][0]["block"]["mixer"] = mixer
    data["shared"][0]["adapt"] = ["q", "k", "v"]
    model = _model(data)
    assert model.shared_blocks["memory"].mixer.q_proj.in_features == 32
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(tokens)
        state = model.init_state(2)
        stepped = []
        for t in range(9):
            logits, *state = model.step(tokens[:, t], *state)
            stepped.append(logits)
    assert (torch.stack(stepped, 1) - expected).abs().max() < 1e-10
