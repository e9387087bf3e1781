"""Every causal token spec decodes: the step (recurrent states, key/value caches, cached inputs) equals the
full forward pass at every position, greedy generation equals the argmax of the full pass recomputed on
the growing prefix, and `model.generate` samples reproducibly.

All in float64 at small widths: logits within 1e-10 (the paths differ in summation order only:
measured ~1e-14). The attention parts (GQA, QK-norm, partial RoPE, the output gate, windows with
decays and ALiBi) are also checked inside models here; the op itself in tests/ops/test_softmax_cache.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor

import attnspec
from attnspec.errors import ShapeError
from tests.compiler.conftest import small_overrides
from tests.conftest import SPECS

def _small(path) -> list[str]:
    """The compiler tests' small widths, at max_len 64 and in float64."""
    return small_overrides(path) + ["max_len=64", "dtype=float64"]


SPECS_BY_NAME = {path.stem: path for path in SPECS}
CAUSAL_LMS = [path for path in SPECS if attnspec.build(path, *_small(path)).has_step]


def _step_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    state = model.init_state(tokens.shape[0])
    out = []
    for t in range(tokens.shape[1]):
        logits, *state = model.step(tokens[:, t], *state)
        out.append(logits)
    return torch.stack(out, 1)


def test_every_shipped_causal_token_spec_decodes():
    names = {path.stem for path in CAUSAL_LMS}
    assert {"hybrid", "softmax-transformer", "scatterbrain", "gated-deltanet", "mamba2", "qwen3-next-style",
            "sliding-window-hybrid"} <= names
    assert not names & {"ffn-glu", "rank-collapse-san"}  # non-causal or not a token LM


@pytest.mark.parametrize("path", CAUSAL_LMS, ids=lambda p: p.stem)
def test_the_step_equals_the_full_pass_and_greedy_equals_the_growing_prefix(path):
    torch.manual_seed(0)
    model = attnspec.build(path, *_small(path))
    vocab = model.spec.input.vocab_size
    tokens = torch.randint(0, vocab, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        assert (_step_logits(model, tokens) - full).abs().max() < 1e-10
        generated = model.generate(tokens[:, :5], 8, temperature=0)
        prefix = tokens[:, :5]
        for _ in range(8):  # the argmax of the full pass on the growing prefix
            prefix = torch.cat([prefix, model(prefix)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, prefix)


@pytest.mark.parametrize("path", CAUSAL_LMS, ids=lambda p: p.stem)
def test_prefill_runs_the_planned_modes_and_leaves_the_state_the_steps_would(path):
    torch.manual_seed(0)
    model = attnspec.build(path, *_small(path))
    tokens = torch.randint(0, model.spec.input.vocab_size, (2, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        logits, *prefilled = model.prefill(tokens[:, :17])
        assert (logits - full[:, :17]).abs().max() < 1e-10
        stepped = model.init_state(2)
        for t in range(17):
            _, *stepped = model.step(tokens[:, t], *stepped)
        for a, b in zip(prefilled, stepped):
            assert a.shape == b.shape and a.dtype == b.dtype and (a - b).abs().max() < 1e-10
        state = prefilled  # decoding continues from the prefilled state exactly
        for t in range(17, 25):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10


ATTENTION = {"name": "attention", "input": {"kind": "tokens", "vocab_size": 50}, "d_model": 32, "max_len": 48,
             "dtype": "float64", "layers": [{"mixer": {"kind": "softmax", "heads": 4}}]}


def _attention(**mixer):
    return {**ATTENTION, "layers": [{"mixer": {"kind": "softmax", "heads": 4, **mixer}},
                                    {"mixer": {"kind": "linear", "heads": 2, "transition": "data"}}]}


@pytest.mark.parametrize("mixer", [
    {"kv_heads": 1}, {"kv_heads": 2}, {"kv_heads": 4, "qk_norm": "rmsnorm"},
    {"position": {"kind": "rope", "rotary_fraction": 0.25, "base": 5000}, "kv_heads": 2, "qk_norm": "rmsnorm",
     "output_gate": "sigmoid"},
    {"window": 1}, {"window": 7, "position": "alibi"}, {"window": 100, "transition": {"kind": "data", "phase": "none",
                                                                                       "per": "head"}},
    {"window": 5, "conv": {"kind": "short", "width": 3}},
    {"sinks": True}, {"sinks": True, "window": 7, "kv_heads": 2, "softcap": 2.0},
])
def test_attention_parts_decode_exactly(mixer):
    torch.manual_seed(0)
    model = attnspec.build(_attention(**mixer))
    tokens = torch.randint(0, 50, (3, 29), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        assert (_step_logits(model, tokens) - full).abs().max() < 1e-10
        logits, *state = model.prefill(tokens[:, :20])  # a prompt longer than the smaller windows
        for t in range(20, 29):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10


def test_linear_mixers_share_keys_and_values_too():
    """kv_heads on the gated linear family: every mode, the step and prefill agree (multi-value attention)."""
    torch.manual_seed(0)
    model = attnspec.build({**ATTENTION, "layers": [{"mixer": {"kind": "linear", "heads": 4, "kv_heads": 2,
                                                               "qk_norm": "rmsnorm", "transition": "data"}}]})
    tokens = torch.randint(0, 50, (2, 23), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        outputs = [model(tokens, mode) for mode in model.blocks[0].mixer.modes]
        assert all((out - outputs[0]).abs().max() < 1e-10 for out in outputs)
        assert (_step_logits(model, tokens) - outputs[0]).abs().max() < 1e-10
    assert model.blocks[0].mixer.k_proj.weight.shape[0] == 2 * 8  # two key heads of d_qk 8


def test_a_window_decodes_past_max_len_in_constant_memory_and_a_full_cache_refuses():
    torch.manual_seed(0)
    windowed = attnspec.build({**_attention(window=8, position="rope"), "max_len": 16})
    state = windowed.init_state(1)
    sizes = [t.numel() for t in state]
    for t in range(40):  # 2.5x max_len
        _, *state = windowed.step(torch.tensor([t % 50]), *state)
    assert [t.numel() for t in state] == sizes and all(torch.isfinite(t).all() for t in state)
    full = attnspec.build({**_attention(), "max_len": 16})
    with pytest.raises(ShapeError, match="max_len = 16"):
        full.generate(torch.zeros(1, 10, dtype=torch.long), 7)
    state = full.init_state(1)
    for t in range(16):
        _, *state = full.step(torch.tensor([1]), *state)
    with pytest.raises(ShapeError, match="max_len = 16"):
        full.step(torch.tensor([1]), *state)


@pytest.mark.parametrize("sampling", [{"temperature": 1e-45}, {"temperature": 5e-324}, {"top_p": 1e-300},
                                      {"temperature": 1e-45, "top_p": 1e-300, "top_k": 3}])
def test_extreme_sampling_settings_are_greedy_not_a_crash(sampling):
    """A temperature of 1e-45 made inf - inf logits, top_p 1e-300 dropped every token: both crashed in
    multinomial. Both are the limit of sampling, which is greedy decoding."""
    torch.manual_seed(0)
    model = attnspec.build(_attention(kv_heads=2))
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(3))
    assert torch.equal(model.generate(prompt, 5, seed=1, **sampling), model.generate(prompt, 5, temperature=0))


def test_an_empty_batch_is_refused_by_name():
    model = attnspec.build(_attention())
    for prompt in (torch.zeros(0, 4, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long)):
        with pytest.raises(ShapeError, match="batch|length"):
            model.generate(prompt, 2)


def test_a_window_longer_than_max_len_decodes_past_max_len_exactly():
    """A window of 24 over max_len 16 decoded wrongly from position 16 (its ring held 16 slots): the
    ring now holds the whole window, and decoding past max_len equals the full pass of a longer model."""
    torch.manual_seed(0)
    spec = {**ATTENTION, "max_len": 16, "layers": [{"mixer": {"kind": "softmax", "heads": 4, "window": 24,
                                                              "position": "rope"}}]}
    model = attnspec.build(spec)
    longer = attnspec.build({**spec, "max_len": 64})
    longer.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = longer(tokens)
        logits, *state = model.prefill(tokens[:, :10])
        for t in range(10, 40):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10


def test_an_exported_step_past_its_decode_limit_raises(tmp_path):
    """step.pt2 driven past decode_limit wrapped its full cache into a silent sliding window; the
    limit is now a data-dependent assertion inside the program (run through torch.export.load)."""
    from attnspec.compiler.export import export_step

    model = attnspec.build({**ATTENTION, "max_len": 8, "dtype": "float32"}).eval()
    export_step(model, tmp_path / "step.pt2")
    step = torch.export.load(str(tmp_path / "step.pt2")).module()
    state = list(model.init_state(2))
    for t in range(8):
        _, *state = step(torch.tensor([1, 2]), *state)
    with pytest.raises(RuntimeError, match="decoding past max_len = 8"):
        step(torch.tensor([1, 2]), *state)
    with pytest.raises(ShapeError, match="decoding past max_len = 8"):  # the eager step says the same
        model.step(torch.tensor([1, 2]), *state)


def test_an_exported_step_derives_the_position_once_and_reads_exactly_the_written_slots(tmp_path):
    """Three RoPE attention layers (one a window): the exported step computes the rotary angles once, and
    the slots written once per cache capacity (ops.per_step), not per layer; it reads the written
    slots by an unbacked length, with no ``torch.cond`` per read length; and it equals the eager step
    (float64, 1e-12) for rows at different positions."""
    from collections import Counter

    from attnspec.compiler.export import export_step

    mixer = {"kind": "softmax", "heads": 4, "kv_heads": 2, "position": "rope"}
    spec = {**ATTENTION, "layers": [{"mixer": mixer}, {"mixer": {**mixer, "window": 5}}, {"mixer": mixer}]}
    torch.manual_seed(0)
    model = attnspec.build(spec).eval()
    program = export_step(model, tmp_path / "step.pt2")
    ops = Counter(str(node.target) for node in program.graph.nodes if node.op == "call_function")
    assert ops["aten.cos.default"] == ops["aten.sin.default"] == 1
    assert ops["aten.item.default"] == 4  # least and most, for the full caches and for the window
    assert ops["cond"] == 0
    step = program.module()
    with torch.no_grad():
        eager = list(model.init_state(2))
        for t in range(3):  # row 1 runs 3 positions ahead (steps on views of its rows)
            model.step(torch.tensor([t + 1]), *[s[1:] for s in eager])
        exported = [s.clone() for s in eager]
        for t in range(12):
            token = torch.tensor([t % 5 + 1, t % 3 + 2])
            expected, *eager = model.step(token, *eager)
            got, *exported = step(token, *exported)
            assert (got - expected).abs().max() < 1e-12, t


def test_exported_programs_take_a_state_of_any_capacity_and_refuse_past_it(tmp_path):
    """``prefill.pt2`` writes the prompt's state into the state it is given, in place, and ``step.pt2``
    continues from it, at a capacity of the caller's (12 and 48 = max_len; traced at 29): both equal eager
    prefill and steps at that capacity (float64, 1e-12). A step at the capacity and a prompt longer than
    it raise inside the programs, on the data. Eager ``prefill(into=...)`` refuses a state of the wrong
    rows, capacity or count by name."""
    from attnspec.compiler.export import export_prefill, export_step, state_signature

    mixer = {"kind": "softmax", "heads": 4, "kv_heads": 2, "position": "rope"}
    spec = {**ATTENTION, "layers": [{"mixer": mixer}, {"mixer": {**mixer, "window": 5}},
                                    {"mixer": {"kind": "linear", "heads": 2, "transition": "data"}}]}
    torch.manual_seed(0)
    model = attnspec.build(spec).eval()
    assert [entry.get("capacity_axis") for entry in state_signature(model)] == \
        [None, 1, 1, 1] + [None] * 5  # position; the full cache's keys, values, bias; the window's; linear
    prefill = export_prefill(model, tmp_path / "prefill.pt2").module()
    step = export_step(model, tmp_path / "step.pt2").module()
    tokens = torch.randint(0, model.spec.input.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for capacity in (12, 48):
            given = model.init_state(2, capacity)
            got, *state = prefill(tokens[:, :7], *given)
            expected, *eager = model.prefill(tokens[:, :7], last_only=True, capacity=capacity)
            assert all(a is b for a, b in zip(state, given))  # written in place
            assert (got - expected).abs().max() < 1e-12
            for t in range(7, 12):
                expected, *eager = model.step(tokens[:, t], *eager)
                got, *state = step(tokens[:, t], *state)
                assert (got - expected).abs().max() < 1e-12, (capacity, t)
        full = model.init_state(2, 12)
        full[0].fill_(12)  # every slot written
        with pytest.raises(RuntimeError, match="past the capacity"):
            step(tokens[:, 0], *full)
        with pytest.raises(RuntimeError, match="longer than the decoding state's capacity"):
            prefill(tokens, *model.init_state(2, 11))
        for into, words in ((model.init_state(1, 12), "state tensor 0 to write into is torch.int64 (1,)"),
                            (model.init_state(2, 11), "at least the prompt's length (12)"),
                            (model.init_state(2)[:-1], "must be this model's 9 tensors")):
            with pytest.raises(ShapeError, match=re.escape(words)):
                model.prefill(tokens, into=into)


def test_an_exported_step_without_full_caches_holds_no_meta_state(tmp_path):
    """A model whose state has no capacity axis (recurrent only) finds that out before tracing: found while
    tracing, the meta-device state it is found from stayed in the exported step as four ``zeros`` ops."""
    from collections import Counter

    from attnspec.compiler.export import export_step

    spec = {**ATTENTION, "layers": [{"mixer": {"kind": "linear", "heads": 2, "transition": "data"}}]}
    program = export_step(attnspec.build(spec).eval(), tmp_path / "step.pt2")
    ops = Counter(str(node.target) for node in program.graph.nodes if node.op == "call_function")
    assert ops["aten.zeros.default"] == 0


def _bytes_allocated_by_steps(max_len: int, steps: int = 32) -> tuple[int, int, Tensor]:
    """(bytes allocated over ``steps`` decoding steps after an 8-token prefill, the largest single
    allocation, the last logits) of the shipped hybrid (linear blocks and softmax attention) at batch 2,
    counted by PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = attnspec.build(SPECS_BY_NAME["hybrid"], "d_model=32", f"max_len={max_len}")
    tokens = torch.randint(0, model.spec.input.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, *state = model.prefill(tokens, last_only=True)
        token = logits[:, -1].argmax(-1)
        logits, *state = model.step(token, *state)  # the first step's one-time set-up stays outside the count
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            for _ in range(steps):
                logits, *state = model.step(logits.argmax(-1), *state)
    sizes = [event.cpu_memory_usage for event in profiler.events() if event.cpu_memory_usage > 0]
    return sum(sizes), max(sizes), logits


def test_decoding_allocates_nothing_that_grows_with_the_cache_capacity():
    """Caches are written in place and a step reads only the filled prefix: 32 steps allocate the same
    bytes at max_len 512 and 4096 (before: 71 MB and 510 MB, a new copy of every cache per token), and no
    single allocation is the size of a cache. The greedy logits agree between the two capacities."""
    small_total, small_largest, small_logits = _bytes_allocated_by_steps(512)
    large_total, large_largest, large_logits = _bytes_allocated_by_steps(4096)
    cache_bytes = 2 * 4 * 4096 * 8 * 4  # one block's keys at max_len 4096: batch 2, 4 heads of 8, float32
    assert large_total == small_total and large_largest == small_largest < cache_bytes / 8
    assert (large_logits - small_logits).abs().max() < 1e-5


def test_decoding_state_is_bounded_before_it_is_allocated():
    """A spec within every other limit (256 softmax blocks, max_len 2**20) made generate allocate
    128 GiB of caches: the state of a generation is checked against MAX_DECODE_STATE_BYTES first."""
    from attnspec.compiler.sizes import check_model_size
    from attnspec.errors import BuildError
    from attnspec.spec import validate_data

    big = {**ATTENTION, "max_len": 1 << 20, "dtype": "float32",
           "layers": [{"repeat": 256, "layers": [{"mixer": {"kind": "softmax", "heads": 4}}]}]}
    with pytest.raises(BuildError, match="decoding state of 1 sequence"):
        check_model_size(validate_data(big))
    model = attnspec.build({**ATTENTION, "max_len": 1 << 20})  # 0.5 GiB per sequence: 64 rows are 32 GiB
    for call in (lambda: model.init_state(64), lambda: model.generate(torch.zeros(64, 2, dtype=torch.long), 1),
                 lambda: model.prefill(torch.zeros(64, 2, dtype=torch.long))):
        with pytest.raises(ShapeError, match="lower max_len or the batch"):
            call()
    # keys and values (4 heads of 8), the decay bias per head, and the position counter
    assert model.decode_state_bytes() == 2 * 4 * 8 * (1 << 20) * 8 + 4 * (1 << 20) * 8 + 8


def test_generate_samples_reproducibly_and_stops_at_eos():
    torch.manual_seed(0)
    model = attnspec.build(_attention(kv_heads=2))
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(3))
    first = model.generate(prompt, 12, temperature=1.5, top_k=10, top_p=0.9, seed=7)
    assert torch.equal(first, model.generate(prompt, 12, temperature=1.5, top_k=10, top_p=0.9, seed=7))
    assert first.shape == (2, 16) and torch.equal(first[:, :4], prompt)
    top1 = model.generate(prompt, 6, temperature=1.0, top_k=1, seed=1)
    assert torch.equal(top1, model.generate(prompt, 6, temperature=0))  # top_k = 1 is greedy
    eos = int(model.generate(prompt, 1, temperature=0)[0, -1])
    stopped = model.generate(prompt, 10, temperature=0, eos=eos)
    assert (stopped[0, 4:] == eos).all()  # row 0 produced eos first and repeats it
    # generation stops before its 10 tokens exactly when row 1 also produced eos among its first 9
    assert (stopped.shape[1] < 14) == bool((stopped[1, 4:13] == eos).any())
    for bad, message in (({"temperature": -1}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 1.5}, "top_p"),
                         ({"seed": 2 ** 64}, "seed"), ({"seed": "x"}, "seed"), ({"seed": -1}, "seed"),
                         ({"eos": 10 ** 30}, "eos"), ({"eos": 50}, "eos"), ({"eos": "a"}, "eos"),
                         ({"temperature": float("nan")}, "temperature"), ({"top_p": 0.0}, "top_p")):
        with pytest.raises(ShapeError, match=message):
            model.generate(prompt, 2, **bad)


def _left_padded(prompts: list[Tensor], pad: int = 0) -> tuple[Tensor, Tensor]:
    """Prompts of different lengths as transformers' generate takes them: (tokens, attention_mask) (B, T)."""
    T = max(len(prompt) for prompt in prompts)
    tokens = torch.full((len(prompts), T), pad, dtype=torch.int64)
    mask = torch.zeros(len(prompts), T, dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, T - len(prompt):], mask[row, T - len(prompt):] = prompt, 1
    return tokens, mask


@pytest.mark.parametrize("path", CAUSAL_LMS, ids=lambda p: p.stem)
def test_prompts_of_different_lengths_continue_as_each_would_alone(path):
    """Issue 37: left-padded prompts with an attention mask (lengths 1, 6, 9, 6: a one-token group is
    stepped, the others prefilled) give each row the tokens and last logits it gets alone, in float64
    within 1e-10, whatever the pad token."""
    torch.manual_seed(0)
    model = attnspec.build(path, *_small(path))
    vocab = model.spec.input.vocab_size
    source = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, vocab, (n,), generator=source) for n in (1, 6, 9, 6)]
    with torch.no_grad():
        alone = [model.generate(prompt.unsqueeze(0), 7, temperature=0)[0, len(prompt):] for prompt in prompts]
        for pad in (0, vocab - 1):
            tokens, mask = _left_padded(prompts, pad)
            together = model.generate(tokens, 7, temperature=0, attention_mask=mask)
            assert torch.equal(together[:, :tokens.shape[1]], tokens)
            assert all(torch.equal(row, mine) for row, mine in zip(together[:, tokens.shape[1]:], alone))


def test_a_mask_that_is_not_left_padding_is_refused_by_name():
    model = attnspec.build(SPECS_BY_NAME["hybrid"], *_small(SPECS_BY_NAME["hybrid"]))
    tokens = torch.ones(2, 4, dtype=torch.int64)
    for mask, words in [(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]), "pad on the left"),
                        (torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]), "all padding"),
                        (torch.tensor([[0, 2, 1, 1], [1, 1, 1, 1]]), "0 (padding) and 1"),
                        (torch.ones(2, 3, dtype=torch.int64), "shaped like the prompts"),
                        (torch.ones(2, 4), "bool or integer")]:
        with pytest.raises(ShapeError, match=re.escape(words)):
            model.generate(tokens, 2, temperature=0, attention_mask=mask)
    same = model.generate(tokens, 2, temperature=0, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    assert torch.equal(same, model.generate(tokens, 2, temperature=0))


@pytest.mark.slow
def test_exported_programs_decode_prompts_of_different_lengths_as_eager_does(tmp_path):
    """The built prefill.pt2 and step.pt2 (loaded without pickle) over left-padded prompts of lengths 1,
    5 and 8: greedy and sampled tokens equal eager generation's (the hybrid: linear blocks and softmax
    attention)."""
    from attnspec.compiler.archive import load_program
    from attnspec.nn.generate import decode

    torch.manual_seed(0)
    model = attnspec.build(SPECS_BY_NAME["hybrid"], "d_model=32", "max_len=32").eval()
    attnspec.save(model, tmp_path / "build", compile_check=False)
    step = load_program(tmp_path / "build" / "step.pt2").module()
    prefill = load_program(tmp_path / "build" / "prefill.pt2").module()
    source = torch.Generator().manual_seed(4)
    tokens, mask = _left_padded([torch.randint(0, model.spec.input.vocab_size, (n,), generator=source)
                                 for n in (1, 5, 8)])
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 20, "seed": 3}):
        eager = model.generate(tokens, 6, attention_mask=mask, **sampling)
        capacity = tokens.shape[1] + 6  # the state sized to the generation (the programs' capacity is dynamic)
        exported = decode(step, list(model.init_state(3, capacity)), tokens, 6, attention_mask=mask, **sampling,
                          prefill=lambda prompt: prefill(prompt, *model.init_state(prompt.shape[0], capacity)))
        assert torch.equal(exported, eager), sampling


CAPACITY_FAMILIES = {  # the families whose state holds positions, beyond the shipped specs
    "mla": {"kind": "mla", "heads": 3, "d_qk": 10, "d_v": 7, "kv_rank": 8, "q_rank": 6, "rope_dim": 4,
            "position": {"kind": "rope", "base": 100.0}},
    "parallel": {"kind": "parallel", "branches": [{"kind": "linear", "heads": 2, "transition": "data"},
                                                  {"kind": "softmax", "heads": 2, "position": "rope"}]},
    "exp-features": {"kind": "linear", "heads": 2, "feature_map": "exp", "normalize": True},
}


def _capacity_models():
    models = [(path.stem, attnspec.build(path, *_small(path))) for path in CAUSAL_LMS]
    for name, mixer in CAPACITY_FAMILIES.items():
        spec = {**ATTENTION, "max_len": 64, "layers": [{"mixer": mixer}, {"mixer": mixer}]}
        models.append((name, attnspec.build(spec)))
    from tests.nn.test_shared_blocks import _data
    models.append(("shared-attention", attnspec.build({**_data(), "max_len": 64})))
    return models


@pytest.mark.parametrize("name, model", _capacity_models(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_state_sized_to_the_generation_decodes_exactly_and_refuses_past_its_capacity(name, model):
    """``prefill(capacity=C)`` / ``init_state(capacity=C)``: full caches and kept inputs hold C positions
    (not max_len 64), windows and recurrent states keep their one size, and decoding from them equals the
    full pass (float64, 1e-10: the same reads of the same slots in a smaller allocation). A step at position C,
    or a prompt longer than C, is refused by name."""
    torch.manual_seed(0)
    tokens = torch.randint(0, model.spec.input.vocab_size, (2, 25), generator=torch.Generator().manual_seed(6))
    capacity = 25
    with torch.no_grad():
        full = model(tokens)
        _, *at_max_len = model.prefill(tokens[:, :17])
        logits, *state = model.prefill(tokens[:, :17], capacity=capacity)
        for small, large in zip(state, at_max_len):
            axes = [i for i, (a, b) in enumerate(zip(small.shape, large.shape)) if a != b]
            assert small.dim() == large.dim() and axes in ([], [small.dim() - 2], [1], [2]), (small.shape, large.shape)
            assert all(small.shape[i] == capacity and large.shape[i] == 64 for i in axes)
        held = [t for t, big in zip(state, at_max_len) if t.shape != big.shape]
        assert bool(held) == any(block.decode_limit is not None for block in model.blocks)
        for t in range(17, 25):
            logits, *state = model.step(tokens[:, t], *state)
            assert (logits - full[:, t]).abs().max() < 1e-10
        stepped = model.init_state(2, capacity=capacity)
        assert [t.shape for t in stepped] == [t.shape for t in state]
        if held:
            with pytest.raises(ShapeError, match="holds 25 positions"):
                model.step(tokens[:, 0], *state)
            mixer = next(mixer for mixer in [*(block.mixer for block in model.blocks),
                                             *(block.mixer for block in model.shared_blocks.values())]
                         if mixer.decode_limit is not None)
            with pytest.raises(ShapeError, match="does not fit a decoding state of 10 positions"):
                mixer.prefill(torch.zeros(2, 17, mixer.d_in, dtype=torch.float64), capacity=10)
        with pytest.raises(ShapeError, match=r"capacity must be an integer of at least the prompt's length \(17\)"):
            model.prefill(tokens[:, :17], capacity=16)


@pytest.mark.parametrize("name", ["hybrid", "qwen3-next-style"])
def test_a_compiled_step_equals_the_eager_step_without_recompiling(name):
    """``torch.compile(model.step, fullgraph=True)`` (how a GPU decoding loop runs it: benchmarks/gpu.py)
    traces the whole step, per-step sharing included, once for every position, and equals eager.
    (float32: the compiler's fused reductions reorder sums, so equal within 1e-5 of the logits' scale.)"""
    path = SPECS_BY_NAME[name]
    torch.manual_seed(0)
    model = attnspec.build(path, *small_overrides(path), "max_len=64").eval()
    tokens = torch.randint(0, model.spec.input.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()  # another model's compiled step is the same code: it would read as a recompile
    compiled = torch.compile(model.step, fullgraph=True)
    eager_state, compiled_state = model.init_state(2), model.init_state(2)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(tokens.shape[1]):
            expected, *eager_state = model.step(tokens[:, t], *eager_state)
            logits, *compiled_state = compiled(tokens[:, t], *compiled_state)
            assert (logits - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_attention_sinks_compile_into_the_step_and_keep_packed_documents_apart():
    """Sinks (a learned logit per head, perturbed here) in a compiled step (the bucketed read takes them as a
    cond operand) equal the eager step, and packed documents each compute as they would alone."""
    from attnspec.ops.documents import from_ids

    torch.manual_seed(0)
    model = attnspec.build(_attention(sinks=True, window=7, kv_heads=2)).eval()
    with torch.no_grad():
        model.blocks[0].mixer.sinks.copy_(torch.tensor([-1.0, 0.5, 1.5, 3.0]))
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ids = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
        packed = model(tokens, documents=from_ids(ids))
        alone = torch.cat([model(tokens[:1, :5]), model(tokens[:1, 5:])], 1)
        assert (packed[:1] - alone).abs().max() < 1e-10
    torch._dynamo.reset()
    compiled = torch.compile(model.step, fullgraph=True)
    eager_state, compiled_state = model.init_state(2), model.init_state(2)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(6):
            expected, *eager_state = model.step(tokens[:, t], *eager_state)
            logits, *compiled_state = compiled(tokens[:, t], *compiled_state)
            assert (logits - expected).abs().max() <= 1e-9 * expected.abs().max()


def test_generate_is_greedy_unless_a_temperature_asks_for_sampling():
    """transformers' convention: ``generate(prompt, n)`` is greedy (the same tokens as temperature 0, with no
    seed); a positive temperature samples (other draws than greedy here, and reproducible by seed)."""
    path = SPECS_BY_NAME["softmax-transformer"]
    model = attnspec.build(path, *_small(path)).eval()
    prompt = torch.randint(0, model.spec.input.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        default = model.generate(prompt, 12)
        assert torch.equal(default, model.generate(prompt, 12, temperature=0.0))
        sampled = model.generate(prompt, 12, temperature=5.0, seed=3)
        assert torch.equal(sampled, model.generate(prompt, 12, temperature=5.0, seed=3))
    assert not torch.equal(sampled, default)
