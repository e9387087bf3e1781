"""The mixture-of-experts MLP (``mlp: {kind: moe}``) against a per-token float64 reference.

The reference below is written from the definition, token by token: router scores (softmax or
sigmoid), the top-k by score plus correction bias (within the best groups, where experts are grouped), the chosen scores renormalised and scaled, each
chosen expert's GLU, the shared experts behind their sigmoid gate. The module's two orders of work
(each expert on its own tokens, eagerly; every expert on every token, compiled or exported) are held
to it in float64 at 1e-12 relative (sums of a few dozen products), to each other, with gradients,
compiled fullgraph without recompiles across lengths, and in a built, exported, decoding model. The
load-balancing loss equals transformers' ``load_balancing_loss_func`` for one layer.
"""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.compiler.archive import load_program
from attnspec.nn.channel import MoeMlp
from attnspec.spec.channel import MoeMlp as MoeNode

CASES = {
    "qwen": dict(experts=6, top_k=2, hidden=5, shared=1, shared_hidden=7, shared_gate=True),  # softmax, normalised
    "deepseek": dict(experts=8, top_k=3, hidden=4, scoring="sigmoid", score_bias=True, routed_scale=2.5, shared=2),
    "mixtral-unnormalised": dict(experts=4, top_k=1, hidden=6, normalize=False),
    "plain-experts-all-chosen": dict(experts=3, top_k=3, hidden=4, gated=False, activation="gelu"),
    # Nemotron-H / DeepSeek-V3: 8 experts in 4 groups, a token chooses from the best 2 groups; plain experts
    "grouped-plain": dict(experts=8, top_k=3, hidden=4, gated=False, activation="relu2", scoring="sigmoid",
                          score_bias=True, groups=4, top_groups=2, shared=1, shared_hidden=6),
    # DeepSeek-V2's group_limited_greedy: softmax scores, 6 experts in 3 groups ranked by their best, 2 groups kept
    "deepseek-v2-groups": dict(experts=6, top_k=2, hidden=4, normalize=False, routed_scale=1.5, groups=3, top_groups=2,
                               group_score="max", shared=1),
    # Llama 4: the top-1 logit's sigmoid multiplies the expert's input, beside a shared expert
    "llama4": dict(experts=4, top_k=1, hidden=5, scoring="sigmoid", normalize=False, weight_inputs=True, shared=1,
                   shared_hidden=5),
    # Laguna: sigmoid scores of soft-capped logits (a cap the logits reach), correction bias, scaled, shared expert
    "laguna": dict(experts=5, top_k=2, hidden=4, scoring="sigmoid", score_bias=True, router_softcap=0.5,
                   routed_scale=1.5, shared=1, shared_hidden=6),
    # Kolibri: sigmoid scores, chosen by logits + correction bias, renormalised, one shared expert
    "kolibri": dict(experts=6, top_k=2, hidden=4, scoring="sigmoid", score_bias=True, score_bias_on_logits=True,
                    shared=1, shared_hidden=5),
    # gpt-oss: a biased router, biased experts, clamped GLUs of x σ(1.702 x) (a limit the inputs cross)
    "gpt-oss": dict(experts=5, top_k=2, hidden=6, activation="quick_gelu", router_bias=True, expert_bias=True,
                    glu_limit=0.4),
    # LongCat-Flash: 4 experts and 3 zero-computation ones (a token routed there passes as w x), softmax scores
    # chosen with a correction bias, not renormalised, scaled
    "longcat": dict(experts=4, zero_experts=3, top_k=3, hidden=5, score_bias=True, normalize=False, routed_scale=1.5),
    # JetMoE: softmax over the top-2 logits, one bias on the mixture's output
    "jetmoe": dict(experts=4, top_k=2, hidden=5, output_bias=True),
}


def _module(case: str, d_model: int = 8, seed: int = 0) -> MoeMlp:
    torch.manual_seed(seed)
    module = MoeMlp(MoeNode(kind="moe", **CASES[case]), d_model=d_model).double()
    with torch.no_grad():
        for parameter in module.parameters():  # perturbed: a zero router would tie every score
            parameter.add_(torch.randn_like(parameter) * 0.3)
        if module.score_bias is not None:
            module.score_bias.copy_(torch.randn_like(module.score_bias))
    return module


def reference(module: MoeMlp, x: torch.Tensor) -> torch.Tensor:
    """Token by token in float64, from the definition."""
    node = module
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = node.router.weight @ x[t] + (node.router.bias if node.router.bias is not None else 0)
        if node.router_softcap is not None:
            logits = node.router_softcap * torch.tanh(logits / node.router_softcap)
        scores = logits.softmax(-1) if node.softmax else logits.sigmoid()
        choosing = (logits if node.bias_on_logits else scores) + (node.score_bias if node.score_bias is not None else 0)
        size = node.choices // node.groups  # a group's score: the sum of its two best choosing scores, or its best
        group_scores = [float(choosing[g * size:(g + 1) * size].sort(descending=True).values[:1 if node.group_max
                                                                                          else 2].sum())
                        for g in range(node.groups)]
        kept = sorted(range(node.groups), key=lambda g: -group_scores[g])[:node.top_groups]
        allowed = [e for e in range(node.choices) if e // size in kept]
        chosen = sorted(allowed, key=lambda e: -float(choosing[e]))[:node.top_k]
        weights = scores[chosen]
        if node.normalize:
            weights = weights / weights.sum()
        for e, w in zip(chosen, weights * node.routed_scale):
            if e >= node.experts:  # a zero-computation expert passes the input, weighted
                out[t] += w * x[t]
                continue
            expert = node.routed[e]  # attnspec's GLU: down(act(up x) * gate x)
            affine = lambda layer, v: layer.weight @ v + (layer.bias if layer.bias is not None else 0)  # noqa: E731
            given = x[t] * w if node.weight_inputs else x[t]  # Llama 4: the expert reads w x, its output unweighted
            w = 1.0 if node.weight_inputs else w
            up = affine(expert.up, given)
            limit = expert.glu_limit  # gpt-oss: act(min(up, limit)) * (clamp(gate, -limit, limit) + 1)
            hidden = expert.activation(up if limit is None else up.clamp(max=limit))
            if expert.gate is not None:
                gate = affine(expert.gate, given)
                hidden = hidden * (gate if limit is None else gate.clamp(-limit, limit) + 1)
            out[t] += w * affine(expert.down, hidden)
        if node.shared is not None:
            shared = node.shared
            hidden = shared.activation(shared.up.weight @ x[t])
            s = shared.down.weight @ (hidden * (shared.gate.weight @ x[t]) if shared.gate is not None else hidden)
            out[t] += torch.sigmoid(node.shared_gate.weight @ x[t])[0] * s if node.shared_gate is not None else s
        if node.output_bias is not None:
            out[t] += node.output_bias
    return out


@pytest.mark.parametrize("case", CASES)
def test_both_orders_of_work_equal_the_per_token_reference(case):
    module = _module(case)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(module, x.reshape(-1, 8)).reshape(x.shape)
    eager = module(x)
    _, chosen, weights = module.route(x.reshape(-1, 8))
    dense = module.every_expert(x.reshape(-1, 8), chosen, weights).reshape(x.shape)
    if module.shared is not None or module.output_bias is not None:  # what is not routed: the eager call's
        dense = dense + (eager - module.routed_experts(x.reshape(-1, 8), chosen, weights).reshape(x.shape))
    scale = expected.abs().max()
    assert (eager - expected).abs().max() <= 1e-12 * scale
    assert (dense - expected).abs().max() <= 1e-12 * scale
    assert not torch.isnan(eager).any()
    if case == "longcat":  # zero-computation experts are chosen by some tokens, and real ones by others
        assert (chosen >= 4).any() and (chosen < 4).any()
    if case == "laguna":  # the cap acts: some logits are past it
        assert (module.router(x.reshape(-1, 8)).abs() > 0.5).any()
    if case == "kolibri":  # the bias on the logits chooses other experts than the same bias on the scores would
        logits = module.router(x.reshape(-1, 8))
        on_scores = (logits.sigmoid() + module.score_bias).topk(2, dim=-1).indices.sort(-1).values
        assert not torch.equal(on_scores, chosen.sort(-1).values)
    if case == "gpt-oss":  # the clamps act on these inputs, above and below
        pre = torch.stack([expert.up(x) for expert in module.routed]), torch.stack([e.gate(x) for e in module.routed])
        assert (pre[0] > 0.4).any() and (pre[1] < -0.4).any() and (pre[1] > 0.4).any()


def test_quick_gelu_is_x_times_the_sigmoid_of_1_702_x():
    from attnspec.nn.channel import _ACTIVATIONS

    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    assert torch.allclose(_ACTIVATIONS["quick_gelu"](x), x / (1 + torch.exp(-1.702 * x)), rtol=0, atol=1e-15)


def test_gradients_reach_the_biased_router_and_the_clamped_experts():
    module = _module("gpt-oss")
    x = torch.randn(9, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inputs: module(inputs), (x,), eps=1e-6, atol=1e-8)
    module(x).square().sum().backward()
    assert module.router.bias.grad.abs().sum() > 0 and any(e.up.bias.grad is not None for e in module.routed)


@pytest.mark.parametrize("fields", [{"gated": False, "glu_limit": 1.0}])
def test_a_clamped_glu_needs_a_glu(fields):
    from attnspec.errors import SpecError
    from attnspec.spec import load_spec

    with pytest.raises(SpecError, match="glu_limit"):
        load_spec({**SPEC, "layers": [{"mixer": "softmax",
                                       "mlp": {"kind": "moe", "experts": 2, "hidden": 4, **fields}}]})
    with pytest.raises(SpecError, match="glu_limit"):
        load_spec({**SPEC, "layers": [{"mixer": "softmax", "mlp": {"kind": "mlp", "glu_limit": 1.0}}]})


def test_gradients_reach_the_router_the_chosen_experts_and_the_shared_expert():
    module = _module("qwen")
    x = torch.randn(9, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inputs: module(inputs), (x,), eps=1e-6, atol=1e-8)
    module(x).square().sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_compiled_equals_eager_without_recompiles_across_lengths():
    from torch._dynamo.utils import counters

    module = _module("deepseek").float()
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    counters.clear()
    for length in (5, 9, 17):
        x = torch.randn(2, length, 8)
        assert torch.allclose(compiled(x), module(x), rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] <= 1


def test_the_load_balancing_loss_is_transformers_and_top_k_when_balanced():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    module = _module("qwen")
    x = torch.randn(11, 8, dtype=torch.float64)
    module(x)
    logits = module.router(x)
    theirs = load_balancing_loss_func((logits,), module.experts, module.top_k)
    # transformers takes the softmax in float32 (unit roundoff 6e-8); ours is float64 here
    assert module.aux_loss.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert int(module.expert_counts.sum()) == 11 * module.top_k
    with torch.no_grad():
        module.router.weight.zero_()  # every score 1/E: any choice gives E * sum_e f_e / E = top_k
    module(x)
    assert module.aux_loss.item() == pytest.approx(module.top_k)


SPEC = {
    "name": "moe", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 64,
    "layers": [{"repeat": 2, "layers": [{"mixer": {"kind": "linear", "heads": 2, "feature_map": "elu1"},
                                         "mlp": {"kind": "moe", "experts": 4, "top_k": 2, "hidden": 8, "shared": 1,
                                                 "shared_gate": True}}]}],
}


@pytest.mark.slow  # a build with its export: the full suite runs it, the quick loop not
def test_a_model_with_experts_counts_them_builds_exports_and_decodes(tmp_path):
    from attnspec.compiler.build import build_directory
    from attnspec.compiler.sizes import count_parameters
    from attnspec.spec import load_spec

    spec = load_spec(SPEC)
    d, E, I = 16, 4, 8
    per_block = E * d + E * 2 * I * d + E * d * I + 3 * d * I + d  # router, experts, shared GLU (width 8), gate
    dense = load_spec(SPEC, ["blocks[*].mlp=none"])
    assert count_parameters(spec) - count_parameters(dense) == 2 * (per_block + 2 * d)  # + the second LayerNorm
    from attnspec.compiler.sizes import layer_sizes

    sizes = layer_sizes(spec)  # a token uses the router, 2 of the 4 experts, the shared expert and its gate
    assert all(size.parameters - size.active_parameters == 2 * 3 * d * I for size in sizes)
    result = build_directory(SPEC, tmp_path / "build", compile_check=False, calibrate=False)
    program = load_program(tmp_path / "build" / "model.pt2").module()
    model = attnspec.load(tmp_path / "build")
    tokens = torch.randint(0, 32, (2, 13))
    with torch.no_grad():
        assert torch.allclose(program(tokens), model(tokens), rtol=1e-5, atol=1e-5)
        generated = model.generate(tokens[:, :5], 6, temperature=0.0)
        logits = model(generated[:, :-1])
    assert torch.equal(logits[:, 4:].argmax(-1), generated[:, 5:])  # each greedy token is the full pass's
    assert result.manifest["verification"]["ok"]


@pytest.mark.slow  # two training runs: the full suite runs them, the quick loop not
def test_training_logs_the_load_balancing_loss_and_adds_it_when_asked(tmp_path):
    from attnspec.training.loop import train

    config = {"task": {"kind": "mqar", "seq_len": 32, "vocab_size": 32, "num_kv_pairs": 4}, "steps": 3,
              "batch_size": 4, "eval_every": 0, "seed": 0}
    runs = {weight: train(SPEC, {**config, "moe_aux_loss": weight}, output=None) for weight in (0.0, 10.0)}
    steps = {weight: [r for r in run.history if r.get("split") == "train"] for weight, run in runs.items()}
    for records in steps.values():  # logged at any weight: E sum_e f_e P_e is in (0, E] (sum_e P_e = 1, f_e <= 1)
        assert len(records) == 3 and all(0 < record["moe_aux_loss"] <= 4 for record in records)
    # the first step's task loss is the same (the same weights); the added loss changed the update after it
    assert steps[0.0][0]["loss"] == steps[10.0][0]["loss"] and steps[0.0][1]["loss"] != steps[10.0][1]["loss"]


def test_the_experts_diagnostic_reports_what_the_forward_routed(tmp_path):
    import json

    from attnspec.diagnostics.experts import run

    spec = tmp_path / "moe.yaml"
    spec.write_text(json.dumps(SPEC))  # JSON is YAML
    result = run(spec, tmp_path / "out", samples=3, length=16, seed=0, overrides=[])
    assert [row[0] for row in result.table.rows] == ["0", "1"]
    assert all(row[1] == f"{3 * 16 * 2:,}" for row in result.table.rows)  # every token fills top_k = 2 slots
    lines = (tmp_path / "out" / "experts.csv").read_text().splitlines()
    assert lines[0] == "block,expert,tokens,share" and len(lines) == 1 + 2 * 4
    assert (tmp_path / "out" / "experts.png").exists()
