"""Builds beside the shipped specs' (tests/compiler/test_build.py): the compiled modes across lengths
without recompiling, one AOTInductor build with its three packages, and the released models' parts
through a build. A file of its own so that a second test worker takes it while the first builds
every shipped spec."""

from __future__ import annotations

import pytest
import torch

import attnspec
from attnspec.compiler.archive import load_program
from attnspec.compiler.build import build_directory
from attnspec.compiler.compile import check_compiled
from attnspec.compiler.tracing import example_input
from tests.conftest import SPECS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name, mode", [("retnet", "chunk"), ("lru", "chunk"), ("gateloop", "scan"),
                                        ("linear-elu", "quadratic")])
def test_compiled_equals_eager_without_recompiling_at_new_lengths(name, mode):
    """``torch.compile(dynamic=True)`` of each mode's code path (per-head and per-channel complex
    decays in chunk mode, the scan, the quadratic form) across lengths, with recompiles forbidden.
    Builds check fixed shapes only (``check_model``); this is where the dynamic property is held."""
    model = attnspec.build(SPECS[0].parent / f"{name}.yaml", "d_model=32", "layers[0].repeat=1",
                           *(["layers[0].layers[0].mixer.heads=2"] if name == "gateloop" else []))
    model.set_modes([mode])
    inputs = [example_input(model, 2, n) for n in (100, 37, 300, 1000, 63)]
    report = check_compiled(model, inputs, atol=1e-4, rtol=1e-4)  # raises on any recompile
    assert report["lengths"] == [100, 37, 300, 1000, 63] and report["graphs"] == 1


def test_aot_packages_match_eager_at_unseen_lengths_and_the_step_holds_key_value_caches(tmp_path):
    """One AOTInductor build (three packages, the costliest compile of the suite): the full-sequence package
    equals eager at lengths it was not traced at, the step package carries a ring buffer and a full
    cache through the compiled code (updated in place, read up to the written slots), and the prefill
    package writes the state the steps continue from into a state of a generation's capacity (40, not
    max_len 64), past which the step package raises; with both, a left-padded batch of two prompt lengths
    generates eager's greedy and sampled tokens."""
    spec = {"name": "swa", "input": {"kind": "tokens", "vocab_size": 40}, "d_model": 16, "max_len": 64,
            "layers": [{"mixer": {"kind": "linear", "heads": 2, "transition": "data"}},
                       {"mixer": {"kind": "softmax", "heads": 4, "kv_heads": 2, "window": 5, "qk_norm": "rmsnorm",
                                  "position": {"kind": "rope", "rotary_fraction": 0.5}}},
                       {"mixer": {"kind": "softmax", "heads": 2}}]}
    result = build_directory(spec, tmp_path / "aot", aot=True, compile_check=False)
    assert {"model.aoti.pt2", "step.aoti.pt2", "prefill.aoti.pt2"} <= set(result.manifest["files"])
    model = attnspec.load(result.directory)
    runner = torch._inductor.aoti_load_package(str(result.directory / "model.aoti.pt2"))
    for length in (23, 61):
        inputs = example_input(model, 2, length)
        with torch.no_grad():
            assert torch.allclose(runner(inputs), model(inputs), atol=1e-4, rtol=1e-4), length
    step = torch._inductor.aoti_load_package(str(result.directory / "step.aoti.pt2"))
    tokens = torch.randint(0, 40, (2, 30), generator=torch.Generator().manual_seed(0))
    state, compiled = model.init_state(2), model.init_state(2)
    with torch.no_grad():
        for t in range(30):  # past the window: the ring buffer wraps inside the compiled package
            logits, *state = model.step(tokens[:, t], *state)
            # contiguous: a package reads inputs with its traced strides and does not check them
            # (measured: tokens[:, t] of a (2, 30) tensor gave logits off by 1.6)
            got, *compiled = step(tokens[:, t].contiguous(), *compiled)
            assert torch.allclose(got, logits, atol=1e-4, rtol=1e-4), t
    prefill = torch._inductor.aoti_load_package(str(result.directory / "prefill.aoti.pt2"))
    with torch.no_grad():  # a 20-token prompt in one pass, then steps to the capacity of 40 positions
        logits, *state = model.prefill(tokens[:, :20], last_only=True, capacity=40)
        compiled = model.init_state(2, 40)
        got, *written = prefill(tokens[:, :20].contiguous(), *compiled)
        assert torch.allclose(got, logits, atol=1e-4, rtol=1e-4)
        assert all(a.data_ptr() == b.data_ptr() for a, b in zip(written, compiled))  # written in place
        for t in range(20, 40):
            token = tokens[:, t % 30].contiguous()
            logits, *state = model.step(token, *state)
            got, *compiled = step(token, *compiled)
            assert torch.allclose(got, logits, atol=1e-4, rtol=1e-4), t
        with pytest.raises(RuntimeError):  # position 40 of a state holding 40: inside the package, on its data
            step(token, *compiled)
    from attnspec.nn.generate import decode

    mixed, mask = tokens[:, :12].clone(), torch.ones(2, 12, dtype=torch.int64)
    mask[1, :9] = 0  # prompts of 12 and 3 tokens, left-padded: each length prefilled by the package alone
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 10, "seed": 5}):
        eager = model.generate(mixed, 10, attention_mask=mask, **sampling)
        exported = decode(step, list(model.init_state(2, 22)), mixed, 10, attention_mask=mask, **sampling,
                          prefill=lambda prompt: prefill(prompt, *model.init_state(prompt.shape[0], 22)))
        assert torch.equal(exported, eager), sampling


FAMILIES = {
    "name": "families", "input": {"kind": "tokens", "vocab_size": 64}, "d_model": 32, "max_len": 128,
    "layers": [
        {"mixer": {"kind": "mla", "heads": 2, "d_qk": 12, "d_v": 8, "kv_rank": 8, "q_rank": 6, "rope_dim": 4,
                   "position": {"kind": "rope", "interleaved": True},
                   "indexer": {"heads": 4, "d_head": 8, "topk": 5}},
         "mlp": {"kind": "glu", "hidden": 48}, "norm": "rmsnorm", "norm_placement": "sandwich"},
        {"mixer": {"kind": "rglru", "heads": 2, "width": 24, "qkv_bias": True, "out_bias": True}, "mlp": "none",
         "norm": "rmsnorm"},
        {"mixer": "none", "norm": "rmsnorm",
         "mlp": {"kind": "moe", "experts": 4, "hidden": 12, "scoring": "sigmoid", "score_bias": True, "groups": 2,
                 "top_groups": 1, "shared": 1}},
        {"mixer": {"kind": "gated_conv", "d_v": 24}, "mlp": "mlp", "norm": "rmsnorm", "norm_placement": "output"},
        {"mixer": {"kind": "mamba", "d_qk": 4, "selection_norm": "rmsnorm"}, "mlp": "none", "norm": "rmsnorm"},
        {"mixer": {"kind": "softmax", "heads": 2, "qk_norm": "rmsnorm_full", "kv_heads": 1}, "mlp": "none",
         "norm": "rmsnorm"},
        {"mixer": {"kind": "delta", "heads": 2, "group_norm": True, "output_gate": "sigmoid", "gate_rank": 3,
                   "transition": {"kind": "mamba", "per": "channel", "rank": 4, "shared_a": True}},
         "mlp": "none", "norm": "rmsnorm"},
        {"mixer": {"kind": "linear", "heads": 2, "feature_map": "silu", "value_activation": "silu",
                   "normalize": False, "transition": {"kind": "fixed", "init": "alibi", "learnable": False},
                   "group_norm": True, "norm_span": "full", "output_gate": "sigmoid"},
         "mlp": "none", "norm": "rmsnorm", "norm_placement": "normed_residual", "skip_scale": 0.5,
         "residual_scale": 1.5},
        {"mixer": {"kind": "mlstm", "heads": 2, "d_qk": 8, "d_v": 12}, "mlp": "none", "norm": "rmsnorm"},
        {"mixer": {"kind": "parallel", "weights": [0.5, 1.5], "branches": [
            {"kind": "linear", "heads": 4, "d_qk": 4, "d_v": 8, "qk_groups": 2, "feature_map": "identity",
             "normalize": False, "transition": {"kind": "mamba", "scale_input": True}, "skip": True,
             "group_norm": True, "norm_span": "group", "output_gate": "swish"},
            {"kind": "softmax", "heads": 2, "window": 8, "softcap": 2.0,
             "position": {"kind": "rope", "scaling": "dynamic", "factor": 2.0, "original_max_len": 16}}]},
         "mlp": "none", "norm": "rmsnorm"},
        {"mixer": {"kind": "softmax", "heads": 2, "kv_heads": 1, "chunk": 4, "qk_norm": "rmsnorm_unweighted",
                   "qk_norm_after_rope": True, "qkv_clip": 2.0, "output_gate": "softplus", "gate_per_head": True,
                   "position": {"kind": "rope", "interleaved": True, "reverse": True}},
         "mlp": {"kind": "moe", "experts": 4, "hidden": 12, "activation": "quick_gelu", "router_bias": True,
                 "expert_bias": True, "glu_limit": 1.0, "router_softcap": 2.0, "scoring": "sigmoid", "score_bias": True,
                 "score_bias_on_logits": True},
         "norm": {"kind": "rmsnorm", "affine": False}},
        {"mixer": {"kind": "softmax", "heads": 2, "qk_norm": "layernorm", "position": {"kind": "none"},
                   "query_scale_beta": 0.5, "query_scale_period": 3, "query_scale_offset": 1},
         "mlp": {"kind": "moe", "experts": 3, "top_k": 1, "hidden": 8, "scoring": "sigmoid", "normalize": False,
                 "weight_inputs": True, "shared": 1}, "norm": "rmsnorm"},
        {"mixer": {"kind": "softmax", "heads": 2, "qk_norm": "rmsnorm", "qk_norm_after_rope": True,
                   "differential": True, "position": {"kind": "rope"}},
         "mlp": {"kind": "mlp", "hidden": 24, "activation": "xielu", "inner_norm": "rmsnorm"}, "norm": "rmsnorm"},
        {"mixer": {"kind": "softmax", "heads": 2, "kv_heads": 1, "out_bias": True, "position": {"kind": "rope"},
                   "query_experts": {"experts": 3, "top_k": 2}},
         "mlp": {"kind": "moe", "experts": 3, "zero_experts": 1, "hidden": 8, "output_bias": True}, "norm": "rmsnorm"},
        {"mixer": {"kind": "softmax", "heads": 2, "d_qk": 8, "d_v": 8, "qk_norm": "rmsnorm", "v_norm": True,
                   "values_from_keys": True, "scale": 1.0, "lends_kv": "global",
                   "position": {"kind": "rope", "proportional": True, "rotary_fraction": 0.5}},
         "mlp": {"kind": "glu", "hidden": 24}, "norm": "rmsnorm", "norm_placement": "sandwich", "output_scale": True},
        {"mixer": {"kind": "softmax", "heads": 4, "kv_heads": 2, "d_qk": 8, "d_v": 8, "qk_norm": "rmsnorm",
                   "scale": 1.0, "kv_from": "global",
                   "position": {"kind": "rope", "proportional": True, "rotary_fraction": 0.5}},
         "mlp": {"kind": "glu", "hidden": 48}, "norm": "rmsnorm", "norm_placement": "sandwich", "output_scale": True},
        {"mixer": {"kind": "rwkv", "width": 12, "chunk_size": 8}, "mlp": "none", "norm": "layernorm"},
        {"mixer": {"kind": "rwkv_channel", "hidden": 20}, "mlp": "none", "norm": "layernorm", "skip_scale": 0.5,
         "residual_scale": 0.5}],
    "final_norm": "rmsnorm", "head": {"kind": "lm", "tied": True, "bias": True}}
"""Every part the released models brought, in one spec: latent attention with DeepSeek's sparse attention, the
RG-LRU, a block without a mixer holding grouped experts, the gated convolution, Mamba-1, QK-norm over the whole
width, KDA's shared A and low-rank gate, MiniMax's lightning attention, xLSTM's mLSTM, Falcon-H1's parallel branches (Mamba2
with a norm per group beside windowed attention with dynamic NTK RoPE), sandwich, output and normed-residual
placements; and the parts the zoo's later types brought: chunked attention (Llama 4) with a weightless QK-norm after a
reversed RoPE (nanochat), clamped q/k/v (DBRX), a softplus gate per head (Laguna), gpt-oss's and Kolibri's routers
and clamped experts under a weightless norm, Persimmon's LayerNorm QK-norm on a layer without positions whose queries
grow with the position (Llama 4), experts reading weighted inputs, Hunyuan's QK-norm after RoPE in differential
attention (DiffLlama), Apertus's xIELU under BitNet's norm of the hidden, JetMoE's attention experts and biased
experts (with a LongCat zero-computation expert), Gemma 4's cross-layer key/value sharing (a global layer whose values
are its keys' projection, normalised, with proportional RoPE, read by a later layer) with its output scales, RWKV-4's
time and channel mixing (with its halving), CTRL's biased tied head."""


@pytest.mark.slow  # one build with its compile check and exports (about a minute on 2 cores)
def test_the_released_models_parts_compile_export_and_decode_from_the_step_program(tmp_path):
    """Compiled (fullgraph, across lengths) equals eager, the resolved spec reloads, model.pt2 computes the
    model, and step.pt2 (a dynamic batch) generates what the rebuilt model generates."""
    from attnspec.compiler.runner import run_directory

    result = build_directory(FAMILIES, tmp_path / "families")
    assert result.manifest["has_step"] and result.manifest["compile"]["max_abs_diff"] < 1e-4
    program = load_program(result.directory / "model.pt2").module()
    model = attnspec.load(result.directory)
    tokens = torch.randint(0, 64, (3, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(program(tokens), model(tokens), atol=1e-4, rtol=1e-4)
    eager = run_directory(result.directory, "3 1 4 1 5", 6)
    assert eager == run_directory(result.directory, "3 1 4 1 5", 6, programs=True)


def test_attnspec_export_writes_the_programs_a_directory_lacks(tmp_path):
    """An import writes no programs; ``attnspec export DIR --programs ...`` adds them from the directory's
    checked spec and exact weights (in place, or into -o), and they decode as the eager model does. A
    directory whose files do not match its manifest is refused (exit 2) and left as it was."""
    import shutil
    import subprocess
    import sys

    from attnspec.compiler.manifest import sha256
    from attnspec.compiler.runner import run_directory

    plain = build_directory(SPECS[0].parent / "softmax-transformer.yaml", tmp_path / "plain", compile_check=False,
                            programs=(), overrides=["d_model=16", "layers[0].repeat=1", "max_len=64"])
    assert not list(plain.directory.glob("*.pt2"))
    weights = sha256(plain.directory / "model.safetensors")
    shutil.copytree(plain.directory, tmp_path / "kept")

    def export(*args):
        return subprocess.run([sys.executable, "-c", "from attnspec.cli import main; main()", "export", *args,
                               "--no-compile"], capture_output=True, text=True, timeout=600)

    done = export(str(plain.directory))  # every program, by default
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in plain.directory.glob("*.pt2")) == ["model.pt2", "prefill.pt2", "step.pt2"]
    assert sha256(plain.directory / "model.safetensors") == weights  # the same weights, once
    eager = run_directory(plain.directory, "3 1 4 1 5", 6)
    assert run_directory(plain.directory, "3 1 4 1 5", 6, programs=True) == eager

    done = export(str(tmp_path / "kept"), "-o", str(tmp_path / "with-model"), "--programs", "model")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "with-model").glob("*.pt2")] == ["model.pt2"]
    assert not list((tmp_path / "kept").glob("*.pt2"))  # -o leaves the source alone

    with open(tmp_path / "kept" / "model.safetensors", "r+b") as handle:  # tampered: refused, untouched
        handle.seek(200)
        handle.write(b"\x00\x01\x02")
    before = {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}
    done = export(str(tmp_path / "kept"), "--programs", "step")
    assert done.returncode == 2 and "sha256" in done.stderr and "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()} == before
