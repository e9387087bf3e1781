"""Every linear map of every family is either adaptable, and then its adapter's B receives a gradient, or a
located error saying the model reads it through its weight (where no adapter could run) or reads its output
through no gradient (sparse attention's indexer: an adapter there would never train).

The models: every spec of ``specs/`` (tiny) and the released models' parts in one spec (``FAMILIES``: latent
attention with an indexer, the RG-LRU, experts, the gated convolution, Mamba, mLSTM, RWKV, parallel branches,
attention experts, cross-layer sharing...). Each of a model's linear maps (bar a shared block's, which its calls
alias, and the tied view) is named alone as a ``lora.targets`` glob, and those accepted are probed again all
together (an adapted map feeding another must not hide it); they are then adapted together, a
forward and backward pass of a training batch (4 rows of 16 positions: every expert routed) runs, and every
adapter's B must have a finite, non-zero gradient (B starts at 0, so its gradient is the output's gradient times
A x: zero only where the adapter never runs). A map refused as read through its weight must be one the same pass
never calls; one refused for no gradient, one whose output no gradient of the pass reaches.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import attnspec
from attnspec.compiler.tracing import example_input
from attnspec.errors import SpecError
from attnspec.training import lora
from tests.compiler.test_build_programs import FAMILIES
from tests.conftest import ROOT

TINY = ["d_model=16", "max_len=16", "input.vocab_size=32"]
OWN_SIZES = {"ffn-aoglu": ["d_model=64", "max_len=16", "layers[0].layers[0].mixer.feature_map.rank=4"],
             "rank-collapse-san": ["d_model=16", "max_len=16", "input.dim=16"]}
"""Specs the tiny sizes do not fit (AOGLU's rank needs d_qk > 2 rank; features rather than tokens)."""
MODELS = [path.stem for path in sorted((ROOT / "specs").glob("*.yaml"))] + ["families"]


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "families":
        return attnspec.build({**FAMILIES, "max_len": 32})
    return attnspec.build(ROOT / "specs" / f"{name}.yaml", *OWN_SIZES.get(name, TINY))


@pytest.mark.parametrize("name", MODELS)
def test_every_adaptable_map_s_b_receives_a_gradient_and_every_other_is_a_located_error(name, capsys):
    model = _model(name).train()
    maps = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)
            and not n.startswith("shared_blocks.") and ".tied_view." not in n]
    adaptable, refused = [], []
    for map_name in maps:
        try:
            lora.matched_maps(model, [map_name])
            adaptable.append(map_name)
        except SpecError as error:
            assert "lora.targets[0]" in str(error) and ("through their weight" in str(error)
                                                         or "through no gradient" in str(error)), str(error)
            refused.append(map_name)
    modules = dict(model.named_modules())  # probed together (maps feeding one another), the verdicts stay
    assert lora._probed(model, {n: modules[n] for n in adaptable}) == (set(), set())
    batch = example_input(model, 4, 16, torch.Generator().manual_seed(1))
    called: set[str] = set()
    leaves: dict[str, torch.Tensor] = {}

    def seen(module, args, output, n):
        called.add(n)
        leaves[n] = output + torch.zeros((), dtype=output.dtype, requires_grad=True)  # same values, graph kept
        return leaves[n]

    hooks = [modules[n].register_forward_hook(lambda m, a, o, n=n: seen(m, a, o, n)) for n in refused]
    if adaptable:
        lora.attach_adapters(model, adaptable, rank=2, alpha=4.0, dropout=0.0)
    output = model(batch)
    for hook in hooks:
        hook.remove()
    cotangent = torch.randn_like(output)
    reached = torch.autograd.grad(output, list(leaves.values()), cotangent, retain_graph=True, allow_unused=True) \
        if leaves else []
    output.backward(cotangent)
    silent = [n for n in adaptable if modules[n].lora.up.weight.grad is None
              or not bool(torch.isfinite(modules[n].lora.up.weight.grad).all())
              or float(modules[n].lora.up.weight.grad.abs().max()) == 0.0]
    assert not silent, f"adapters whose B receives no gradient: {silent}"
    trained = {n for n, grad in zip(leaves, reached) if grad is not None and float(grad.abs().max()) > 0}
    assert not trained, f"refused, yet the output's gradient reaches them: {sorted(trained)}"
    weights_read = [n for n in refused if n not in called]  # the others: called, their output reached by no gradient
    with capsys.disabled():
        print(f"\n  {name}: {len(adaptable)} adaptable maps, B of each trained; refused: {len(weights_read)} read "
              f"through their weight {weights_read[:2]}, {len(refused) - len(weights_read)} reached by no gradient "
              f"{sorted(called)[:2]}", end="")
