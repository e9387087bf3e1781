"""The hostile suite of spec-field combinations, decoding held to the full pass.

Seeded: 1,000 random models of three attention blocks, each drawing the newest softmax fields together
(values from the keys, value norm, cross-layer key/value sharing in either direction, ALiBi, proportional or
interleaved RoPE, windows and chunks, QK-norms, soft-caps, sinks, output gates, q/k/v clips, a data-dependent
decay, differential attention, attention experts, query scaling with the position) with the block's placement
and output scale. Every combination is one of:

- refused by ``check``, at a field (a located error);
- built, computing a finite output, and decoding (a prefill of 5 tokens, then one step per token, float64)
  equal to the full pass within 1e-9 (rounding of float64 sums in another order).

A combination that passes ``check`` and then fails to build, computes a non-finite output, raises while
decoding (the audit's ALiBi reader) or decodes other logits than its full pass (silent-wrong) is a finding.
The counts are printed (``pytest -s``) and asserted.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

import attnspec
from attnspec.errors import SpecError
from attnspec.spec import load_spec

pytestmark = pytest.mark.slow  # 1,000 combinations, about 15 s

SEED = 20261129
COMBINATIONS = 1000
ATOL = 1e-9  # float64 logits; decoding sums the same terms in another order
CHOICES = {
    "heads": [1, 2, 4], "kv_heads": [None, None, 1, 2], "d_qk": [None, 4, 6, 8], "d_v": [None, 4, 5, 8],
    "position": ["none", "alibi", "rope", {"kind": "rope", "proportional": True, "rotary_fraction": 0.5},
                 {"kind": "rope", "interleaved": True}],
    "window": [None, None, 3, 5], "chunk": [None, None, 4], "qk_norm": ["none", "rmsnorm", "rmsnorm_full", "layernorm"],
    "qk_norm_after_rope": [False, True], "v_norm": [False, True], "values_from_keys": [False, False, True],
    "softcap": [None, 2.0], "sinks": [False, True], "output_gate": ["none", "sigmoid"], "scale": [None, 1.0],
    "qkv_clip": [None, 2.0], "transition": ["none", {"kind": "data", "phase": "none", "per": "head"}],
    "differential": [False, False, True], "query_experts": [None, None, {"experts": 2, "top_k": 1}],
    "query_scale_beta": [0.0, 0.0, 0.5], "gate_per_head": [False, True],
}
BLOCK_CHOICES = {"norm_placement": ["pre", "sandwich"], "output_scale": [False, True],
                 "mlp": ["none", {"kind": "glu", "hidden": 24}]}


def _combination(rng: random.Random) -> dict:
    """Three blocks of attention, each drawing every field with probability 0.3 (the rarer pairings, differential
    attention and attention experts, at 0.1), lending or reading keys and values; a reader mostly takes its
    lender's geometry (heads of keys and values, widths, window, chunk), which the rules require, so that
    most combinations reach decoding and the rest test the rules."""
    layers, lender = [], None
    for index in range(3):
        mixer = {"kind": "softmax"}
        for field, values in CHOICES.items():
            if rng.random() < (0.1 if field in ("differential", "query_experts") else 0.3):
                mixer[field] = rng.choice(values)
        if mixer.get("query_scale_beta"):
            mixer["query_scale_period"] = 4
        if mixer.get("gate_per_head") and mixer.get("output_gate", "none") == "none":
            mixer["output_gate"] = "sigmoid"
        if mixer.get("qk_norm_after_rope") and mixer.get("qk_norm", "none") == "none":
            mixer["qk_norm"] = "rmsnorm"
        sharing = rng.choice(["lends", "reads", "neither"]) if lender is not None else rng.choice(["lends", "neither"])
        if sharing == "lends":
            mixer["lends_kv"] = "a"
            lender = mixer
        elif sharing == "reads":
            mixer["kv_from"] = "a"
            if rng.random() < 0.8:
                for field in ("kv_heads", "d_qk", "d_v", "window", "chunk"):
                    mixer.pop(field, None)
                    if field in lender:
                        mixer[field] = lender[field]
                mixer["heads"] = lender.get("heads", 1) * rng.choice([1, 2]) if lender.get("kv_heads") else \
                    lender.get("heads", 1)
                if not lender.get("kv_heads") and mixer["heads"] != 1:
                    mixer["kv_heads"] = mixer["heads"]
        block = {"mixer": mixer, "norm": "rmsnorm"}
        for field, values in BLOCK_CHOICES.items():
            if rng.random() < 0.5:
                block[field] = rng.choice(values)
        layers.append(block)
    return {"name": "combination", "input": {"kind": "tokens", "vocab_size": 29}, "d_model": 16, "max_len": 16,
            "dtype": "float64", "layers": layers}


def test_field_combinations_are_refused_at_a_field_or_decode_as_their_full_pass(capsys):
    rng = random.Random(SEED)
    counts, findings = Counter(), []
    tokens = torch.randint(0, 29, (2, 11), generator=torch.Generator().manual_seed(0))
    for index in range(COMBINATIONS):
        spec = _combination(rng)
        counts["inputs"] += 1
        what = f"{index}: {spec['layers']}"
        try:
            resolved = load_spec(spec)
        except SpecError as error:
            counts["refused at a field" if all(p.path for p in error.problems) else "unlocated"] += 1
            if not all(p.path for p in error.problems):
                findings.append(f"unlocated: {what}: {error}")
            continue
        try:
            torch.manual_seed(index)
            model = attnspec.build(resolved).eval()
            with torch.no_grad():
                for parameter in model.parameters():  # gates, norms and sinks away from their initial values
                    parameter.add_(0.1 * torch.randn_like(parameter))
                full = model(tokens)
        except Exception as error:  # noqa: BLE001 - a spec that passed check must build and run
            counts["crash"] += 1
            findings.append(f"passes check, fails to run: {what}: {type(error).__name__}: {str(error)[:200]}")
            continue
        if not bool(torch.isfinite(full).all()):
            counts["non-finite"] += 1
            findings.append(f"non-finite output: {what}")
            continue
        try:
            with torch.no_grad():
                logits, *state = model.prefill(tokens[:, :5])
                decoded = [logits[:, -1]]
                for position in range(5, tokens.shape[1]):
                    logits, *state = model.step(tokens[:, position], *state)
                    decoded.append(logits)
        except Exception as error:  # noqa: BLE001 - exactly what the suite looks for
            counts["crash"] += 1
            findings.append(f"decoding raises: {what}: {type(error).__name__}: {str(error)[:200]}")
            continue
        error = float((torch.stack(decoded, 1) - full[:, 4:]).abs().max())
        if error > ATOL:
            counts["silent-wrong"] += 1
            findings.append(f"decodes other logits than the full pass (by {error:.2e}): {what}")
            continue
        counts["decodes as the full pass"] += 1
    with capsys.disabled():
        print("\nhostile field combinations:", dict(sorted(counts.items())))
    assert not findings, f"{len(findings)} findings:\n" + "\n".join(findings[:20])
    assert counts["decodes as the full pass"] > COMBINATIONS // 10 and counts["refused at a field"] > COMBINATIONS // 4
