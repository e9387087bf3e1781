"""Planning, lowering and the parameter count (no compilation: fast)."""

from __future__ import annotations

import pytest
import torch

from attnspec.compiler import build_model, count_parameters, plan_spec
from attnspec.compiler.lower import as_spec
from attnspec.compiler.calibration import Calibration
from attnspec.errors import BuildError
from attnspec.spec import load_spec, loads_spec
from tests.compiler.conftest import small_overrides
from attnspec.spec.walk import iter_blocks
from tests.conftest import SPECS


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_parameter_count_matches_the_spec(path):
    for overrides in ([], small_overrides(path)):
        model = build_model(path, *overrides)
        spec = as_spec(path, overrides)
        assert sum(p.numel() for p in model.parameters()) == count_parameters(spec) == formula_parameters(spec)


def test_parameter_count_of_trainable_kernels_and_gates():
    base = 'name = "t"\ninput = tokens(vocab_size=10)\nd_model = 32\nmax_len = 64\n'
    for mixer in ["linear(heads=2, feature_map=aoglu(rank=3, stack=3, share_across_heads=false))",
                  "linear(heads=2, feature_map=glu(stack=2), output_gate=sigmoid, group_norm=true)",
                  "linear(heads=2, feature_map=identity, normalize=false, transition=data(per=channel))",
                  "linear(heads=2, feature_map=identity, normalize=false, transition=fixed(complex=true, per=channel))",
                  "scatterbrain(lowrank(linear(feature_map=oglu)) + sparse(local(window=4)), heads=2)",
                  "softmax(heads=4, transition=data(phase=none, per=head))",
                  "softmax(heads=4, kv_heads=2, qkv_bias=true, out_bias=true, output_gate=sigmoid)",
                  "delta(heads=2, group_norm=true, shared_norm_weight=true, output_gate=swish)"]:
        for mlp in ("glu", "glu(hidden=40, bias=false)"):
            spec = loads_spec(base + f"layers {{ block {{ mixer = {mixer} mlp = {mlp} }} }}\nhead = lm(tied=true)",
                              "attn")
            model = build_model(spec)
            assert sum(p.numel() for p in model.parameters()) == count_parameters(spec) == formula_parameters(spec), \
                (mixer, mlp)


@pytest.mark.parametrize("block", [
    {"mixer": {"kind": "mamba", "d_qk": 6, "selection_norm": "rmsnorm", "qkv_bias": True}, "mlp": "none"},
    {"mixer": {"kind": "gated_conv", "qkv_bias": True, "conv": {"kind": "short", "projections": ["v"], "bias": True}}},
    {"mixer": {"kind": "gated_conv", "d_v": 24}},
    {"mixer": {"kind": "mla", "heads": 2, "d_qk": 12, "d_v": 6, "kv_rank": 8, "q_rank": 10, "rope_dim": 4,
               "position": "rope", "qkv_bias": True}, "norm_placement": "sandwich"},
    {"mixer": "none", "mlp": {"kind": "moe", "experts": 4, "hidden": 6, "shared": 2, "shared_gate": True}},
    {"mixer": {"kind": "rglru", "heads": 2, "width": 12, "qkv_bias": True}},
    {"mixer": {"kind": "parallel", "branches": [{"kind": "linear", "heads": 2, "qk_groups": 1, "group_norm": True,
                                                  "norm_span": "group", "skip": True},
                                                 {"kind": "softmax", "heads": 2, "out_bias": True}]}},
    {"mixer": {"kind": "mlstm", "heads": 2, "d_qk": 4, "d_v": 6, "qkv_bias": True,
               "conv": {"kind": "short", "projections": ["q", "k"]}}},
    {"mixer": {"kind": "linear", "heads": 2, "feature_map": "silu", "value_activation": "silu", "normalize": False,
               "transition": {"kind": "fixed", "init": "alibi", "learnable": False}, "group_norm": True,
               "norm_span": "full", "output_gate": "sigmoid"}, "norm_placement": "normed_residual"},
    {"mixer": {"kind": "delta", "heads": 2, "transition": {"kind": "mamba", "per": "channel", "rank": 4,
                                                           "shared_a": True},
               "group_norm": True, "output_gate": "sigmoid", "gate_rank": 3}},
    {"mixer": {"kind": "softmax", "heads": 2},
     "mlp": {"kind": "moe", "experts": 4, "hidden": 6, "gated": False, "shared": 1, "shared_hidden": 5}},
])
def test_parameter_count_of_the_released_models_parts(block):
    """Mamba-1, the gated convolution, latent attention, blocks without a mixer, experts (counted whole),
    KDA's shared A and low-rank output gate."""
    spec = load_spec({"name": "t", "input": {"kind": "tokens", "vocab_size": 10}, "d_model": 16, "max_len": 32,
                      "layers": [block]})
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(spec) == formula_parameters(spec)


def test_rebuilding_gives_the_same_function():
    a, b = build_model(SPECS[0].parent / "scatterbrain.yaml"), build_model(SPECS[0].parent / "scatterbrain.yaml")
    tokens = torch.randint(0, 512, (2, 50))
    with torch.no_grad():
        assert torch.equal(a(tokens), b(tokens))


def test_auto_plan_prefers_chunk_for_long_sequences_and_respects_forced_modes():
    """The cost model alone (no calibration)."""
    spec = as_spec(SPECS[0].parent / "linear-elu.yaml")
    assert plan_spec(spec, 8192, calibration=Calibration.empty()).full_modes == ["chunk"] * 4
    forced = as_spec(SPECS[0].parent / "linear-elu.yaml", ["layers[0].layers[0].mixer.mode=quadratic"])
    plan = plan_spec(forced, 8192, calibration=Calibration.empty())
    assert plan.full_modes == ["quadratic"] * 4 and "forced" in plan.layers[0].reason
    assert all(layer.decode_mode == "recurrent" for layer in plan.layers)


def test_plan_chooses_scan_for_tiny_states_and_quadratic_for_softmax():
    plan = plan_spec(as_spec(SPECS[0].parent / "gateloop.yaml"), 1024, calibration=Calibration.empty())
    assert plan.full_modes[0] == "scan"  # d_qk = d_v = 1: scan's per-position states are tiny
    hybrid = plan_spec(as_spec(SPECS[0].parent / "hybrid.yaml"), calibration=Calibration.empty())
    assert "quadratic" in hybrid.full_modes and hybrid.has_decode  # softmax blocks decode through their cache
    assert {layer.decode_mode for layer in hybrid.layers} == {"recurrent", "cache"}


def test_forced_recurrent_is_rejected_for_builds_with_the_reason():
    spec = as_spec(SPECS[0].parent / "gateloop.yaml", ["layers[0].layers[0].mixer.mode=recurrent"])
    plan_spec(spec)  # fine for planning and explaining
    with pytest.raises(BuildError, match="cannot be compiled or exported with a dynamic sequence length"):
        plan_spec(spec, for_build=True)


def test_verify_reports_every_mode_of_each_distinct_block_once(tmp_path):
    from attnspec.compiler.verify import distinct_blocks, verify_model

    model = build_model(SPECS[0].parent / "cosformer.yaml", "d_model=32")
    report = verify_model(model)
    assert distinct_blocks(model) == {0: [0, 1, 2, 3]}  # four blocks of one structure: verified once
    assert report.ok and len(report.rows) == 3 and all(row.blocks == 4 for row in report.rows)
    assert report.to_json()["worst_rel_diff"] < 1e-12


def test_verify_catches_a_mode_that_differs_in_one_distinct_block(monkeypatch):
    """Per-block verification still sees a wrong mode: one mode of a mixer family made wrong by 1e-3."""
    from attnspec.compiler.verify import verify_model

    model = build_model(SPECS[0].parent / "hybrid.yaml", "d_model=32")
    report = verify_model(model)
    assert report.ok and report.rows and all(row.blocks > 1 for row in report.rows)  # its linear blocks, once
    row = report.rows[0]
    family = type(model.blocks[int(row.layer[7:-1])].mixer)
    original = family.forward

    def wrong(self, x, mode=None, **kwargs):
        out = original(self, x, mode, **kwargs)
        return out * 1.001 if (mode or self.mode) == row.mode else out

    monkeypatch.setattr(family, "forward", wrong)
    failed = [r for r in verify_model(model).rows if not r.ok]
    assert failed and failed[0].layer == row.layer and failed[0].mode == row.mode


def formula_parameters(spec) -> int:
    """The parameter count of ``spec`` by hand, from the papers' shapes: an oracle for count_parameters."""
    d = spec.d_model
    total = spec.input.vocab_size * d if spec.input.kind == "tokens" else spec.input.dim * d + d
    norm = {"layernorm": 2 * d, "rmsnorm": d, "none": 0}
    for _, block in iter_blocks(spec, expand=True):
        norms = 2 if block.norm_placement == "sandwich" else 1  # a norm before (and after) each sub-layer
        if block.mixer.kind != "none":
            total += _mixer_parameters(block.mixer, d) + norms * norm[block.norm.kind]
        if block.mlp.kind == "moe":  # router, E routed experts, the shared ones, their gate (and a bias buffer)
            moe, factor = block.mlp, 3 if block.mlp.gated else 2
            total += moe.experts * d + moe.experts * factor * d * moe.hidden
            total += factor * d * (moe.shared_hidden or moe.shared * moe.hidden) if moe.shared else 0
            total += d if moe.shared_gate else 0
        elif block.mlp.kind != "none":
            hidden, bias = block.mlp.hidden or block.mlp.expansion * d, block.mlp.bias
            total += (d * hidden + hidden * bias) * (2 if block.mlp.kind == "glu" else 1) + hidden * d + d * bias
        if block.mlp.kind != "none":
            total += norms * norm[block.norm.kind]
    total += norm[spec.final_norm.kind]
    if spec.head.kind == "lm" and not spec.head.tied:
        total += spec.input.vocab_size * d
    elif spec.head.kind == "classifier":
        total += d * spec.head.classes + spec.head.classes
    return total


def _mixer_parameters(mixer, d: int) -> int:
    if mixer.kind == "parallel":  # the branches, each a whole mixer
        return sum(_mixer_parameters(branch, d) for branch in mixer.branches)
    if mixer.kind == "mamba":  # Mamba-1: in_proj (x, z), x_proj (Δ's rank, B, C), dt_proj, A_log, D, out_proj, conv
        D, N, R = mixer.d_inner, mixer.d_qk, mixer.dt_rank
        total = d * 2 * D + D * (R + 2 * N) + R * D + D + D * N + D + D * d
        total += 2 * D * mixer.qkv_bias + d * mixer.out_bias
        total += D * (mixer.conv.width + mixer.conv.bias) if mixer.conv.kind == "short" else 0
        return total + (R + 2 * N if mixer.selection_norm == "rmsnorm" else 0)
    if mixer.kind == "rglru":  # W_y, W_x, the gates' blocks and biases, Λ, W_out, the convolution
        W, H = mixer.width, mixer.heads
        total = 2 * (d * W + W * mixer.qkv_bias) + 2 * (W * W // H + W) + W + W * d + d * mixer.out_bias
        return total + (W * (mixer.conv.width + mixer.conv.bias) if mixer.conv.kind == "short" else 0)
    if mixer.kind == "gated_conv":  # in_proj (b, c, x), out_proj, the depthwise filter, on d_v channels
        c = mixer.d_v
        total = 3 * d * c + c * d + 3 * c * mixer.qkv_bias + d * mixer.out_bias
        return total + c * (mixer.conv.width + mixer.conv.bias)
    if mixer.kind == "mla":  # W_Q (or W_DQ, its norm, W_UQ), W_DKV + W_KR, the latent's norm, W_UK + W_UV, out
        H, r, dr = mixer.heads, mixer.kv_rank, mixer.rope_dim
        q = d * H * mixer.d_qk if mixer.q_rank is None else (
            d * mixer.q_rank + mixer.q_rank * mixer.qkv_bias + mixer.q_rank + mixer.q_rank * H * mixer.d_qk)
        kv = d * (r + dr) + (r + dr) * mixer.qkv_bias + r + r * H * (mixer.d_qk - dr + mixer.d_v)
        return q + kv + H * mixer.d_v * d + d * mixer.out_bias
    H, dk, dv = mixer.heads, mixer.d_qk, mixer.d_v
    Gq = mixer.qk_groups or H  # heads of distinct queries, keys and values
    Gk = mixer.qk_groups or mixer.kv_heads or H
    Gv = mixer.kv_heads or H
    total = d * (Gq + Gk) * dk + d * Gv * dv + H * dv * d  # q, k, v and output projections
    total += 2 * dk if mixer.qk_norm != "none" else 0
    total += ((Gq + Gk) * dk + Gv * dv) * mixer.qkv_bias + d * mixer.out_bias
    if mixer.output_gate != "none":  # the gate (W_b W_a with gate_rank); its bias goes with q/k/v's
        rank = mixer.gate_rank
        total += (d + mixer.qkv_bias) * H * dv if rank is None else d * rank + (rank + mixer.qkv_bias) * H * dv
    total += (dv if mixer.shared_norm_weight else H * dv) if mixer.group_norm else 0
    total += H if mixer.skip else 0  # D
    transition = getattr(mixer, "transition", None)
    if transition is not None and transition.kind != "none":
        width = H * (dk if transition.per == "channel" else 1)
        if transition.kind == "fixed":  # nu (and theta), unless kept as buffers
            total += width * (2 if transition.complex else 1) * transition.learnable
        elif transition.kind == "mamba":  # W_Δ (full or low rank), A_log (one per head with shared_a), dt_bias
            total += (d * width if transition.rank is None else transition.rank * (d + width)) + width
            total += H if transition.shared_a else width
        else:
            total += (d * width + width) * (2 if transition.phase != "none" else 1)
    fmap = mixer.feature_map if mixer.kind == "linear" else (
        mixer.lowrank.feature_map if mixer.kind == "scatterbrain" and mixer.lowrank.kind == "linear" else None)
    if fmap is not None and fmap.kind in ("softplus_linear", "glu", "oglu", "aoglu"):
        groups = 1 if fmap.share_across_heads else H
        if fmap.kind == "aoglu":  # W_f plus the low-rank gate U V
            per_unit = dk * dk + 2 * dk * (fmap.rank or max(1, dk // 4))
        else:  # W (softplus_linear) or W_f and W_g (glu, oglu)
            per_unit = dk * dk * (1 if fmap.kind == "softplus_linear" else 2)
        total += groups * fmap.stack * per_unit
    if mixer.conv.kind == "short":  # a depthwise filter of `width` taps per channel of each convolved stream
        channels = {"x": d, "q": Gq * dk, "k": Gk * dk, "v": Gv * dv}
        total += sum(channels[name] for name in mixer.conv.projections) * (mixer.conv.width + mixer.conv.bias)
    if mixer.kind == "delta":  # W_beta
        total += d * H
    if mixer.kind == "mlstm":  # the input and forget gates, a weight row and a bias per head each
        total += 2 * (d * H + H)
    return total
