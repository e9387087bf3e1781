"""Hugging Face interop against the truth: transformers' own modelling code on random tiny models built
here from their configs (nothing is downloaded).

For every supported model type: the imported attnspec model computes transformers' logits, in every
mode of its mixers, and continues them through its decoding step as transformers' cache does;
import -> export-hf -> from_pretrained gives the same model back as its own class; a spec transformers
lacks exports as the ``attnspec`` type, loads with AutoModelForCausalLM and generates what attnspec
generates, token for token.

Tolerance: 1e-4 of the largest logit (logits of size ~4), the issue's figure. Measured in float32
(max |diff| / max |logit|): llama 6.5e-7, mistral 4.4e-7, qwen2 5.2e-7, qwen3 5.6e-7, mamba2 3.3e-7,
qwen3_next 5.8e-6 (its delta rule is the least well conditioned: attnspec in float64 differs from
both float32 results by 1.5e-5). A real difference (one wrong weight, a misplaced head) moves logits
by O(1). float64 cannot be held to 1e-10 here: transformers' code computes its RMSNorms, RoPE tables
and the Mamba2 and Gated DeltaNet scans in float32 whatever the model's dtype, so a float64 import is
checked to the same bound. Weights are perturbed from transformers' small initialisation so that
every part moves the logits.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)
from typer.testing import CliRunner

import attnspec
import attnspec.hf  # noqa: F401  (registers the attnspec model type)
from attnspec.cli import app
from attnspec.errors import InteropError
from attnspec.interop.convert import convert_weights, export_hf, spec_from_checkpoint
from attnspec.nn.model import build_model_from_spec
from tests.test_cli import attnspec as attnspec_cli

VOCAB, LENGTH, NEW_TOKENS = 97, 21, 4
BOUND = 1e-4
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _llama():  # tied embeddings and every bias Llama allows
    return LlamaForCausalLM(LlamaConfig(**SMALL, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 500.0}))


def _mistral():  # a window shorter than the sequence
    return MistralForCausalLM(MistralConfig(**SMALL, head_dim=8, sliding_window=6))


def _qwen2():  # q/k/v biases; full attention, then a window (max_window_layers)
    return Qwen2ForCausalLM(Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=6, max_window_layers=1))


def _qwen3():  # QK-norm, head_dim apart from hidden_size / heads
    return Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=12))


def _qwen3_next():  # Gated DeltaNet x3 then gated attention with partial RoPE, dense MLPs
    config = Qwen3NextConfig(**{**SMALL, "num_hidden_layers": 4}, head_dim=16, linear_num_value_heads=4,
                             linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=6, num_experts=0)
    return Qwen3NextForCausalLM(config)


def _mamba2():
    config = Mamba2Config(vocab_size=VOCAB, hidden_size=32, num_heads=8, head_dim=8, expand=2, state_size=6,
                          n_groups=2, num_hidden_layers=2, chunk_size=16)
    return Mamba2ForCausalLM(config)


MODELS = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_next": _qwen3_next,
          "mamba2": _mamba2}


def _random_model(model_type: str):
    """A tiny transformers model whose every weight is perturbed (seeded)."""
    return _perturbed(MODELS[model_type])


def _perturbed(build):
    """``build()``, seeded, with every weight perturbed so that zero-initialised parts (routers, gates)
    matter, in eval mode; greedy generation runs to the length asked, as attnspec's does."""
    torch.manual_seed(0)
    model = build()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model type -> (the transformers model, its saved checkpoint directory)."""
    saved = {}
    for model_type in MODELS:
        model = _random_model(model_type)
        directory = tmp_path_factory.mktemp(model_type) / "checkpoint"
        model.save_pretrained(directory)
        saved[model_type] = (model, directory)
    return saved


def _imported(directory, model_type):
    spec = spec_from_checkpoint(directory)[1]
    model = build_model_from_spec(spec)
    model.load_state_dict(convert_weights(spec, directory, model_type))
    return model.eval()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def _tokens(batch: int = 2, length: int = LENGTH) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("model_type", list(MODELS))
def test_an_imported_model_computes_transformers_logits_in_every_mode(checkpoints, model_type):
    reference, directory = checkpoints[model_type]
    model = _imported(directory, model_type)
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens).logits
        mode_sets = {tuple(block.mixer.modes) for block in model.blocks}
        for choice in itertools.product(*[range(len(modes)) for modes in mode_sets]):
            chosen = dict(zip(mode_sets, choice))
            model.set_modes([block.mixer.modes[chosen[tuple(block.mixer.modes)]] for block in model.blocks])
            assert _relative(model(tokens), expected) < BOUND, [block.mixer.mode for block in model.blocks]
    assert expected.abs().max() > 1.0  # logits of some size: the comparison can fail


@pytest.mark.parametrize("model_type", list(MODELS))
def test_an_imported_model_decodes_as_transformers_does(checkpoints, model_type):
    """Greedy continuation: the same tokens, and at each new position the same logits as transformers'
    cached decoding (its KV cache, Gated DeltaNet state or Mamba2 cache)."""
    reference, directory = checkpoints[model_type]
    model = _imported(directory, model_type)
    prompt = _tokens(length=9)
    with torch.no_grad():
        out = reference.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        ours = model.generate(prompt, NEW_TOKENS, temperature=0.0)
        assert torch.equal(ours, out.sequences)
        logits, *state = model.prefill(prompt)
        stepped = [logits[:, -1]]
        for t in range(NEW_TOKENS - 1):
            step_logits, *state = model.step(out.sequences[:, prompt.shape[1] + t].contiguous(), *state)
            stepped.append(step_logits)
    for position, (theirs, mine) in enumerate(zip(out.logits, stepped)):
        assert _relative(mine, theirs) < BOUND, position


@pytest.mark.parametrize("model_type", list(MODELS))
def test_an_imported_model_decodes_left_padded_prompts_as_transformers_does(checkpoints, model_type):
    """Issue 37: prompts of 3, 9 and 6 tokens left-padded with an attention mask (transformers' way):
    the same greedy tokens as transformers' generate, whose attention, Gated DeltaNet and Mamba2 layers
    mask the padding their own ways, and as each prompt generated alone."""
    reference, directory = checkpoints[model_type]
    model = _imported(directory, model_type)
    whole = _tokens(batch=3, length=9)
    mask = torch.ones_like(whole)
    mask[0, :6], mask[2, :3] = 0, 0
    tokens = whole.masked_fill(mask == 0, 0)
    with torch.no_grad():
        theirs = reference.generate(tokens, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                    pad_token_id=0)
        ours = model.generate(tokens, NEW_TOKENS, temperature=0.0, attention_mask=mask)
        alone = [model.generate(tokens[row:row + 1, 9 - int(mask[row].sum()):], NEW_TOKENS, temperature=0.0)
                 for row in range(3)]
    assert torch.equal(ours, theirs)
    assert all(torch.equal(ours[row, 9:], alone[row][0, -NEW_TOKENS:]) for row in range(3))


@pytest.mark.parametrize("model_type", ["mistral", pytest.param("qwen3_next", marks=pytest.mark.slow), "mamba2"])
def test_import_then_export_returns_the_native_model(checkpoints, tmp_path, model_type):
    """``attnspec import-hf`` writes a build directory; ``export-hf`` writes it back as its own class,
    which loads without attnspec and computes the original's logits."""
    reference, directory = checkpoints[model_type]
    build, exported = tmp_path / "build", tmp_path / "hf"
    runner = CliRunner()
    result = runner.invoke(app, ["import-hf", str(directory), "-o", str(build), "--no-compile", "--no-calibrate"])
    assert result.exit_code == 0, result.output
    assert (build / "spec.yaml").is_file() and not list(build.glob("*.pt2"))  # programs only on request
    assert "greedy tokens agree" in result.output  # checked against transformers, at its size and dtype
    result = runner.invoke(app, ["export-hf", str(build), "-o", str(exported)])
    assert result.exit_code == 0, result.output
    assert model_type in result.output
    if model_type == "qwen3_next":  # the imported weights' decays and attention maps can be inspected
        for diagnostic in ("gates", "maps"):
            shown = attnspec_cli("diagnose", diagnostic, str(build), "-o", str(tmp_path / diagnostic))
            assert shown.returncode == 0 and (tmp_path / diagnostic / f"{diagnostic}.csv").is_file(), shown.stderr
        refused = attnspec_cli("diagnose", "span", str(build), "-o", str(tmp_path / "span"))
        assert refused.returncode == 2 and "build directory" in refused.stderr
    loaded = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(loaded) is type(reference)
    tokens = _tokens()
    with torch.no_grad():
        assert _relative(loaded(tokens).logits, reference(tokens).logits) < 1e-6


def _attnspec_only_model(name: str = "sliding-window-hybrid"):
    """A shipped spec transformers has no class for (by default Mamba2 and sliding-window attention)."""
    spec = attnspec.load_spec(f"specs/{name}.yaml").model_dump(mode="json")
    spec.update(max_len=64, input={"kind": "tokens", "vocab_size": VOCAB})
    torch.manual_seed(0)
    return attnspec.build(spec).eval()


@pytest.mark.parametrize("name", [pytest.param("sliding-window-hybrid", marks=pytest.mark.slow), "performer",
                                  pytest.param("gateloop", marks=pytest.mark.slow)])
def test_a_spec_transformers_lacks_exports_as_the_attnspec_type_and_generates_alike(tmp_path, name):
    """Hybrid caches, Performer's random-feature buffers and GateLoop's complex state all survive the trip."""
    model = _attnspec_only_model(name)
    attnspec.save(model, tmp_path / "build", compile_check=False)
    output, model_type = export_hf(tmp_path / "build", tmp_path / "hf")
    assert model_type == "attnspec"
    loaded = AutoModelForCausalLM.from_pretrained(output).eval()
    prompt = _tokens(length=7)
    with torch.no_grad():
        assert _relative(loaded(prompt).logits, model(prompt)) < 1e-6
        greedy = loaded.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(greedy, model.generate(prompt, 12, temperature=0.0))
        sampled = loaded.generate(prompt, max_new_tokens=12, do_sample=True, top_k=20, pad_token_id=0)
    assert sampled.shape == (2, 19) and bool((sampled >= 0).all() and (sampled < VOCAB).all())
    assert torch.equal(sampled[:, :7], prompt)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_attnspec_type_export_loads_with_equal_logits(tmp_path, dtype):
    """Every released checkpoint is bf16: its edited export loads under the default dtype and "auto" (the
    check of the directory compared the file with a float32 model and refused every half-precision one)."""
    spec = attnspec.load_spec("specs/performer.yaml").model_dump(mode="json")
    spec.update(max_len=64, input={"kind": "tokens", "vocab_size": VOCAB}, dtype=dtype)
    torch.manual_seed(0)
    model = attnspec.build(spec).eval()
    attnspec.save(model, tmp_path / "build", compile_check=False)
    output, model_type = export_hf(tmp_path / "build", tmp_path / "hf")
    assert model_type == "attnspec"
    prompt = _tokens(length=7)
    with torch.no_grad():
        expected = model(prompt)
        for options in ({}, {"dtype": "auto"}):
            loaded = AutoModelForCausalLM.from_pretrained(output, **options).eval()
            assert loaded.dtype == getattr(torch, dtype)
            assert torch.equal(loaded(prompt).logits, expected)


def test_attnspec_type_generates_left_padded_prompts_as_attnspec_does(tmp_path):
    """Issue 37: transformers' own generate over the exported attnspec type with a left-padded batch
    (a hybrid: linear blocks and softmax attention) gives attnspec's tokens for the same mask; a
    padded batch without the decoding state is refused by name."""
    torch.manual_seed(0)
    model = attnspec.build("specs/hybrid.yaml", "d_model=32", "max_len=32").eval()
    attnspec.save(model, tmp_path / "build", compile_check=False)
    export_hf(tmp_path / "build", tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = _tokens(batch=3, length=7).remainder(model.spec.input.vocab_size)
    mask = torch.ones_like(tokens)
    mask[0, :4], mask[2, :6] = 0, 0
    with torch.no_grad():
        theirs = loaded.generate(tokens, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(theirs, model.generate(tokens, 6, temperature=0.0, attention_mask=mask))
        with pytest.raises(ValueError, match="padded batch runs through the decoding state"):
            loaded(tokens, attention_mask=mask, use_cache=False)


def test_attnspec_type_generate_prefills_once_and_steps_once_per_token(tmp_path):
    """transformers 5.24 hands the cache back as `cache`; reading only `past_key_values` re-ran the whole
    sequence for every token (quadratic), and a recurrent model stopped at max_len. One prefill, then
    one step per new token; GateLoop (recurrent, max_len 16) generates past max_len as attnspec does."""
    spec = attnspec.load_spec("specs/gateloop.yaml").model_dump(mode="json")
    spec.update(max_len=16, d_model=16, input={"kind": "tokens", "vocab_size": VOCAB})
    torch.manual_seed(0)
    model = attnspec.build(spec).eval()
    attnspec.save(model, tmp_path / "build", compile_check=False)
    export_hf(tmp_path / "build", tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    calls = {"prefill": 0, "step": 0}
    for name in calls:
        original = getattr(loaded.model, name)

        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)
        setattr(loaded.model, name, counted)
    prompt = _tokens(length=7)
    with torch.no_grad():
        greedy = loaded.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                                 pad_token_id=0)
    assert calls == {"prefill": 1, "step": 19}
    assert greedy.shape == (2, 27) and torch.equal(greedy, model.generate(prompt, 20, temperature=0.0))


@pytest.mark.slow  # a subprocess or several builds: the full suite runs it, the quick loop not
def test_an_attnspec_type_directory_with_wrong_weights_is_refused_before_loading(tmp_path):
    """from_pretrained left a missing tensor as uninitialised memory (other logits at every load) and
    accepted NaN and integer weights; a 1 KB config of 4.2e9 parameters allocated 16.8 GB."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    attnspec.save(_attnspec_only_model("gateloop"), tmp_path / "build", compile_check=False)
    export_hf(tmp_path / "build", tmp_path / "hf")
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    name = "model.embed.weight"
    for change, words in [(lambda t: t.pop(name), "missing"), (lambda t: t.update(extra=torch.zeros(2)), "unexpected"),
                          (lambda t: t.update({name: t[name].long()}), "I64"),
                          (lambda t: t.update({name: t[name][:3]}), name),
                          (lambda t: t[name].__setitem__((0, 0), float("nan")), "NaN")]:
        directory = tmp_path / "changed"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(tmp_path / "hf", directory)
        changed = {k: v.clone() for k, v in tensors.items()}
        change(changed)
        save_file(changed, directory / "model.safetensors")
        with pytest.raises(InteropError) as caught:
            AutoModelForCausalLM.from_pretrained(directory)
        assert words in str(caught.value), str(caught.value)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["spec"].update(d_model=8192, layers=[{"repeat": 64, "layers": [{"mixer": {"kind": "softmax",
                                                                                      "heads": 64}}]}])
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(InteropError, match="over the limit"):
        AutoModelForCausalLM.from_pretrained(directory)
    from attnspec.hf import AttnspecForCausalLM  # (the Auto class asks the hub for a config first)

    with pytest.raises(InteropError, match="not a local directory"):
        AttnspecForCausalLM.from_pretrained(tmp_path / "missing")


def test_an_imported_llama_built_as_attnspec_exports_as_llama(checkpoints, tmp_path):
    """Without transformers' class names in the spec, the round trip picks the type: a Llama-family spec
    without windows, QK-norm or q/k/v-only biases is a Llama."""
    _, directory = checkpoints["llama"]
    result = CliRunner().invoke(app, ["import-hf", str(directory), "-o", str(tmp_path / "b"), "--no-compile",
                                      "--no-calibrate"])
    assert result.exit_code == 0, result.output
    assert export_hf(tmp_path / "b", tmp_path / "hf")[1] == "llama"
    assert not (tmp_path / "hf" / "pytorch_model.bin").exists()


def test_a_float64_checkpoint_imports_as_a_float64_spec(tmp_path):
    reference = _random_model("llama").double()
    reference.save_pretrained(tmp_path / "checkpoint")
    model = _imported(tmp_path / "checkpoint", "llama")
    assert model.spec.dtype == "float64" and model.embed.weight.dtype == torch.float64
    tokens = _tokens()
    with torch.no_grad():
        assert _relative(model(tokens), reference(tokens).logits) < BOUND


def test_import_attnspec_never_imports_transformers():
    import subprocess
    import sys

    code = ("import sys, attnspec, attnspec.cli, attnspec.nn.model, attnspec.compiler.build; "
            "sys.exit('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# --------------------------------------------------------------------------- refusals


def test_an_impossible_mixture_of_experts_is_a_located_refusal_and_nothing_is_written(tmp_path):
    import json

    config = Qwen3NextConfig(**{**SMALL, "num_hidden_layers": 4}, head_dim=16, linear_num_value_heads=4,
                             linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=6, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                             mlp_only_layers=[0, 1])
    Qwen3NextForCausalLM(config).save_pretrained(tmp_path / "moe")
    written = json.loads((tmp_path / "moe" / "config.json").read_text())
    (tmp_path / "moe" / "config.json").write_text(json.dumps({**written, "num_experts_per_tok": 5}))
    result = attnspec_cli("import-hf", str(tmp_path / "moe"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "num_experts_per_tok" in result.stderr and "5 experts per token of 4" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, words", [
    ({"model_type": "phimoe"}, ["model_type", "phimoe needs the SparseMixer router"]),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, ["rope_type", "longrope"]),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": -2}}, ["factor", "positive"]),
    ({"hidden_act": "quick_gelu"}, ["hidden_act", "quick_gelu"]),
    ({"num_key_value_heads": 3}, ["num_key_value_heads"]),
    ({"num_attention_heads": "four"}, ["num_attention_heads", "expected int"]),
    # the audit's crashes: each now a refusal naming the field, before anything is built from it
    ({"model_type": ["llama"]}, ["model_type", "is not a causal language model type"]),
    ({"model_type": {"llama": 1}}, ["model_type", "is not a causal language model type"]),
    ({"rms_norm_eps": 10 ** 400}, ["rms_norm_eps", "finite"]),
    ({"num_hidden_layers": 10 ** 19}, ["num_hidden_layers", "limit of 256"]),
    ({"num_hidden_layers": 10 ** 9}, ["num_hidden_layers", "limit of 256"]),
])
def test_a_config_attnspec_cannot_express_is_refused_by_field(checkpoints, tmp_path, change, words):
    import json
    import shutil

    directory = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["llama"][1], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(InteropError) as caught:
        spec_from_checkpoint(directory)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_qwen3_next_layer_lists_are_bounded(checkpoints, tmp_path):
    """`mlp_only_layers` of 300,000 entries (within the 4 MiB config limit) was checked in quadratic time."""
    import json
    import shutil

    directory = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["qwen3_next"][1], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "mlp_only_layers": list(range(300_000))}))
    with pytest.raises(InteropError, match="mlp_only_layers"):
        spec_from_checkpoint(directory)


def test_pickled_weights_are_never_loaded(checkpoints, tmp_path):
    import shutil

    directory = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["llama"][1], directory)
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    spec = spec_from_checkpoint(directory)[1]
    with pytest.raises(InteropError, match="pickle"):
        convert_weights(spec, directory, "llama")


def test_weights_that_do_not_fit_the_config_are_refused_by_name(checkpoints, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    directory = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["qwen3"][1], directory)
    spec = spec_from_checkpoint(directory)[1]
    tensors = load_file(directory / "model.safetensors")
    for change, match in [(lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"), "lack"),
                          (lambda t: t.update(extra=torch.zeros(2)), "extra"),
                          (lambda t: t.update({"model.norm.weight": torch.zeros(5)}), "model.norm.weight"),
                          # the right number of elements in another shape: Link.split crashed on it
                          (lambda t: t.update({"model.embed_tokens.weight":
                                               t["model.embed_tokens.weight"].reshape(32, -1)}), r"\(32, 97\)"),
                          # read as stored (no arithmetic) and still checked: its last element
                          (lambda t: t["model.embed_tokens.weight"].__setitem__((-1, -1), float("inf")),
                           "'model.embed_tokens.weight' holds NaN or infinite")]:
        changed = dict(tensors)
        change(changed)
        save_file(changed, directory / "model.safetensors")
        with pytest.raises(InteropError, match=match):
            convert_weights(spec, directory, "qwen3")


@pytest.mark.slow  # a subprocess or several builds: the full suite runs it, the quick loop not
def test_export_refuses_what_transformers_cannot_hold(tmp_path):
    spec = attnspec.load_spec("specs/softmax-transformer.yaml").model_dump(mode="json")
    spec["head"] = {"kind": "classifier", "classes": 3}
    attnspec.save(attnspec.build(spec), tmp_path / "classifier", compile_check=False)
    with pytest.raises(InteropError, match="lm head"):
        export_hf(tmp_path / "classifier", tmp_path / "out")
    attnspec.save(_attnspec_only_model(), tmp_path / "hybrid", compile_check=False)
    with pytest.raises(InteropError, match="not a llama model"):
        export_hf(tmp_path / "hybrid", tmp_path / "out2", model_type="llama")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_a_training_run_exports_its_latest_checkpoint(tmp_path):
    run = attnspec.train("specs/softmax-transformer.yaml", overrides=["d_model=16", "layers[0].repeat=1", "max_len=16",
                                                                      "input.vocab_size=32", "position=learned"],
                         task="mqar", task_overrides=["seq_len=16", "vocab_size=32", "num_kv_pairs=2"],
                         output=tmp_path / "run", steps=6, batch_size=4, eval_every=6, test_examples=8, lr=1e-2)
    output, model_type = export_hf(tmp_path / "run", tmp_path / "hf")
    assert model_type == "attnspec"  # LayerNorm, GELU MLP and learned positions: no transformers class has them
    loaded = AutoModelForCausalLM.from_pretrained(output).eval()
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert _relative(loaded(tokens).logits, run.model.eval()(tokens)) < 1e-6
        initial = attnspec.build("specs/softmax-transformer.yaml", "d_model=16", "layers[0].repeat=1", "max_len=16",
                                 "input.vocab_size=32", "position=learned").eval()
        assert _relative(loaded(tokens).logits, initial(tokens)) > 1e-3  # the trained weights, not the initial ones


def test_a_hostile_checkpoint_directory_is_refused_without_reading_outside_it(checkpoints, tmp_path):
    import json
    import shutil

    directory = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["llama"][1], directory)
    spec = spec_from_checkpoint(directory)[1]
    (directory / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    index = {"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InteropError, match="plain file name"):
        convert_weights(spec, directory, "llama")
    for text, match in [("[1, 2]", "JSON object"), ('{"model_type": NaN}', "not valid JSON"),
                        ("x" * (5 << 20), "larger than")]:
        (directory / "config.json").write_text(text)
        with pytest.raises(InteropError, match=match):
            spec_from_checkpoint(directory)


@pytest.mark.slow  # a subprocess or several builds: the full suite runs it, the quick loop not
def test_export_hf_force_replaces_only_its_own_output_and_cleans_leftovers(checkpoints, tmp_path):
    """export-hf said "pass --force" but had none; a killed export's .OUT.tmp-* stayed forever; its
    model.safetensors was 0600 beside 0644 files."""
    import os
    import stat

    build = tmp_path / "b"
    assert attnspec_cli("import-hf", str(checkpoints["llama"][1]), "-o", str(build), "--no-compile",
                        "--no-calibrate").returncode == 0
    out = tmp_path / "hf"
    leftover = tmp_path / ".hf.tmp-abcd1234"  # a killed export's scratch directory
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")
    assert attnspec_cli("export-hf", str(build), "-o", str(out)).returncode == 0
    assert not leftover.exists()
    modes = {stat.S_IMODE(os.stat(path).st_mode) for path in [*out.iterdir(), *build.iterdir()]}
    assert modes == {0o644}, modes
    again = attnspec_cli("export-hf", str(build), "-o", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    assert attnspec_cli("export-hf", str(build), "-o", str(out), "--force").returncode == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = attnspec_cli("export-hf", str(build), "-o", str(mine), "--force")
    assert refused.returncode == 2 and "attnspec_export.json" in refused.stderr
    assert (mine / "notes.txt").read_text() == "mine"
    # a user's own llama directory has export-hf's file names but not its record: the names decide nothing
    own = tmp_path / "my_llama"
    checkpoints["llama"][0].save_pretrained(own)
    before = {p.name: p.read_bytes() for p in own.iterdir()}
    refused = attnspec_cli("export-hf", str(build), "-o", str(own), "--force")
    assert refused.returncode == 2 and "holds no attnspec_export.json" in refused.stderr
    assert {p.name: p.read_bytes() for p in own.iterdir()} == before
    # nor does export-hf's record once its files are the user's: a weights file replaced, or one added
    for change, words in [(lambda d: (d / "model.safetensors").write_bytes(b"the user's own weights"),
                           "model.safetensors' is not the file export-hf wrote"),
                          (lambda d: (d / "extra.bin").write_bytes(b"mine"), "extra.bin")]:
        edited = tmp_path / f"edited-{len(words)}"
        assert attnspec_cli("export-hf", str(build), "-o", str(edited)).returncode == 0
        change(edited)
        refused = attnspec_cli("export-hf", str(build), "-o", str(edited), "--force")
        assert refused.returncode == 2 and words in refused.stderr and "attnspec wrote" in refused.stderr


@pytest.mark.slow  # a subprocess or several builds: the full suite runs it, the quick loop not
def test_import_hf_options_are_checked_before_any_work(checkpoints, tmp_path):
    import os

    directory = checkpoints["llama"][1]
    for args, words in [(["--max-len", "0"], "--max-len must be"), (["--max-len", "1"], "--max-len must be"),
                        (["--spec", str(tmp_path / "nodir" / "x.yaml")], "does not exist")]:
        result = attnspec_cli("import-hf", str(directory), "-o", str(tmp_path / "out"), *args)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / "out").exists()
    # a folder name that is not UTF-8 was refused with a pydantic message; safetensors cannot open such a
    # path, so it is refused plainly, naming the path
    odd = os.path.join(os.fsencode(tmp_path), b"ck\xff")
    import shutil

    shutil.copytree(directory, os.fsdecode(odd))
    result = attnspec_cli("import-hf", os.fsdecode(odd), "-o", str(tmp_path / "odd-out"), "--no-compile",
                          "--no-calibrate")
    assert result.returncode == 2 and "not UTF-8 text" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "odd-out").exists()


def _qwen3_next_experts():
    """Qwen3-Next with its mixture of experts on: 4 experts, top 2 renormalised, a shared expert behind its
    gate, layer 1 dense (mlp_only_layers) so dense and sparse blocks alternate."""
    config = Qwen3NextConfig(**{**SMALL, "num_hidden_layers": 4}, head_dim=16, linear_num_value_heads=4,
                             linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=6, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=20,
                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])
    return _perturbed(lambda: Qwen3NextForCausalLM(config))


def spec_blocks(spec) -> list:
    from attnspec.spec.walk import iter_blocks

    return [block for _, block in iter_blocks(spec, expand=True)]


def _holds_to(reference, directory, model_type: str, modes=("chunk",), generate: bool = True):
    """Save ``reference`` to ``directory``, import it, and hold the import to it: logits within BOUND with
    every block in each of ``modes`` (where it has it), greedy generation token for token, and the
    export back (``export-hf``'s writer) loading as the reference's own class with its logits within
    BOUND. Returns the imported spec."""
    from attnspec.interop.convert import export_model_hf

    reference.save_pretrained(directory)
    spec = spec_from_checkpoint(directory)[1]
    model = _imported(directory, model_type)
    tokens, prompt = _tokens(), _tokens(length=9)
    with torch.no_grad():
        expected = reference(tokens).logits
        for mode in modes:
            model.set_modes([mode if mode in block.mixer.modes else block.mixer.modes[0] for block in model.blocks])
            assert _relative(model(tokens), expected) < BOUND, mode
        if generate:
            out = reference.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                                     attention_mask=torch.ones_like(prompt))
            assert torch.equal(model.generate(prompt, NEW_TOKENS, temperature=0.0), out)
    exported, kind = export_model_hf(model, directory.parent / f"{directory.name}-exported", model_type=model_type)
    assert kind == model_type
    # a spec holds no special token ids: the export leaves them to the class's defaults, which for some
    # types (SmolLM3's padding id 128004) lie outside these tiny vocabularies
    pad = {"pad_token_id": reference.config.pad_token_id} if hasattr(reference.config, "pad_token_id") else {}
    loaded = AutoModelForCausalLM.from_pretrained(exported, **pad).eval()
    assert type(loaded) is type(reference)
    with torch.no_grad():
        assert _relative(loaded(tokens).logits, expected) < BOUND
    return spec


def _text_model_holds_to(reference, directory, release: str, text_type: str, text_logits=None):
    """Save the multimodal ``reference`` (a ``release`` type), import its text model (as ``text_type``, the other
    tensors left unread) and hold its logits on text to the reference's (``text_logits(tokens)`` where the release's
    own forward cannot take text alone). Returns the imported (spec, model)."""
    reference.save_pretrained(directory)
    assert json.loads((directory / "config.json").read_text())["model_type"] == release
    _, spec, model_type = spec_from_checkpoint(directory)
    assert model_type == text_type
    model = _imported(directory, model_type)
    tokens = _tokens()
    with torch.no_grad():
        expected = text_logits(tokens) if text_logits else reference(input_ids=tokens).logits
        assert _relative(model(tokens), expected) < BOUND
    return spec, model


EVERY_MODE = ("chunk", "recurrent", "scan", "quadratic")


@pytest.mark.slow  # two CLI subprocesses and three models: the full suite runs it, the quick loop not
def test_qwen3_next_with_experts_computes_transformers_logits_decodes_and_round_trips(tmp_path):
    reference = _qwen3_next_experts()
    spec = _holds_to(reference, tmp_path / "checkpoint", "qwen3_next", EVERY_MODE)
    assert [block.mlp.kind for block in spec_blocks(spec)] == ["moe", "glu", "moe", "moe"]
    build = tmp_path / "build"
    result = attnspec_cli("import-hf", str(tmp_path / "checkpoint"), "-o", str(build), "--no-compile",
                          "--no-calibrate")
    assert result.returncode == 0, result.stderr
    assert attnspec_cli("export-hf", str(build), "-o", str(tmp_path / "back")).returncode == 0
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(again).__name__ == "Qwen3NextForCausalLM"
    tokens = _tokens()
    with torch.no_grad():
        assert _relative(again(tokens).logits, reference(tokens).logits) < BOUND


ROPE_SCALINGS = {  # a trained context (16) shorter than the test's 21 positions, so every scaling bites
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
             "beta_slow": 1.0},
}


@pytest.mark.parametrize("scaling", ROPE_SCALINGS)
def test_a_scaled_rope_imports_logit_equal_and_exports_as_it_came(tmp_path, scaling):
    config = LlamaConfig(**{**SMALL, "max_position_embeddings": 64},
                         rope_parameters={"rope_theta": 500.0, **ROPE_SCALINGS[scaling]})
    spec = _holds_to(_perturbed(lambda: LlamaForCausalLM(config)), tmp_path / "checkpoint", "llama")
    position = spec_blocks(spec)[0].mixer.position
    assert position.scaling == scaling and position.factor == ROPE_SCALINGS[scaling]["factor"]


@pytest.mark.parametrize("activation", ["gelu_pytorch_tanh", "relu2"])
def test_a_tanh_gelu_or_squared_relu_mlp_imports_logit_equal(tmp_path, activation):
    from attnspec.interop.convert import native_config

    reference = _perturbed(lambda: LlamaForCausalLM(LlamaConfig(**SMALL, hidden_act=activation)))
    spec = _holds_to(reference, tmp_path / "checkpoint", "llama", generate=False)
    assert spec_blocks(spec)[0].mlp.activation == {"gelu_pytorch_tanh": "gelu_tanh", "relu2": "relu2"}[activation]
    assert native_config(spec, "llama")["hidden_act"] == activation


def _qwen3_5(model_type: str):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    shared = dict(**{**SMALL, "num_hidden_layers": 4}, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
                  linear_key_head_dim=8, linear_value_head_dim=6)
    shared.pop("intermediate_size")
    if model_type == "qwen3_5_text":
        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shared, intermediate_size=48))
    return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**shared, num_experts=4, num_experts_per_tok=2,
                                                      moe_intermediate_size=12, shared_expert_intermediate_size=20))


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5_moe_text"])
def test_qwen3_5_text_models_compute_transformers_logits_and_decode_alike(tmp_path, model_type):
    """Qwen3.5's text models (dense, and MoE in every layer): its unpacked Gated DeltaNet projections,
    its multimodal rotary embedding on text positions (plain partial RoPE), in every mode."""
    _holds_to(_perturbed(lambda: _qwen3_5(model_type)), tmp_path / "checkpoint", model_type, EVERY_MODE)


@pytest.mark.parametrize("release", ["qwen3_5", pytest.param("qwen3_5_moe", marks=pytest.mark.slow)])
def test_the_text_model_of_a_multimodal_qwen3_5_imports_logit_equal(tmp_path, release):
    """A Qwen3.5 release (dense or MoE) is its text model inside a vision-language wrapper: the text config
    and the ``model.language_model.`` tensors import; the vision tower's tensors are left unread."""
    import transformers

    moe = "Moe" if release == "qwen3_5_moe" else ""
    text = _qwen3_5(f"{release}_text").config.to_dict()
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=4,
                  temporal_patch_size=1, spatial_merge_size=1)
    config = getattr(transformers, f"Qwen3_5{moe}Config")(text_config=text, vision_config=vision)
    reference = _perturbed(lambda: getattr(transformers, f"Qwen3_5{moe}ForConditionalGeneration")(config))
    spec, model = _text_model_holds_to(reference, tmp_path / "checkpoint", release, f"{release}_text")


def test_gemma_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Gemma 1: norms of 1 + w, embeddings times sqrt(d), a tanh-GeLU GLU, MQA heads wider than d / heads."""
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(**{**SMALL, "num_key_value_heads": 1}, head_dim=16, attention_bias=True)
    _holds_to(_perturbed(lambda: GemmaForCausalLM(config)), tmp_path / "checkpoint", "gemma")


def test_granite_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Granite's four multipliers, none of them 1, on Llama's layers with every bias."""
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(**SMALL, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                           logits_scaling=4.0, attention_bias=True, mlp_bias=True)
    spec = _holds_to(_perturbed(lambda: GraniteForCausalLM(config)), tmp_path / "checkpoint", "granite")
    assert (spec.input.scale, spec.head.scale, spec_blocks(spec)[0].residual_scale) == (3.0, 0.25, 0.5)


@pytest.mark.parametrize("post_norm", [True, False])
def test_hyperclovax_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, post_norm):
    """HyperCLOVA X: Granite's multipliers with logits multiplied (not divided) by logits_scaling, the softmax
    scale head_dim^-1/2 where attention_multiplier is unset, and a norm after each sub-layer (or none)."""
    from transformers import HyperCLOVAXConfig, HyperCLOVAXForCausalLM

    config = HyperCLOVAXConfig(**SMALL, embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=0.25,
                               use_post_norm=post_norm, attention_bias=True, mlp_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: HyperCLOVAXForCausalLM(config)), tmp_path / "checkpoint", "hyperclovax")
    block = spec_blocks(spec)[0]
    assert (spec.head.scale, block.mixer.scale) == (0.25, 8 ** -0.5)
    assert block.norm_placement == ("sandwich" if post_norm else "pre")
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    del fields["attention_multiplier"]  # a released config may leave it out: head_dim^-1/2, as transformers reads it
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps(fields))
    assert spec_from_checkpoint(tmp_path / "checkpoint")[1] == spec


def test_smollm3_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """SmolLM3: every fourth layer without positions (NoPE), that layer windowed (a window shorter than the
    prompt), with every bias."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    config = SmolLM3Config(**{**SMALL, "num_hidden_layers": 4}, use_sliding_window=True, sliding_window=6,
                           attention_bias=True, mlp_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: SmolLM3ForCausalLM(config)), tmp_path / "checkpoint", "smollm3")
    blocks = spec_blocks(spec)
    assert [b.mixer.position.kind for b in blocks] == ["rope", "rope", "rope", "none"]
    assert [getattr(b.mixer, "window", None) for b in blocks] == [None, None, None, 6]


@pytest.mark.parametrize("model_type", ["qwen2_moe", "qwen3_moe"])
def test_qwen_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, model_type):
    """Experts every second layer but a dense first one (`decoder_sparse_step`, `mlp_only_layers`), top-2 of 4
    renormalised, Qwen2-MoE's gated shared expert; windows with `use_sliding_window` (a window shorter than
    the prompt: on Qwen2-MoE's sliding layers, on every Qwen3-MoE layer)."""
    import transformers

    moe = "Qwen2Moe" if model_type == "qwen2_moe" else "Qwen3Moe"
    fields = dict(**{**SMALL, "num_hidden_layers": 4}, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                  decoder_sparse_step=2, mlp_only_layers=[1], norm_topk_prob=True, use_sliding_window=True,
                  sliding_window=6, pad_token_id=0)
    if model_type == "qwen2_moe":
        fields.update(shared_expert_intermediate_size=20, max_window_layers=3)
    config = getattr(transformers, f"{moe}Config")(**fields)
    spec = _holds_to(_perturbed(lambda: getattr(transformers, f"{moe}ForCausalLM")(config)),
                     tmp_path / "checkpoint", model_type)
    blocks = spec_blocks(spec)
    assert [b.mlp.kind for b in blocks] == ["glu", "glu", "glu", "moe"]
    windows = [getattr(b.mixer, "window", None) for b in blocks]
    assert windows == ([6, None, 6, None] if model_type == "qwen2_moe" else [6] * 4)


@pytest.mark.parametrize("window", [None, 6])
def test_mixtral_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, window):
    """Top-2 of 4 experts in every layer, with and without Mistral's window (shorter than the prompt)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=window, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: MixtralForCausalLM(config)), tmp_path / "checkpoint", "mixtral")
    assert [getattr(b.mixer, "window", None) for b in spec_blocks(spec)] == [window, window]


@pytest.mark.parametrize("model_type", ["ministral", "cwm"])
def test_layer_typed_windows_compute_transformers_logits_decode_alike_and_export_as_themselves(tmp_path, model_type):
    """Ministral's and CWM's windows (shorter than the prompt) on the layers `layer_types` names; CWM's MLP
    biases and its llama3-scaled RoPE."""
    import transformers

    name = {"ministral": "Ministral", "cwm": "Cwm"}[model_type]  # (Ministral leaves head_dim None: transformers fails)
    fields = dict(**{**SMALL, "num_hidden_layers": 3}, sliding_window=6, pad_token_id=0, head_dim=8,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    if model_type == "cwm":
        fields.update(mlp_bias=True)
    config = getattr(transformers, f"{name}Config")(**fields)
    spec = _holds_to(_perturbed(lambda: getattr(transformers, f"{name}ForCausalLM")(config)),
                     tmp_path / "checkpoint", model_type)
    assert [getattr(b.mixer, "window", None) for b in spec_blocks(spec)] == [6, None, 6]


def test_arcee_and_seed_oss_compute_transformers_logits_decode_alike_and_export_as_themselves(tmp_path):
    """Arcee's plain squared-ReLU MLP with biases; Seed-OSS's q/k/v biases without the output's, MLP biases."""
    from transformers import ArceeConfig, ArceeForCausalLM, SeedOssConfig, SeedOssForCausalLM

    arcee = ArceeConfig(**SMALL, mlp_bias=True, attention_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: ArceeForCausalLM(arcee)), tmp_path / "arcee", "arcee")
    assert (spec_blocks(spec)[0].mlp.kind, spec_blocks(spec)[0].mlp.activation) == ("mlp", "relu2")
    seed = SeedOssConfig(**SMALL, attention_bias=True, attention_out_bias=False, mlp_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: SeedOssForCausalLM(seed)), tmp_path / "seed_oss", "seed_oss")
    assert (spec_blocks(spec)[0].mixer.qkv_bias, spec_blocks(spec)[0].mixer.out_bias) == (True, False)


def test_helium_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Helium: RoPE on interleaved pairs, q/k/v biases without the output's, MLP biases; a head width whose
    heads are not the model's width is refused by its field (transformers' output projection could not take it)."""
    from transformers import HeliumConfig, HeliumForCausalLM

    config = HeliumConfig(**SMALL, head_dim=8, attention_bias=True, mlp_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: HeliumForCausalLM(config)), tmp_path / "checkpoint", "helium")
    mixer = spec_blocks(spec)[0].mixer
    assert (mixer.position.interleaved, mixer.qkv_bias, mixer.out_bias) == (True, True, False)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "head_dim": 12}))
    with pytest.raises(InteropError, match="head_dim"):
        spec_from_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("bias", [False, True])
def test_ernie4_5_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, bias):
    """ERNIE 4.5 (dense): RoPE on interleaved pairs, one `use_bias` for every projection."""
    from transformers import Ernie4_5Config, Ernie4_5ForCausalLM

    config = Ernie4_5Config(**SMALL, head_dim=8, use_bias=bias, tie_word_embeddings=False)
    spec = _holds_to(_perturbed(lambda: Ernie4_5ForCausalLM(config)), tmp_path / "checkpoint", "ernie4_5")
    block = spec_blocks(spec)[0]
    assert (block.mixer.position.interleaved, block.mixer.out_bias, block.mlp.bias) == (True, bias, bias)


def test_ernie4_5_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """ERNIE 4.5 MoE: a dense first layer, then every second layer from the second with experts chosen by softmax
    scores plus a correction bias (large enough to change the choice), renormalised, beside a shared expert."""
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    config = Ernie4_5_MoeConfig(**{**SMALL, "num_hidden_layers": 4}, head_dim=8, moe_intermediate_size=16,
                                moe_num_experts=4, moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=1,
                                moe_layer_interval=2, tie_word_embeddings=False)
    reference = _perturbed(lambda: Ernie4_5_MoeForCausalLM(config))
    with torch.no_grad():
        for layer in (reference.model.layers[1], reference.model.layers[3]):
            layer.mlp.gate.moe_statics.e_score_correction_bias.copy_(torch.randn(1, 4))
    spec = _holds_to(reference, tmp_path / "checkpoint", "ernie4_5_moe")
    assert [block.mlp.kind for block in spec_blocks(spec)] == ["glu", "moe", "glu", "moe"]


@pytest.mark.parametrize("window", [None, 6])
def test_phi3_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, window):
    """Phi-3's packed q/k/v and gate/up, partial RoPE (half the head), GQA, with and without its window."""
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(**SMALL, partial_rotary_factor=0.5, sliding_window=window, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: Phi3ForCausalLM(config)), tmp_path / "checkpoint", "phi3")
    assert spec_blocks(spec)[0].mixer.position.rotary_fraction == 0.5


@pytest.mark.parametrize("model_type", ["granitemoe", "granitemoeshared"])
def test_granite_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, model_type):
    """Granite's multipliers with top-2 of 4 fused experts in every layer, and the shared MLP beside them."""
    import transformers

    name = {"granitemoe": "GraniteMoe", "granitemoeshared": "GraniteMoeShared"}[model_type]
    fields = dict(**SMALL, num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=3.0,
                  residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0, pad_token_id=0)
    if model_type == "granitemoeshared":
        fields.update(shared_intermediate_size=20)
    config = getattr(transformers, f"{name}Config")(**fields)
    spec = _holds_to(_perturbed(lambda: getattr(transformers, f"{name}ForCausalLM")(config)),
                     tmp_path / "checkpoint", model_type)
    assert spec_blocks(spec)[0].mlp.shared == (model_type == "granitemoeshared")


def test_olmoe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """OLMoE: QK-norm over whole projections (GQA), top-2 of 4 renormalised experts in every layer."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: OlmoeForCausalLM(config)), tmp_path / "checkpoint", "olmoe")
    assert spec_blocks(spec)[0].mixer.qk_norm == "rmsnorm_full"


@pytest.mark.parametrize("model_type", ["glm", "glm4"])
def test_glm_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, model_type):
    """GLM: q/k/v biases, interleaved RoPE on half of each head, a packed gate/up; GLM-4's sandwich norms."""
    import transformers

    name = {"glm": "Glm", "glm4": "Glm4"}[model_type]
    config = getattr(transformers, f"{name}Config")(**SMALL, head_dim=8, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: getattr(transformers, f"{name}ForCausalLM")(config)),
                     tmp_path / "checkpoint", model_type)
    position = spec_blocks(spec)[0].mixer.position
    assert (position.interleaved, position.rotary_fraction) == (True, 0.5)


@pytest.mark.parametrize("window", [None, 6])
def test_starcoder2_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, window):
    """StarCoder2: biased LayerNorms (an eps of its own, large enough to move the logits), projections and
    plain tanh-GeLU MLP, GQA, with and without its window."""
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    config = Starcoder2Config(**SMALL, sliding_window=window, norm_epsilon=0.01, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: Starcoder2ForCausalLM(config)), tmp_path / "checkpoint", "starcoder2")
    norm = spec_blocks(spec)[0].norm
    assert (norm.kind, norm.eps, spec_blocks(spec)[0].mlp.kind) == ("layernorm", 0.01, "mlp")


def test_jais2_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Jais 2: biased attention and plain squared-ReLU MLP under biased LayerNorms of its own eps."""
    from transformers import Jais2Config, Jais2ForCausalLM

    config = Jais2Config(**SMALL, layer_norm_eps=0.01, attention_bias=True, mlp_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: Jais2ForCausalLM(config)), tmp_path / "checkpoint", "jais2")
    block = spec_blocks(spec)[0]
    assert (block.norm.kind, block.norm.eps, block.mlp.kind, block.mlp.activation) == ("layernorm", 0.01, "mlp",
                                                                                      "relu2")


@pytest.mark.parametrize("variant", ["plain", "by_layer", "unscaled", "gpt-sw3"])
def test_gpt2_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, variant):
    """GPT-2: learned positions, packed q/k/v and Conv1D (transposed) weights, biased LayerNorms of their own eps,
    a plain MLP; the softmax scale divided by the layer's number, or 1 (without scale_attn_weights); untied."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, n_inner=48,
                        layer_norm_epsilon=0.01, activation_function="gelu_new", tie_word_embeddings=variant != "plain",
                        scale_attn_by_inverse_layer_idx=variant == "by_layer", scale_attn_weights=variant != "unscaled")
    model_type = "gpt-sw3" if variant == "gpt-sw3" else "gpt2"  # GPT-SW3's config class is GPT2Config
    spec = _holds_to(_perturbed(lambda: GPT2LMHeadModel(config)), tmp_path / "checkpoint", model_type)
    scales = [block.mixer.scale for block in spec_blocks(spec)]
    assert scales == {"by_layer": [8 ** -0.5 / n for n in (1, 2, 3)], "unscaled": [1.0] * 3}.get(variant, [8 ** -0.5] * 3)
    assert (spec.position.kind, spec.head.tied, spec_blocks(spec)[0].mlp.activation) == ("learned", variant != "plain",
                                                                                         "gelu_tanh")


@pytest.mark.parametrize("multi_query", [True, False])
def test_gpt_bigcode_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, multi_query):
    """GPTBigCode: GPT-2's model with linear projections, one key/value head (multi-query) or each head's q, k
    and v packed in turn."""
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    config = GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=48,
                              layer_norm_epsilon=0.01, multi_query=multi_query)
    spec = _holds_to(_perturbed(lambda: GPTBigCodeForCausalLM(config)), tmp_path / "checkpoint", "gpt_bigcode")
    assert spec_blocks(spec)[0].mixer.kv_heads == (1 if multi_query else None)


@pytest.mark.parametrize("afn", ["gelu", "relu"])
def test_openai_gpt_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, afn):
    """GPT (2018): GPT-2's layers with post-sum LayerNorms (no final norm) and its own names for the tables;
    its `gelu` is the tanh approximation."""
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    config = OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, afn=afn,
                             layer_norm_epsilon=0.01)
    spec = _holds_to(_perturbed(lambda: OpenAIGPTLMHeadModel(config)), tmp_path / "checkpoint", "openai-gpt")
    block = spec_blocks(spec)[0]
    assert (block.norm_placement, spec.final_norm.kind, block.mlp.activation) == (
        "post", "none", {"gelu": "gelu_tanh", "relu": "relu"}[afn])


@pytest.mark.parametrize("scale", [None, 0.2])
def test_mpt_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, scale):
    """MPT: ALiBi attention without biases (its own softmax scale, or head_dim^-1/2), an exact-GeLU MLP 4 times
    as wide, LayerNorms without biases; attention parts attnspec lacks are refused by their fields."""
    from transformers import MptConfig, MptForCausalLM

    config = MptConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, layer_norm_epsilon=0.01,
                       attn_config={"softmax_scale": scale})
    spec = _holds_to(_perturbed(lambda: MptForCausalLM(config)), tmp_path / "checkpoint", "mpt")
    block = spec_blocks(spec)[0]
    assert (block.mixer.position.kind, block.mlp.hidden, block.norm.bias) == ("alibi", 128, False)
    assert block.mixer.scale in (scale, None if scale else 8 ** -0.5)  # transformers writes the default it took
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    for attention in ({"clip_qkv": 8.0}, {"qk_ln": True}, {"alibi_bias_max": 16}):
        (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "attn_config": attention}))
        with pytest.raises(InteropError, match=next(iter(attention))):
            spec_from_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("thetas", [None, [0.0, 5000.0, 10000.0, 0.0, 20000.0]])
def test_granite_swa_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, thetas):
    """Granite SWA: attention sinks in every layer (perturbed, so they matter), a window on the sliding layers
    (three in four by default), each layer's RoPE base or none (``layer_rope_theta`` 0), Granite's multipliers."""
    from transformers import GraniteSWAConfig, GraniteSWAForCausalLM

    config = GraniteSWAConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=3,
                              embedding_multiplier=2.0, attention_multiplier=0.3, residual_multiplier=0.7,
                              logits_scaling=1.5, layer_rope_theta=thetas)
    spec = _holds_to(_perturbed(lambda: GraniteSWAForCausalLM(config)), tmp_path / "checkpoint", "granite_swa")
    mixers = [block.mixer for block in spec_blocks(spec)]
    assert all(m.sinks for m in mixers) and [m.window for m in mixers] == [None, 3, 3, 3, None]
    if thetas:
        assert [m.position.kind for m in mixers] == ["none", "rope", "rope", "none", "rope"]


@pytest.mark.parametrize("shared", [0, 40])
def test_granitemoe_swa_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, shared):
    """Granite MoE SWA: granite_swa's attention with granitemoe's experts, a shared MLP where its width is set."""
    from transformers import GraniteMoeSWAConfig, GraniteMoeSWAForCausalLM

    config = GraniteMoeSWAConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 sliding_window=3, num_local_experts=4, num_experts_per_tok=2,
                                 shared_intermediate_size=shared, residual_multiplier=0.7,
                                 layer_rope_theta=[10000.0, 0.0, 5000.0, 10000.0])
    spec = _holds_to(_perturbed(lambda: GraniteMoeSWAForCausalLM(config)), tmp_path / "checkpoint", "granitemoe_swa")
    block = spec_blocks(spec)[1]
    assert block.mixer.sinks and block.mixer.window == 3 and block.mixer.position.kind == "none"
    assert block.mlp.kind == "moe" and bool(block.mlp.shared) == bool(shared)


def test_mellum_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Mellum: Qwen3's attention with windows and RoPE per layer type, experts or a dense GLU per layer."""
    from transformers import MellumConfig, MellumForCausalLM

    config = MellumConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                          sliding_window=3, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                          mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    spec = _holds_to(_perturbed(lambda: MellumForCausalLM(config)), tmp_path / "checkpoint", "mellum")
    blocks = spec_blocks(spec)
    assert [b.mixer.window for b in blocks] == [3, None, 3, None] and [b.mlp.kind for b in blocks][:2] == ["glu", "moe"]
    assert {b.mixer.position.base for b in blocks} == {10000.0, 500000.0}


@pytest.mark.parametrize("post", [False, True])
def test_bloom_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, post):
    """BLOOM: an embedding LayerNorm (``input.norm``), ALiBi attention with biases and per-head packed q/k/v, a
    4x tanh-GeLU MLP; ``apply_residual_connection_post_layernorm`` as ``normed_residual``. A head count that is
    not a power of two is refused by its field."""
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, layer_norm_epsilon=0.01,
                         apply_residual_connection_post_layernorm=post)
    spec = _holds_to(_perturbed(lambda: BloomForCausalLM(config)), tmp_path / "checkpoint", "bloom")
    block = spec_blocks(spec)[0]
    assert (block.mixer.position.kind, spec.input.norm.kind, block.mlp.activation) == ("alibi", "layernorm", "gelu_tanh")
    assert block.norm_placement == ("normed_residual" if post else "pre")
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "n_head": 3, "hidden_size": 6}))
    with pytest.raises(InteropError, match="n_head"):
        spec_from_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("parallel", [True, False])
def test_gpt_neox_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, parallel):
    """GPT-NeoX (Pythia): per-head packed q/k/v, RoPE on a quarter of each head, biased LayerNorms of their own
    eps, attention and MLP side by side on their own norms (use_parallel_residual) or one after the other."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(**{**SMALL, "num_key_value_heads": None}, use_parallel_residual=parallel,
                           layer_norm_eps=0.01, rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                                                 "partial_rotary_factor": 0.25})
    spec = _holds_to(_perturbed(lambda: GPTNeoXForCausalLM(config)), tmp_path / "checkpoint", "gpt_neox")
    block = spec_blocks(spec)[0]
    assert (block.parallel, block.mixer.position.rotary_fraction) == ("own_norms" if parallel else "none", 0.25)


@pytest.mark.parametrize("model_type, rotary_dim", [("gptj", 4), ("gptj", 8), ("codegen", 4)])
def test_gptj_and_codegen_compute_transformers_logits_decode_alike_and_export_as_themselves(tmp_path, model_type,
                                                                                          rotary_dim):
    """GPT-J: bias-free attention with RoPE on interleaved pairs of the first rotary_dim channels (or all), side
    by side with a plain MLP on one LayerNorm, a head with a bias; CodeGen: its q/k/v fused and packed by shard."""
    import transformers

    name = {"gptj": "GPTJ", "codegen": "CodeGen"}[model_type]
    config = getattr(transformers, f"{name}Config")(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                    n_inner=48, rotary_dim=rotary_dim, layer_norm_epsilon=0.01)
    model = getattr(transformers, f"{name}ForCausalLM")
    spec = _holds_to(_perturbed(lambda: model(config)), tmp_path / "checkpoint", model_type)
    position = spec_blocks(spec)[0].mixer.position
    assert (position.interleaved, position.rotary_width(8), spec.head.bias) == (True, rotary_dim, True)


def test_cohere_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Command R: attention with interleaved RoPE and a GLU side by side on one bias-free LayerNorm, the logits
    scaled by logit_scale from a tied head; LayerNorms of q and k are refused by their field."""
    from transformers import CohereConfig, CohereForCausalLM

    config = CohereConfig(**SMALL, layer_norm_eps=0.01, logit_scale=0.5, attention_bias=True)
    spec = _holds_to(_perturbed(lambda: CohereForCausalLM(config)), tmp_path / "checkpoint", "cohere")
    block = spec_blocks(spec)[0]
    assert (block.parallel, block.norm.bias, spec.head.scale, spec.head.tied) == ("shared_norm", False, 0.5, True)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "use_qk_norm": True}))
    with pytest.raises(InteropError, match="use_qk_norm"):
        spec_from_checkpoint(tmp_path / "checkpoint")


def test_gpt_neo_alternates_global_and_local_attention_of_unscaled_scores(tmp_path):
    """GPT-Neo: learned positions, unscaled scores, bias-free q/k/v with a biased output, local layers with a
    window (4, shorter than the prompts) by attention_types, a biased MLP under LayerNorms, a tied head."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    config = GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
                          max_position_embeddings=64, window_size=4, layer_norm_epsilon=0.01,
                          attention_types=[[["global", "local", "local"], 1]])
    spec = _holds_to(_perturbed(lambda: GPTNeoForCausalLM(config)), tmp_path / "checkpoint", "gpt_neo")
    blocks = spec_blocks(spec)
    assert [block.mixer.window for block in blocks] == [None, 4, 4] and {b.mixer.scale for b in blocks} == {1.0}
    assert spec.position.kind == "learned" and spec.head.tied


@pytest.mark.parametrize("before", [True, False])
def test_opt_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, before):
    """OPT: a learned position table after two unused rows, biased attention and a ReLU MLP under
    LayerNorms before each sub-layer with a final one, or after each residual sum without (OPT-350M's
    placement); projections around the layers (word_embed_proj_dim) are refused by their field."""
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=64, word_embed_proj_dim=32, do_layer_norm_before=before,
                       pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: OPTForCausalLM(config)), tmp_path / "checkpoint", "opt")
    block = spec_blocks(spec)[0]
    assert (block.norm_placement, spec.final_norm.kind) == (("pre", "layernorm") if before else ("post", "none"))
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "word_embed_proj_dim": 16}))
    with pytest.raises(InteropError, match="word_embed_proj_dim"):
        spec_from_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("scaled", [True, False])
def test_biogpt_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, scaled):
    """BioGPT: OPT's pre-norm layers and offset position table, GeLU, embeddings times sqrt(d) with
    scale_embedding, its tied head named output_projection."""
    from transformers import BioGptConfig, BioGptForCausalLM

    config = BioGptConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=64, layer_norm_eps=0.01, scale_embedding=scaled,
                          pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: BioGptForCausalLM(config)), tmp_path / "checkpoint", "biogpt")
    assert spec.input.scale == (32 ** 0.5 if scaled else 1.0)
    assert spec_blocks(spec)[0].norm.eps == 1e-5  # transformers' BioGPT never reads layer_norm_eps (0.01 here)


def test_cohere2_windows_its_rope_layers_and_leaves_its_global_layers_without_positions(tmp_path):
    """Command R7B: Command R's parallel blocks, windowed layers (window 5, shorter than the prompts) with
    interleaved RoPE and global layers without positions, by layer_types; a global layer first."""
    from transformers import Cohere2Config, Cohere2ForCausalLM

    config = Cohere2Config(**{**SMALL, "num_hidden_layers": 3}, layer_norm_eps=0.01, logit_scale=0.5,
                           sliding_window=5, layer_types=["full_attention", "sliding_attention", "sliding_attention"])
    spec = _holds_to(_perturbed(lambda: Cohere2ForCausalLM(config)), tmp_path / "checkpoint", "cohere2")
    blocks = spec_blocks(spec)
    assert [block.mixer.window for block in blocks] == [None, 5, 5]
    assert [block.mixer.position.kind for block in blocks] == ["none", "rope", "rope"]
    assert {block.parallel for block in blocks} == {"shared_norm"} and blocks[1].mixer.position.interleaved


@pytest.mark.parametrize("parallel", [False, True])
def test_stablelm_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, parallel):
    """StableLM: q/k/v biases, RoPE on a quarter of each head (its default), GQA, biased LayerNorms, with
    attention and MLP one after the other or side by side on one norm."""
    from transformers import StableLmConfig, StableLmForCausalLM

    config = StableLmConfig(**SMALL, layer_norm_eps=0.01, use_qkv_bias=True, use_parallel_residual=parallel)
    spec = _holds_to(_perturbed(lambda: StableLmForCausalLM(config)), tmp_path / "checkpoint", "stablelm")
    block = spec_blocks(spec)[0]
    assert (block.parallel, block.mixer.position.rotary_fraction, block.mixer.qkv_bias, block.mixer.out_bias) == (
        "shared_norm" if parallel else "none", 0.25, True, False)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    del fields["rope_parameters"]["partial_rotary_factor"]  # unstated: its config class's default, a quarter
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps(fields))
    assert spec_from_checkpoint(tmp_path / "checkpoint")[1] == spec


def test_nemotron_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Nemotron: partial RoPE (half, its default), GQA, every bias, a squared-ReLU plain MLP under LayerNorms
    whose stored weight is the weight minus 1."""
    from transformers import NemotronConfig, NemotronForCausalLM

    config = NemotronConfig(**SMALL, norm_eps=0.01, attention_bias=True, mlp_bias=True)
    spec = _holds_to(_perturbed(lambda: NemotronForCausalLM(config)), tmp_path / "checkpoint", "nemotron")
    block = spec_blocks(spec)[0]
    assert (block.mixer.position.rotary_fraction, block.mlp.activation, block.norm.kind) == (0.5, "relu2", "layernorm")


def test_dots1_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """dots.llm1: Qwen3's attention (QK-norm, GQA, a windowed layer) with a dense first layer, then DeepSeek-V3's
    experts (sigmoid with a correction bias, two groups, renormalised, scaled) beside a shared expert."""
    from transformers import Dots1Config, Dots1ForCausalLM

    config = Dots1Config(**{**SMALL, "num_hidden_layers": 3}, moe_intermediate_size=16, n_routed_experts=4,
                         num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                         norm_topk_prob=True, routed_scaling_factor=2.0, sliding_window=6,
                         layer_types=["full_attention", "sliding_attention", "full_attention"], pad_token_id=0)
    reference = _perturbed(lambda: Dots1ForCausalLM(config))
    with torch.no_grad():  # a correction bias large enough to change the choice
        for layer in reference.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4))
    spec = _holds_to(reference, tmp_path / "checkpoint", "dots1")
    blocks = spec_blocks(spec)
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "moe"]
    assert [getattr(b.mixer, "window", None) for b in blocks] == [None, 6, None]


def test_solar_open_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Solar Open: q/k/v biases without the output's, DeepSeek-V3's experts (sigmoid with a correction bias,
    renormalised, scaled) beside a shared expert in every layer."""
    from transformers import SolarOpenConfig, SolarOpenForCausalLM

    config = SolarOpenConfig(**{k: v for k, v in SMALL.items() if k != "intermediate_size"}, head_dim=8,
                             moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                             routed_scaling_factor=2.0, attention_bias=True, pad_token_id=0)
    reference = _perturbed(lambda: SolarOpenForCausalLM(config))
    with torch.no_grad():  # a correction bias large enough to change the choice
        for layer in reference.model.layers:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4))
    spec = _holds_to(reference, tmp_path / "checkpoint", "solar_open")
    assert [block.mlp.kind for block in spec_blocks(spec)] == ["moe", "moe"]


@pytest.mark.parametrize("qk_norm", [True, False])
def test_glm4_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, qk_norm):
    """GLM-4.5: q/k/v biases, QK-norm or not, RoPE on half of each head, a dense first layer, then DeepSeek-V3's
    experts (sigmoid with a correction bias, renormalised, scaled) beside a shared expert."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    config = Glm4MoeConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=8, moe_intermediate_size=16,
                           n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                           routed_scaling_factor=2.0, attention_bias=True, use_qk_norm=qk_norm, pad_token_id=0)
    reference = _perturbed(lambda: Glm4MoeForCausalLM(config))
    with torch.no_grad():  # a correction bias large enough to change the choice
        for layer in reference.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4))
    spec = _holds_to(reference, tmp_path / "checkpoint", "glm4_moe")
    mixer = spec_blocks(spec)[0].mixer
    assert (mixer.qk_norm, mixer.position.rotary_fraction, mixer.out_bias) == ("rmsnorm" if qk_norm else "none", 0.5,
                                                                              False)


def test_sarvam_moe_is_glm4_moe_with_whole_head_rope_and_qk_norm_and_exports_as_itself(tmp_path):
    """Sarvam-30B: transformers runs GLM-4.5's model for its config class, whose RoPE turns the whole head and
    whose QK-norm is on by default; the released config names the q/k/v biases `use_qkv_bias`."""
    from transformers import Glm4MoeForCausalLM, SarvamMoEConfig

    config = SarvamMoEConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=8, moe_intermediate_size=16,
                             n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                             routed_scaling_factor=2.0, attention_bias=True, pad_token_id=0)
    reference = _perturbed(lambda: Glm4MoeForCausalLM(config))
    with torch.no_grad():
        for layer in reference.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4))
    spec = _holds_to(reference, tmp_path / "checkpoint", "sarvam_moe")
    mixer = spec_blocks(spec)[0].mixer
    assert (mixer.qk_norm, mixer.position.rotary_fraction, mixer.qkv_bias) == ("rmsnorm", 1.0, True)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    released = {k: v for k, v in fields.items() if k not in ("attention_bias", "use_qk_norm", "partial_rotary_factor")}
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**released, "use_qkv_bias": True}))
    imported = spec_blocks(spec_from_checkpoint(tmp_path / "checkpoint")[1])[0].mixer
    assert (imported.qk_norm, imported.position.rotary_fraction, imported.qkv_bias) == ("rmsnorm", 1.0, True)


def test_minimax_m2_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """MiniMax-M2: QK-norm over whole projections, RoPE on half of each head, and experts routed by sigmoid
    scores whose correction bias (the block's buffer, large enough to change the choice) picks the top 2 of 4,
    renormalised; its released configs' `rotary_dim` states the partial RoPE."""
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    config = MiniMaxM2Config(**SMALL, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                              "partial_rotary_factor": 0.5}, pad_token_id=0)
    reference = _perturbed(lambda: MiniMaxM2ForCausalLM(config))
    with torch.no_grad():
        for layer in reference.model.layers:
            layer.mlp.e_score_correction_bias.copy_(torch.tensor([0.3, -0.4, 0.0, 0.2]))
    spec = _holds_to(reference, tmp_path / "checkpoint", "minimax_m2")
    block = spec_blocks(spec)[0]
    assert (block.mixer.qk_norm, block.mixer.position.rotary_fraction) == ("rmsnorm_full", 0.5)
    assert (block.mlp.scoring, block.mlp.score_bias, block.mlp.normalize) == ("sigmoid", True, True)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    rope = {k: v for k, v in fields["rope_parameters"].items() if k != "partial_rotary_factor"}
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "rope_parameters": rope,
                                                                     "rotary_dim": 4}))
    assert spec_blocks(spec_from_checkpoint(tmp_path / "checkpoint")[1])[0].mixer.position.rotary_fraction == 0.5


@pytest.mark.parametrize("pattern", [2, 4])
def test_exaone_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, pattern):
    """K-EXAONE: EXAONE 4.0's per-head QK-norm attention (windowed RoPE layers, every `pattern`-th layer global
    and without positions) in pre-norm blocks, a dense first layer, then DeepSeek-V3's experts (a correction
    bias large enough to change the choice, renormalised, scaled) beside a shared expert."""
    from transformers import ExaoneMoeConfig, ExaoneMoeForCausalLM

    config = ExaoneMoeConfig(**{**SMALL, "num_hidden_layers": 4}, head_dim=8, moe_intermediate_size=16, num_experts=4,
                             num_experts_per_tok=2, num_shared_experts=1, sliding_window=6,
                             sliding_window_pattern=pattern, pad_token_id=0,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    reference = _perturbed(lambda: ExaoneMoeForCausalLM(config))
    with torch.no_grad():
        for layer in reference.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4))
    spec = _holds_to(reference, tmp_path / "checkpoint", "exaone_moe")
    blocks = spec_blocks(spec)
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "moe", "moe"]
    assert {b.norm_placement for b in blocks} == {"pre"} and blocks[0].mixer.qk_norm == "rmsnorm"
    expected = ["rope", "none", "rope", "none"] if pattern == 2 else ["rope", "rope", "rope", "none"]
    assert [b.mixer.position.kind for b in blocks] == expected


@pytest.mark.parametrize("expert_bias", [True, False])
def test_lfm2_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, expert_bias):
    """LFM2-MoE: gated convolutions and QK-normed attention, a dense first layer, then top-2 of 4 experts by
    sigmoid scores (with and without the block's expert bias, large enough to change the choice), renormalised
    and scaled."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    config = Lfm2MoeConfig(**{**SMALL, "num_hidden_layers": 3}, moe_intermediate_size=16, num_experts=4,
                           num_experts_per_tok=2, num_dense_layers=1, use_expert_bias=expert_bias,
                           routed_scaling_factor=1.5, layer_types=["conv", "full_attention", "conv"], pad_token_id=0)
    reference = _perturbed(lambda: Lfm2MoeForCausalLM(config))
    if expert_bias:
        with torch.no_grad():
            for layer in reference.model.layers[1:]:
                layer.feed_forward.expert_bias.copy_(torch.tensor([0.3, -0.4, 0.0, 0.2]))
    spec = _holds_to(reference, tmp_path / "checkpoint", "lfm2_moe")
    blocks = spec_blocks(spec)
    assert [(b.mixer.kind, b.mlp.kind) for b in blocks] == [("gated_conv", "glu"), ("softmax", "moe"),
                                                            ("gated_conv", "moe")]
    assert (blocks[1].mlp.score_bias, blocks[1].mlp.routed_scale) == (expert_bias, 1.5)


@pytest.mark.parametrize("layout", [
    dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=2),  # Falcon-40B/180B
    dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),  # Falcon 2/3
    dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True),  # Falcon-7B
    dict(new_decoder_architecture=False, multi_query=False, parallel_attn=False, bias=True),
])
def test_falcon_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, layout):
    """Falcon in its layouts: q/k/v packed per key/value group, multi-query, or per head; attention and MLP side
    by side on two norms, on one, or one after the other; biases with `bias`. ALiBi (Falcon-RW) is refused by
    its field."""
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          max_position_embeddings=64, ffn_hidden_size=48, pad_token_id=0,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, **layout)
    spec = _holds_to(_perturbed(lambda: FalconForCausalLM(config)), tmp_path / "checkpoint", "falcon")
    block = spec_blocks(spec)[0]
    expected = "own_norms" if layout.get("num_ln_in_parallel_attn") == 2 else \
        "shared_norm" if layout.get("new_decoder_architecture") or layout.get("parallel_attn") else "none"
    assert block.parallel == expected and block.mixer.kv_heads == {True: 2, False: 1 if layout.get("multi_query")
                                                                   else None}[layout["new_decoder_architecture"]]
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "alibi": True}))
    with pytest.raises(InteropError, match="alibi"):
        spec_from_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("scaled", [True, False])
def test_xglm_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, scaled):
    """XGLM: embeddings times sqrt(d) (or not, `scale_embedding`) plus tensor2tensor's sinusoids (frequencies
    10000^(-i/(d/2 - 1))) from position 2, pre-norm biased attention and MLP under biased LayerNorms, a tied
    head; cross-attention is refused by its field."""
    from transformers import XGLMConfig, XGLMForCausalLM

    config = XGLMConfig(vocab_size=VOCAB, d_model=32, ffn_dim=48, num_layers=2, attention_heads=4,
                        max_position_embeddings=64, scale_embedding=scaled, activation_function="gelu")
    spec = _holds_to(_perturbed(lambda: XGLMForCausalLM(config)), tmp_path / "checkpoint", "xglm")
    assert (spec.position.kind, spec.position.spacing, spec.position.offset) == ("sinusoidal", "half_minus_one", 2)
    assert spec.input.scale == (32 ** 0.5 if scaled else 1.0) and spec.head.tied
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "add_cross_attention": True}))
    with pytest.raises(InteropError, match="add_cross_attention"):
        spec_from_checkpoint(tmp_path / "checkpoint")


def test_flex_olmo_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """FlexOlmo: OLMo 2's placement and whole-projection QK-norm with top-2 of 4 softmax-routed experts,
    renormalised, in every layer."""
    from transformers import FlexOlmoConfig, FlexOlmoForCausalLM

    config = FlexOlmoConfig(**SMALL, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, attention_bias=True,
                            pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: FlexOlmoForCausalLM(config)), tmp_path / "checkpoint", "flex_olmo")
    block = spec_blocks(spec)[0]
    assert (block.norm_placement, block.mixer.qk_norm, block.mlp.kind, block.mlp.normalize) == (
        "output", "rmsnorm_full", "moe", True)


def test_phi_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Phi (1, 1.5, 2): GQA attention with partial RoPE and a plain MLP side by side on one LayerNorm, a head
    with a bias; LayerNorms on q and k, and a tied head, are refused by their fields."""
    from transformers import PhiConfig, PhiForCausalLM

    config = PhiConfig(**SMALL, layer_norm_eps=0.01, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: PhiForCausalLM(config)), tmp_path / "checkpoint", "phi")
    block = spec_blocks(spec)[0]
    assert (block.parallel, block.mixer.kv_heads, block.mixer.position.rotary_fraction, spec.head.bias) == (
        "shared_norm", 2, 0.5, True)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    for field in ("qk_layernorm", "tie_word_embeddings"):
        (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, field: True}))
        with pytest.raises(InteropError, match=field):
            spec_from_checkpoint(tmp_path / "checkpoint")


def test_olmo_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """OLMo 1: Llama's layers with every bias under LayerNorms without weights or biases; clip_qkv is refused."""
    from transformers import OlmoConfig, OlmoForCausalLM

    config = OlmoConfig(**SMALL, attention_bias=True, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: OlmoForCausalLM(config)), tmp_path / "checkpoint", "olmo")
    assert (spec.final_norm.kind, spec.final_norm.affine, spec_blocks(spec)[0].mixer.out_bias) == ("layernorm", False,
                                                                                                 True)
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "clip_qkv": 8.0}))
    with pytest.raises(InteropError, match="clip_qkv"):
        spec_from_checkpoint(tmp_path / "checkpoint")


@pytest.mark.parametrize("window", [6, None])
def test_exaone4_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, window):
    """EXAONE 4.0: OLMo 2's placement, QK-norm per head; windowed RoPE layers (a window shorter than the prompt)
    and a global layer without positions by its pattern, or RoPE everywhere without windows."""
    from transformers import Exaone4Config, Exaone4ForCausalLM

    # (without a window, transformers' config class needs the layer types given: its default divides by 0)
    types = {} if window else {"layer_types": ["full_attention"] * 3}
    config = Exaone4Config(**{**SMALL, "num_hidden_layers": 3}, head_dim=12, sliding_window=window,
                           sliding_window_pattern=3 if window else None, pad_token_id=0, **types)
    spec = _holds_to(_perturbed(lambda: Exaone4ForCausalLM(config)), tmp_path / "checkpoint", "exaone4")
    mixers = [block.mixer for block in spec_blocks(spec)]
    assert [getattr(m, "window", None) for m in mixers] == ([6, 6, None] if window else [None] * 3)
    assert [m.position.kind for m in mixers] == (["rope", "rope", "none"] if window else ["rope"] * 3)


@pytest.mark.parametrize("model_type", ["olmo2", "olmo3"])
def test_olmo2_and_olmo3_compute_transformers_logits_decode_alike_and_export_as_themselves(tmp_path, model_type):
    """OLMo 2's placement (x + norm(f(x))) with QK-norm over whole projections, GQA and biases; OLMo 3's
    windowed layers (a window shorter than the prompt) with RoPE parameters of their own."""
    import transformers

    fields = dict(**SMALL, attention_bias=True)
    if model_type == "olmo3":
        fields.update(num_hidden_layers=3, sliding_window=6, layer_types=["sliding_attention", "full_attention",
                                                                          "sliding_attention"],
                      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                       "full_attention": {"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0}})
    config = getattr(transformers, f"{model_type.capitalize()}Config")(**fields)
    reference = _perturbed(lambda: getattr(transformers, f"{model_type.capitalize()}ForCausalLM")(config))
    spec = _holds_to(reference, tmp_path / "checkpoint", model_type)
    windows = [getattr(block.mixer, "window", None) for block in spec_blocks(spec)]
    assert windows == ([None, None] if model_type == "olmo2" else [6, None, 6])


@pytest.mark.parametrize("model_type", ["internlm3", "iquestcoder", "exaone"])
def test_llama_under_another_name_imports_as_llama_and_exports_as_itself(tmp_path, model_type):
    """Types transformers runs with LlamaForCausalLM itself, from their own config classes (biases on).
    EXAONE 3's checkpoints store GPT-2-like names (transformers renames them on load, back on save), and its
    released config.json names its fields as its remote code did: both read as transformers reads them."""
    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **SMALL, attention_bias=True, mlp_bias=True)
    assert config.model_type == model_type
    spec = _holds_to(_perturbed(lambda: LlamaForCausalLM(config)), tmp_path / "checkpoint", model_type)
    if model_type == "exaone":
        with safe_open(tmp_path / "checkpoint" / "model.safetensors", "pt") as stored:
            assert "transformer.h.0.attn.attention.out_proj.weight" in stored.keys()
        path = tmp_path / "checkpoint" / "config.json"
        fields = json.loads(path.read_text())
        for released, field in (("num_layers", "num_hidden_layers"), ("layer_norm_epsilon", "rms_norm_eps"),
                                ("activation_function", "hidden_act")):
            fields[released] = fields.pop(field)
        path.write_text(json.dumps(fields))
        assert spec_from_checkpoint(tmp_path / "checkpoint")[1] == spec


def test_bamba_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path):
    """Bamba: Mamba2 layers with softmax attention (GQA, partial RoPE) at attn_layer_indices, each with a GLU MLP."""
    from transformers import BambaConfig, BambaForCausalLM

    from attnspec.interop.convert import native_config

    config = BambaConfig(**{**SMALL, "num_hidden_layers": 4}, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=8,
                         mamba_n_groups=2, mamba_d_state=6, mamba_chunk_size=16)
    spec = _holds_to(_perturbed(lambda: BambaForCausalLM(config)), tmp_path / "checkpoint", "bamba", EVERY_MODE)
    assert [block.mixer.kind for block in spec_blocks(spec)] == ["linear", "softmax", "linear", "linear"]
    assert native_config(spec, "bamba")["attn_layer_indices"] == [1]


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba"])
def test_mamba_and_falcon_mamba_compute_transformers_logits_in_every_mode_and_decode_alike(tmp_path, model_type):
    """Mamba-1 (the selective scan; Falcon-Mamba with its weightless RMS norms on Δ, B and C), with biases
    on its projections and an untied head, in every mode."""
    from transformers import FalconMambaConfig, FalconMambaForCausalLM, MambaConfig, MambaForCausalLM

    config, model = {"mamba": (MambaConfig, MambaForCausalLM),
                     "falcon_mamba": (FalconMambaConfig, FalconMambaForCausalLM)}[model_type]
    reference = _perturbed(lambda: model(config(vocab_size=VOCAB, hidden_size=32, state_size=6, num_hidden_layers=2,
                                                expand=2, time_step_rank=3, use_bias=True, tie_word_embeddings=False)))
    spec = _holds_to(reference, tmp_path / "checkpoint", model_type, EVERY_MODE)
    mixer = spec_blocks(spec)[0].mixer
    assert (mixer.kind, mixer.d_inner, mixer.d_qk, mixer.dt_rank) == ("mamba", 64, 6, 3)
    assert mixer.selection_norm == ("rms" if model_type == "falcon_mamba" else "none")


def test_jamba_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path):
    """Jamba: Mamba-1 layers with weighted RMS norms on Δ, B, C; position-free GQA attention every 2nd
    layer; experts (softmax router, top-2 of 4 not renormalised) every 3rd, so each mixer meets both MLPs."""
    from transformers import JambaConfig, JambaForCausalLM

    from attnspec.interop.convert import native_config

    config = JambaConfig(**{**SMALL, "num_hidden_layers": 4}, num_experts=4, num_experts_per_tok=2,
                         expert_layer_period=3, expert_layer_offset=0, attn_layer_period=2, attn_layer_offset=1,
                         mamba_d_state=6, mamba_dt_rank=3)
    spec = _holds_to(_perturbed(lambda: JambaForCausalLM(config)), tmp_path / "checkpoint", "jamba", EVERY_MODE)
    assert [(b.mixer.kind, b.mlp.kind) for b in spec_blocks(spec)] == [("mamba", "moe"), ("softmax", "glu"),
                                                                        ("mamba", "glu"), ("softmax", "moe")]
    written = native_config(spec, "jamba")
    assert (written["attn_layer_period"], written["expert_layer_period"], written["expert_layer_offset"]) == (2, 3, 0)


def test_nemotron_h_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path):
    """Nemotron-H: Mamba2 (Δ clamped at time_step_min), position-free attention, a squared-ReLU MLP layer and
    an experts layer (sigmoid scores with a correction bias, 2 groups of which 1 is chosen from, a shared
    expert), each its own block: the MLP and experts layers are blocks without a mixer."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from attnspec.interop.convert import native_config

    config = NemotronHConfig(vocab_size=VOCAB, hidden_size=32, max_position_embeddings=64, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, intermediate_size=48, ssm_state_size=6,
                             mamba_num_heads=8, mamba_head_dim=8, n_groups=2, chunk_size=16, n_routed_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=12, moe_shared_expert_intermediate_size=20,
                             n_group=2, topk_group=1, routed_scaling_factor=1.5,
                             layers_block_type=["linear_attention", "mlp", "full_attention", "moe", "linear_attention"])

    def build():
        model = NemotronHForCausalLM(config)
        with torch.no_grad():  # a correction bias that changes the choice
            model.model.layers[3].mixer.gate.e_score_correction_bias.copy_(torch.tensor([0.3, -0.2, 0.1, 0.0]))
        return model

    reference = _perturbed(build)
    with torch.no_grad():  # Δ well above time_step_min: transformers clamps it in a prompt but not in a step
        for index in (0, 4):
            reference.model.layers[index].mixer.dt_bias.add_(3.0)
    spec = _holds_to(reference, tmp_path / "checkpoint", "nemotron_h", EVERY_MODE)
    assert [(b.mixer.kind, b.mlp.kind) for b in spec_blocks(spec)] == [
        ("linear", "none"), ("none", "mlp"), ("softmax", "none"), ("none", "moe"), ("linear", "none")]
    assert spec_blocks(spec)[0].mixer.transition.dt_min == 0.001
    assert native_config(spec, "nemotron_h")["layers_block_type"] == config.layers_block_type


@pytest.mark.parametrize("experts", [4, 0])
def test_granite_4_hybrid_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path, experts):
    """Granite 4.0-H: Mamba2 and RoPE attention layers, experts stored fused (or none: the shared MLP alone),
    and every muP multiplier away from 1 (embeddings, residual branches, attention scale, logits)."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    config = GraniteMoeHybridConfig(**{**SMALL, "num_hidden_layers": 3, "intermediate_size": 12},
                                    layer_types=["mamba", "attention", "mamba"], num_local_experts=experts,
                                    num_experts_per_tok=2, shared_intermediate_size=20, mamba_n_heads=8,
                                    mamba_d_head=8, mamba_n_groups=2, mamba_d_state=6, mamba_chunk_size=16,
                                    position_embedding_type="rope", embedding_multiplier=3.0, logits_scaling=2.0,
                                    residual_multiplier=0.5, attention_multiplier=0.3)
    spec = _holds_to(_perturbed(lambda: GraniteMoeHybridForCausalLM(config)), tmp_path / "checkpoint",
                     "granitemoehybrid", EVERY_MODE)
    block = spec_blocks(spec)[1]
    assert (spec.input.scale, spec.head.scale, block.residual_scale, block.mixer.scale) == (3.0, 0.5, 0.5, 0.3)
    assert block.mlp.kind == ("moe" if experts else "glu")


def _gemma3_text():
    """Gemma 3's text model with every part on: local (window 6, base 10,000) and global (base 1,000,000,
    linear scaling) layers, QK-norm, sandwich norms, a soft-capped tied head, sqrt(d) embeddings."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=12, sliding_window=6,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              query_pre_attn_scalar=20, final_logit_softcapping=5.0,
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 1000000.0}})
    return Gemma3ForCausalLM(config)


def test_gemma3_text_computes_transformers_logits_and_decodes_alike(tmp_path):
    spec = _holds_to(_perturbed(_gemma3_text), tmp_path / "checkpoint", "gemma3_text")
    local, world = spec_blocks(spec)[:2]
    assert (local.mixer.window, local.mixer.position.base, world.mixer.window, world.mixer.position.base) == \
        (6, 10000.0, None, 1000000.0)
    assert local.norm_placement == "sandwich" and spec.head.softcap == 5.0 and spec.input.scale == 32 ** 0.5


@pytest.mark.parametrize("model_type", ["gemma2", "vaultgemma"])
def test_gemma2_and_vaultgemma_cap_attention_logits_as_transformers_does(tmp_path, model_type):
    """Gemma 2: every attention's logits soft-capped (a cap of 0.5 bends nearly every score of these
    perturbed weights, so a missing or misplaced cap shows), windows on alternate layers, sandwich norms
    without QK-norm, a capped tied head; VaultGemma the same with pre-norms only."""
    import transformers

    name = {"gemma2": "Gemma2", "vaultgemma": "VaultGemma"}[model_type]
    config = getattr(transformers, f"{name}Config")(**{**SMALL, "num_hidden_layers": 3}, head_dim=12, sliding_window=6,
                                                  query_pre_attn_scalar=20, final_logit_softcapping=5.0,
                                                  attn_logit_softcapping=0.5)
    spec = _holds_to(_perturbed(lambda: getattr(transformers, f"{name}ForCausalLM")(config)),
                     tmp_path / "checkpoint", model_type)
    blocks = spec_blocks(spec)
    assert [block.mixer.window for block in blocks] == [6, None, 6]
    assert {block.mixer.softcap for block in blocks} == {0.5} and spec.head.softcap == 5.0
    assert {block.mixer.qk_norm for block in blocks} == {"none"}
    assert {block.norm_placement for block in blocks} == {"sandwich" if model_type == "gemma2" else "pre"}


@pytest.mark.parametrize("value", [0, -4])
def test_a_softmax_scalar_attnspec_takes_a_root_of_must_be_positive(tmp_path, value):
    """``query_pre_attn_scalar: 0`` was a ZeroDivisionError (exit 70) in import-hf."""
    _gemma3_text().save_pretrained(tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**config, "query_pre_attn_scalar": value}))
    with pytest.raises(InteropError, match=rf"`query_pre_attn_scalar`: must be a positive number, got {value}"):
        spec_from_checkpoint(tmp_path / "checkpoint")


def test_the_text_model_of_a_multimodal_gemma3_imports_logit_equal(tmp_path):
    """A Gemma 3 release with its vision tower: the text config and the ``model.language_model.`` tensors
    import; the vision tower's and the projector's are left unread."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = _gemma3_text().config.to_dict()
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=8,
                  patch_size=4)
    reference = _perturbed(lambda: Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision,
                                                                               mm_tokens_per_image=4)))
    spec, model = _text_model_holds_to(reference, tmp_path / "checkpoint", "gemma3", "gemma3_text")


@pytest.mark.parametrize("bias", [False, True])
def test_lfm2_computes_transformers_logits_and_decodes_alike(tmp_path, bias):
    """LFM2: gated short convolutions (width 3; with and without biases) and QK-normed GQA attention, the
    MLP's width derived as Lfm2MLP derives it."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(**{**SMALL, "num_hidden_layers": 3, "intermediate_size": 96}, conv_bias=bias,
                        layer_types=["conv", "full_attention", "conv"], block_multiple_of=16,
                        block_ffn_dim_multiplier=1.5)
    spec = _holds_to(_perturbed(lambda: Lfm2ForCausalLM(config)), tmp_path / "checkpoint", "lfm2")
    blocks = spec_blocks(spec)
    assert [b.mixer.kind for b in blocks] == ["gated_conv", "softmax", "gated_conv"]
    assert blocks[0].mlp.hidden == 96  # int(1.5 * int(2 * 96 / 3)) = 96, a multiple of 16


def _deepseek_v3(**changes):
    """DeepSeek-V3 with every part on: latent attention with a query latent, interleaved RoPE under YaRN
    (its mscale changing the softmax scale), a dense first layer, then experts in 2 groups (1 chosen
    from), a correction bias, a shared expert and a routed scale."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    fields = dict(SMALL, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=12, q_lora_rank=10,
                  qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5, n_routed_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=12, n_group=2, topk_group=1, first_k_dense_replace=1,
                  routed_scaling_factor=2.5, n_shared_experts=1,
                  rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                                   "beta_fast": 32.0, "beta_slow": 1.0})
    config = DeepseekV3Config(**{**fields, **changes})
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.2, -0.3, 0.0, 0.1]))
    return model


@pytest.mark.parametrize("changes", [{}, {"q_lora_rank": None, "rope_interleave": False, "attention_bias": True}])
def test_deepseek_v3_computes_transformers_logits_and_decodes_alike(tmp_path, changes):
    spec = _holds_to(_perturbed(lambda: _deepseek_v3(**changes)), tmp_path / "checkpoint", "deepseek_v3")
    blocks = spec_blocks(spec)
    assert [(b.mixer.kind, b.mlp.kind) for b in blocks] == [("mla", "glu"), ("mla", "moe"), ("mla", "moe")]
    assert blocks[0].mixer.position.interleaved == (not changes)


def test_sarvam_mla_is_deepseek_v3_under_its_own_config_and_exports_as_itself(tmp_path):
    """Sarvam-105B: transformers runs DeepSeek-V3's model for its config class (one dense layer, experts over
    all of them at once); the released config's `num_experts` names the routed experts."""
    from transformers import DeepseekV3ForCausalLM, SarvamMLAConfig

    config = SarvamMLAConfig(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, kv_lora_rank=12,
                             q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5,
                             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                             routed_scaling_factor=2.5, n_shared_experts=1, pad_token_id=0)
    reference = _perturbed(lambda: DeepseekV3ForCausalLM(config))
    with torch.no_grad():
        for layer in reference.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.2, -0.3, 0.0, 0.1]))
    spec = _holds_to(reference, tmp_path / "checkpoint", "sarvam_mla")
    assert [(b.mixer.kind, b.mlp.kind) for b in spec_blocks(spec)] == [("mla", "glu"), ("mla", "moe"), ("mla", "moe")]
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    released = {**{k: v for k, v in fields.items() if k != "n_routed_experts"}, "num_experts": 4}
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps(released))
    assert spec_blocks(spec_from_checkpoint(tmp_path / "checkpoint")[1])[1].mlp.experts == 4


@pytest.mark.parametrize("mlp_layer_types", [None, ["dense", "sparse", "dense"]])
def test_glm4_moe_lite_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, mlp_layer_types):
    """GLM-4.7-Flash: DeepSeek-V3's latent attention (with a query latent) and GLM-4.5's experts, each layer's MLP
    named by `mlp_layer_types` (the first dense by default; any order); a list of the wrong length is refused."""
    from transformers import Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM

    config = Glm4MoeLiteConfig(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, kv_lora_rank=12,
                               q_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5,
                               n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                               routed_scaling_factor=1.8, n_shared_experts=1, mlp_layer_types=mlp_layer_types,
                               pad_token_id=0)
    reference = _perturbed(lambda: Glm4MoeLiteForCausalLM(config))
    with torch.no_grad():
        for layer in reference.model.layers:
            if hasattr(layer.mlp, "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias"):
                layer.mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.2, -0.3, 0.0, 0.1]))
    spec = _holds_to(reference, tmp_path / "checkpoint", "glm4_moe_lite")
    expected = ["glu", "moe", "moe"] if mlp_layer_types is None else ["glu", "moe", "glu"]
    assert [b.mlp.kind for b in spec_blocks(spec)] == expected
    fields = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**fields, "mlp_layer_types": ["dense"]}))
    with pytest.raises(InteropError, match="mlp_layer_types"):
        spec_from_checkpoint(tmp_path / "checkpoint")


def test_youtu_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Youtu-LLM: DeepSeek-V3's latent attention with a GLU in every layer and a tied head (its default). No
    padding id (its config's default): transformers' Youtu zeroes the embedding's padding row after loading a
    checkpoint (its initialiser writes through ``weight.data[padding_idx]``), so with one the reloaded
    reference itself would differ from the saved one."""
    from transformers import YoutuConfig, YoutuForCausalLM

    config = YoutuConfig(**{**SMALL, "num_key_value_heads": 4}, kv_lora_rank=12, q_lora_rank=10, qk_rope_head_dim=4,
                         qk_nope_head_dim=6, v_head_dim=5)
    spec = _holds_to(_perturbed(lambda: YoutuForCausalLM(config)), tmp_path / "checkpoint", "youtu")
    assert [(b.mixer.kind, b.mlp.kind) for b in spec_blocks(spec)] == [("mla", "glu")] * 2 and spec.head.tied


def test_minicpm3_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """MiniCPM3: latent attention with rotate-half RoPE and a GLU in every layer, embeddings times `scale_emb`,
    residual branches times scale_depth / sqrt(layers), the last hidden state divided by hidden / dim_model_base
    before the tied head."""
    from transformers import MiniCPM3Config, MiniCPM3ForCausalLM

    config = MiniCPM3Config(**{**SMALL, "num_key_value_heads": 4}, kv_lora_rank=12, q_lora_rank=10,
                            qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5, scale_emb=3.0, scale_depth=1.4,
                            dim_model_base=8, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: MiniCPM3ForCausalLM(config)), tmp_path / "checkpoint", "minicpm3")
    block = spec_blocks(spec)[0]
    assert (block.mixer.position.interleaved, block.residual_scale, spec.input.scale, spec.head.scale) == \
        (False, pytest.approx(1.4 / 2 ** 0.5), 3.0, 0.25)


@pytest.mark.parametrize("q_lora_rank, method", [(10, "greedy"), (None, "greedy"), (10, "group_limited_greedy")])
def test_deepseek_v2_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, q_lora_rank, method):
    """DeepSeek-V2: V3's latent attention (its pairs rotated as complex numbers, YaRN's mscale), a dense first
    layer, then softmax-scored greedy top-2 of 6 experts, not renormalised, times the routed scale, beside
    two shared experts; with a query latent and with V2-Lite's full query; and with group_limited_greedy, the
    experts chosen from the 2 of 3 groups whose best score is highest."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, kv_lora_rank=12,
                              q_lora_rank=q_lora_rank, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5,
                              n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=12,
                              first_k_dense_replace=1, routed_scaling_factor=2.5, n_shared_experts=2,
                              norm_topk_prob=True, pad_token_id=0, topk_method=method, n_group=3, topk_group=2,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                               "original_max_position_embeddings": 16, "mscale": 1.0,
                                               "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})
    spec = _holds_to(_perturbed(lambda: DeepseekV2ForCausalLM(config)), tmp_path / "checkpoint", "deepseek_v2")
    moe = spec_blocks(spec)[1].mlp
    assert (moe.scoring, moe.normalize, moe.shared, moe.routed_scale) == ("softmax", False, 2, 2.5)
    assert (moe.groups, moe.group_score) == ((3, "max") if method == "group_limited_greedy" else (1, "top2_sum"))


def test_kimi_linear_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path):
    """Kimi Linear: KDA (one A per head over a per-channel gate, low-rank gate projections), position-free
    latent attention, a dense first MLP then grouped experts with a correction bias and a shared expert."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    config = KimiLinearConfig(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4},
                              layer_types=["linear_attention", "full_attention", "linear_attention"],
                              mlp_layer_types=["dense", "sparse", "sparse"], linear_num_heads=2, linear_head_dim=8,
                              kv_lora_rank=12, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=6,
                              v_head_dim=5, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                              n_group=2, topk_group=1, routed_scaling_factor=2.0, n_shared_experts=1, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2)

    def build():
        model = KimiLinearForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.2, -0.3, 0.0, 0.1]))
        return model

    spec = _holds_to(_perturbed(build), tmp_path / "checkpoint", "kimi_linear", EVERY_MODE)
    assert [(b.mixer.kind, b.mlp.kind) for b in spec_blocks(spec)] == [("delta", "glu"), ("mla", "moe"),
                                                                        ("delta", "moe")]


@pytest.mark.parametrize("rope", [False, True])
def test_olmo_hybrid_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path, rope):
    """OLMo hybrid: Gated DeltaNet (beta in [0, 2], 2 key heads for 4 value heads) and attention in OLMo 2's
    norm placement with QK-norm over the whole projection width, without RoPE (as released) and with it.
    Keys and values are equally wide here: transformers saves the convolution as OLMo-core's q/k/v_conv1d
    by cutting it in three equal parts, right only then (the released checkpoints' parts are exact)."""
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    config = OlmoHybridConfig(**{**SMALL, "num_hidden_layers": 3}, layer_types=["linear_attention", "full_attention",
                                                                                 "linear_attention"],
                              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                              linear_value_head_dim=4, pad_token_id=0, eos_token_id=1,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    if not rope:  # as released: no RoPE (the config class fills a default in for None at construction)
        config.rope_parameters = None
    spec = _holds_to(_perturbed(lambda: OlmoHybridForCausalLM(config)), tmp_path / "checkpoint", "olmo_hybrid",
                     EVERY_MODE)
    attention = spec_blocks(spec)[1]
    assert attention.norm_placement == "output" and attention.mixer.qk_norm == "rmsnorm_full"
    assert attention.mixer.position.kind == ("rope" if rope else "none")


def test_recurrent_gemma_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path):
    """RecurrentGemma: RG-LRU blocks (two gate blocks, a width apart from hidden_size) and local multi-query
    attention (window 6, partial RoPE) in the cycle recurrent, recurrent, attention; soft-capped logits."""
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    config = RecurrentGemmaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=1, lru_width=24, attention_window_size=6,
                                  logits_soft_cap=5.0, max_position_embeddings=64)
    spec = _holds_to(_perturbed(lambda: RecurrentGemmaForCausalLM(config)), tmp_path / "checkpoint", "recurrent_gemma",
                     EVERY_MODE)
    assert [b.mixer.kind for b in spec_blocks(spec)] == ["rglru", "rglru", "softmax"]


def test_deepseek_v3_leaves_the_multi_token_prediction_layer_unread_as_transformers_does(tmp_path):
    from safetensors.torch import load_file, save_file

    reference = _perturbed(_deepseek_v3)
    reference.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.3.eh_proj.weight"] = torch.zeros(32, 64)  # DeepSeek-V3's MTP layer, past the last
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = _imported(tmp_path, "deepseek_v3")
    with torch.no_grad():
        assert _relative(model(_tokens()), reference(_tokens()).logits) < BOUND
    tensors["model.layers.0.stray.weight"] = torch.zeros(2)  # inside the model: still refused
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InteropError, match="stray"):
        _imported(tmp_path, "deepseek_v3")


@pytest.mark.parametrize("window", [None, 6])
def test_minimax_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path, window):
    """MiniMax: lightning attention (blocks of 4 in transformers' loop, a partial last one) and GQA softmax
    attention, experts in every layer, and α, β factors of every kind of sub-layer apart from 1. With a
    window, transformers' cached `generate` departs from its own model's greedy choice from the second new
    token (its decoding masks the window otherwise than its forward), so there the import's generation is
    held to transformers' model run over each whole prefix."""
    from transformers import MiniMaxConfig, MiniMaxForCausalLM

    config = MiniMaxConfig(**{**SMALL, "num_hidden_layers": 3, "intermediate_size": 24}, head_dim=8,
                           num_local_experts=4, num_experts_per_tok=2, block_size=4, sliding_window=window,
                           layer_types=["linear_attention", "full_attention", "linear_attention"],
                           full_attn_alpha_factor=0.9, full_attn_beta_factor=1.3, linear_attn_alpha_factor=1.1,
                           linear_attn_beta_factor=0.7, mlp_alpha_factor=0.8, mlp_beta_factor=1.2)
    reference = _perturbed(lambda: MiniMaxForCausalLM(config))
    spec = _holds_to(reference, tmp_path / "checkpoint", "minimax", EVERY_MODE, generate=window is None)
    blocks = spec_blocks(spec)
    assert [b.mixer.kind for b in blocks] == ["linear", "softmax", "linear"]
    assert blocks[0].scales() == ((1.1, 0.7), (0.8, 1.2)) and blocks[0].norm_placement == "normed_residual"
    if window is not None:
        model, prompt = _imported(tmp_path / "checkpoint", "minimax"), _tokens(length=9)
        with torch.no_grad():
            expected = prompt
            for _ in range(NEW_TOKENS):
                expected = torch.cat([expected, reference(expected).logits[:, -1:].argmax(-1)], dim=1)
        assert torch.equal(model.generate(prompt, NEW_TOKENS, temperature=0.0), expected)


def test_minimax_slopes_are_read_positive_and_their_decays_written_back_as_transformers_computes_them(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import MiniMaxConfig, MiniMaxForCausalLM

    config = MiniMaxConfig(**{**SMALL, "intermediate_size": 24}, num_local_experts=2, num_experts_per_tok=1,
                           layer_types=["linear_attention", "full_attention"])
    _perturbed(lambda: MiniMaxForCausalLM(config)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    from attnspec.interop.registry import architectures  # export writes the decays derived from the slopes:
    slopes = {k: v for k, v in tensors.items() if k.endswith("slope_rate")}
    derived = architectures()["minimax"].derived_tensors(None, slopes, {"block_size": config.block_size})
    assert derived.keys() == {k for k in tensors if k.endswith("_decay")}
    assert all(torch.allclose(derived[k], tensors[k], rtol=1e-6, atol=0) for k in derived)  # as transformers'
    tensors["model.layers.0.self_attn.slope_rate"][1] = 0.0  # with the tables it makes (else those differ first)
    tensors.update(architectures()["minimax"].derived_tensors(None, {k: tensors[k] for k in slopes},
                                                              {"block_size": config.block_size}))
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    spec = spec_from_checkpoint(tmp_path)[1]
    with pytest.raises(InteropError, match="slope_rate must be positive"):
        convert_weights(spec, tmp_path, "minimax")


def test_xlstm_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path):
    """xLSTM (7B's architecture): mLSTM blocks with keys narrower than values, transformers' chunks of 8 and a
    sequential tail, a GLU rounded up to a multiple, soft-capped logits. The widths are multiples of 64:
    transformers sizes its decoding cache by hidden_size * factor rounded up to 64 but its layers by the
    product itself, so only such widths decode there."""
    from transformers import xLSTMConfig, xLSTMForCausalLM

    config = xLSTMConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=4, qk_dim_factor=1.0,
                         v_dim_factor=2.0, chunk_size=8, output_logit_soft_cap=5.0, ffn_round_up_to_multiple_of=16,
                         max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    spec = _holds_to(_perturbed(lambda: xLSTMForCausalLM(config)), tmp_path / "checkpoint", "xlstm", EVERY_MODE)
    mixer = spec_blocks(spec)[0].mixer
    assert (mixer.kind, mixer.d_qk, mixer.d_v, spec.head.softcap) == ("mlstm", 16, 32, 5.0)


@pytest.mark.parametrize("change, words", [({"weight_mode": "fused"}, "weight_mode"),
                                           ({"gate_soft_cap": None}, "gate_soft_cap"),
                                           ({"use_bias": True}, "use_bias")])
def test_an_xlstm_config_attnspec_cannot_hold_is_refused_by_field(tmp_path, change, words):
    import json

    from transformers import xLSTMConfig

    config = xLSTMConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_heads=4).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(InteropError, match=words):
        spec_from_checkpoint(tmp_path)


@pytest.mark.parametrize("rms_norm, before_gate", [(False, False), (True, False), (True, True)])
def test_falcon_h1_computes_transformers_logits_in_every_mode_and_decodes_alike(tmp_path, rms_norm, before_gate):
    """Falcon-H1: Mamba2 (an SSM width of its own, 2 groups of 3 heads, biased output projection) beside GQA
    attention in every block, each without a norm, with Mamba2's gated norm, or with a norm per group
    before the gate; every μP multiplier apart from 1 (folded into the weights, the branch outputs' as the
    parallel mixer's weights, the embedding's and logits' as the spec's scales)."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    config = FalconH1Config(**SMALL, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head="auto", mamba_n_groups=2,
                            mamba_d_state=8, mamba_d_conv=3, mamba_chunk_size=8, mamba_rms_norm=rms_norm,
                            mamba_norm_before_gate=before_gate, projectors_bias=True, lm_head_multiplier=0.5,
                            embedding_multiplier=2.0, mlp_multipliers=[0.7, 1.3], key_multiplier=0.8,
                            attention_in_multiplier=0.9, attention_out_multiplier=1.2, ssm_in_multiplier=1.4,
                            ssm_multipliers=[0.6, 0.7, 0.8, 0.9, 1.1], ssm_out_multiplier=0.75, pad_token_id=0,
                            eos_token_id=1, bos_token_id=2)
    spec = _holds_to(_perturbed(lambda: FalconH1ForCausalLM(config)), tmp_path / "checkpoint", "falcon_h1", EVERY_MODE)
    mixer = spec_blocks(spec)[0].mixer
    assert [b.kind for b in mixer.branches] == ["linear", "softmax"] and mixer.weights == [0.75, 1.2]
    assert (mixer.branches[0].group_norm, mixer.branches[0].norm_span) == (rms_norm, "group" if before_gate else "head")


def test_an_imported_falcon_h1_exports_with_its_multipliers_folded_and_loads_as_itself(tmp_path):
    """The μP multipliers folded into the weights on import are written back folded, with the config's
    multipliers at 1: transformers loads the export as a FalconH1ForCausalLM computing the original's logits."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    config = FalconH1Config(**{**SMALL, "num_hidden_layers": 1}, mamba_d_ssm=32, mamba_n_heads=4, mamba_n_groups=1,
                            mamba_d_state=8, mamba_chunk_size=8, key_multiplier=0.8, attention_in_multiplier=0.9,
                            ssm_multipliers=[0.6, 0.7, 0.8, 0.9, 1.1], mlp_multipliers=[0.7, 1.3], pad_token_id=0)
    reference = _perturbed(lambda: FalconH1ForCausalLM(config))
    reference.save_pretrained(tmp_path / "checkpoint")
    build, exported = tmp_path / "build", tmp_path / "hf"
    runner = CliRunner()
    result = runner.invoke(app, ["import-hf", str(tmp_path / "checkpoint"), "-o", str(build), "--no-compile",
                                 "--no-calibrate"])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["export-hf", str(build), "-o", str(exported)]).exit_code == 0
    loaded = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(loaded) is FalconH1ForCausalLM and loaded.config.ssm_multipliers == [1.0] * 5
    with torch.no_grad():
        assert _relative(loaded(_tokens()).logits, reference(_tokens()).logits) < 1e-5


@pytest.mark.parametrize("variant", ["adapters", "grouped"])
def test_zamba2_computes_transformers_logits_in_every_mode_decodes_alike_and_exports_as_itself(tmp_path, variant):
    """Zamba2: Mamba2 blocks, the hybrid ones calling shared attention blocks in turn on [hidden, embeddings]
    with per-call LoRA adapters (on the MLP, and on q/k/v with RoPE and two shared blocks; or GQA without
    attention adapters or RoPE and one shared block), a per-call output map; exported back, transformers
    loads it as a Zamba2ForCausalLM computing the original's logits."""
    from transformers import Zamba2Config, Zamba2ForCausalLM

    from attnspec.interop.convert import export_model_hf

    if variant == "adapters":
        config = Zamba2Config(**{**SMALL, "num_hidden_layers": 5, "num_key_value_heads": 4}, num_mem_blocks=2,
                              layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid"],
                              use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True, n_mamba_heads=4,
                              mamba_d_state=6, mamba_ngroups=2, chunk_size=8, hidden_act="gelu")
    else:
        config = Zamba2Config(**{**SMALL, "num_hidden_layers": 3}, layers_block_type=["hybrid", "linear_attention",
                              "hybrid"], num_mem_blocks=1, adapter_rank=3, n_mamba_heads=4, mamba_d_state=6, chunk_size=8)
    reference = _perturbed(lambda: Zamba2ForCausalLM(config))
    spec = _holds_to(reference, tmp_path / "checkpoint", "zamba2", EVERY_MODE)
    uses = [block.shared.name if block.shared else None for block in spec_blocks(spec)]
    if variant == "adapters":
        assert uses == [None, "memory0", None, "memory1", "memory0"] and spec.shared[0].adapt == ["q", "k", "v", "mlp"]
        return
    assert uses == ["memory0", None, "memory0"] and spec.shared[0].adapt == ["mlp"]
    assert export_model_hf(_imported(tmp_path / "checkpoint", "zamba2"), tmp_path / "hf")[1] == "zamba2"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(loaded) is Zamba2ForCausalLM
    with torch.no_grad():
        assert _relative(loaded(_tokens()).logits, reference(_tokens()).logits) < 1e-6


def test_dynamic_ntk_rope_imports_logit_equal_and_decodes_as_transformers_generates(tmp_path):
    """Dynamic NTK past a trained context of 12: a sequence of 21 is rotated with the base its length gives,
    and greedy decoding from 9 tokens to 17 rotates each new token with its own position's base, as a fresh
    transformers model computes and generates (its rotary module keeps the largest length it has seen, so
    each comparison loads it anew). Below the trained context nothing is scaled: decoding equals the whole
    sequence computed at once there, and departs from it past it, as transformers' does."""
    from attnspec.interop.convert import native_config

    config = LlamaConfig(**{**SMALL, "max_position_embeddings": 12},
                         rope_parameters={"rope_theta": 500.0, "rope_type": "dynamic", "factor": 4.0})
    _perturbed(lambda: LlamaForCausalLM(config)).save_pretrained(tmp_path)

    def fresh():
        reference = LlamaForCausalLM.from_pretrained(tmp_path).eval()
        reference.generation_config.eos_token_id = None
        return reference

    assert native_config(spec_from_checkpoint(tmp_path)[1], "llama")["rope_parameters"]["rope_type"] == "dynamic"
    spec = spec_from_checkpoint(tmp_path, max_len=64)[1]
    model = build_model_from_spec(spec)
    model.load_state_dict(convert_weights(spec, tmp_path, "llama"))
    model.eval()
    tokens, prompt = _tokens(), _tokens(length=9)
    with torch.no_grad():
        assert _relative(model(tokens), fresh()(tokens).logits) < BOUND
        out = fresh().generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0,
                               attention_mask=torch.ones_like(prompt))
        assert torch.equal(model.generate(prompt, 8, temperature=0.0), out)
        logits, *state = model.prefill(tokens[:, :4])
        for t in range(4, 14):
            logits, *state = model.step(tokens[:, t], *state)
            whole = model(tokens[:, :t + 1])[:, t]
            assert (_relative(logits, whole) < 1e-5) is (t < 12), t


@pytest.mark.parametrize("mup", [False, True])
def test_afmoe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, mup):
    """AFMoE: sandwich norms, QK-norm and a sigmoid output gate, windowed layers with RoPE and global ones
    without positions, a dense first layer then experts (sigmoid scores, a perturbed correction bias that
    chooses but does not weight, renormalised, times ``route_scale``, shared experts)."""
    from transformers import AfmoeConfig, AfmoeForCausalLM

    config = AfmoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                         num_hidden_layers=4, num_dense_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
                         num_shared_experts=1, route_scale=1.7, global_attn_every_n_layers=2, sliding_window=3,
                         mup_enabled=mup)
    spec = _holds_to(_perturbed(lambda: AfmoeForCausalLM(config)), tmp_path / "checkpoint", "afmoe")
    blocks = spec_blocks(spec)
    assert [b.mixer.window for b in blocks] == [3, None, 3, None]
    assert [b.mixer.position.kind for b in blocks] == ["rope", "none", "rope", "none"]
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "moe", "moe"] and blocks[1].mlp.score_bias
    assert all(b.mixer.output_gate == "sigmoid" and b.norm_placement == "sandwich" for b in blocks)
    assert (spec.input.scale == pytest.approx(32 ** 0.5)) is mup


@pytest.mark.parametrize("strategy, selection, rms", [("average", "softmax", False), ("sum", "sigmoid", True)])
def test_cohere2_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, strategy, selection,
                                                                                    rms):
    """Cohere 2 MoE: parallel blocks, a dense first layer (global, rotating: ``prefix_dense_sliding_window_pattern``
    1) then experts with shared experts summed or averaged (an average exports as a sum of halved down
    projections), windowed layers with interleaved RoPE and global sparse ones without positions."""
    from transformers import Cohere2MoeConfig, Cohere2MoeForCausalLM

    config = Cohere2MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=16, prefix_dense_intermediate_size=40,
                              num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              max_position_embeddings=64, sliding_window=3, num_experts=4, num_experts_per_tok=2,
                              num_shared_experts=2, shared_expert_combination_strategy=strategy,
                              expert_selection_fn=selection, norm_topk_prob=False, first_k_dense_replace=1,
                              rms_norm_eps=1e-6 if rms else None, logit_scale=0.5)
    spec = _holds_to(_perturbed(lambda: Cohere2MoeForCausalLM(config)), tmp_path / "checkpoint", "cohere2_moe")
    blocks = spec_blocks(spec)
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "moe", "moe", "moe"]
    assert [b.mixer.window for b in blocks] == [None, 3, 3, 3, None]
    assert [b.mixer.position.kind for b in blocks] == ["rope", "rope", "rope", "rope", "none"]
    assert blocks[0].norm.kind == ("rmsnorm" if rms else "layernorm") and blocks[1].mlp.scoring == selection
    saved = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps({**saved,
                                                                     "shared_expert_combination_strategy": "max"}))
    with pytest.raises(InteropError, match="shared_expert_combination_strategy"):
        spec_from_checkpoint(tmp_path / "checkpoint")


def test_aria_text_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Aria's text model: experts in every layer stored fused and transposed (fc1 (experts, d, 2 hidden), fc2
    (experts, hidden, d)), the softmax of the top-k logits, two shared experts as one wider GLU."""
    from transformers import AriaTextConfig, AriaTextForCausalLM

    config = AriaTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, moe_num_experts=4,
                            moe_topk=2, moe_num_shared_experts=2, pad_token_id=0)
    spec = _holds_to(_perturbed(lambda: AriaTextForCausalLM(config)), tmp_path / "checkpoint", "aria_text")
    moe = spec_blocks(spec)[0].mlp
    assert moe.kind == "moe" and moe.experts == 4 and moe.shared_hidden == 32


def test_flint_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Flint: QK-norm attention with perturbed sinks, RoPE on windowed layers only, dense GLUs on
    ``mlp_only_layers`` and sigmoid-scored experts (no correction bias) beside an ungated shared expert."""
    from transformers import FlintConfig, FlintForCausalLM

    config = FlintConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                         sliding_window=3, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
                         num_experts_per_tok=2, mlp_only_layers=[0])
    spec = _holds_to(_perturbed(lambda: FlintForCausalLM(config)), tmp_path / "checkpoint", "flint")
    blocks = spec_blocks(spec)
    assert [b.mixer.window for b in blocks] == [None, None, 3, 3, None] and all(b.mixer.sinks for b in blocks)
    assert [b.mixer.position.kind for b in blocks] == ["none", "none", "rope", "rope", "none"]
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "moe", "moe", "moe"] and blocks[1].mlp.scoring == "sigmoid"


def test_hy_v3_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Hunyuan V3: Qwen3's attention, a dense first layer then sigmoid experts with a perturbed correction bias
    (choosing, not weighting), renormalised and scaled, beside shared experts; its released tensor names."""
    from transformers import HYV3Config, HYV3ForCausalLM

    config = HYV3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                        num_experts=4, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=16,
                        router_scaling_factor=1.6, enable_moe_fp32_combine=False)
    spec = _holds_to(_perturbed(lambda: HYV3ForCausalLM(config)), tmp_path / "checkpoint", "hy_v3")
    blocks = spec_blocks(spec)
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "moe"] and blocks[1].mlp.score_bias
    assert blocks[0].mixer.qk_norm == "rmsnorm"


@pytest.mark.parametrize("alpha", [None, 1000.0])
def test_hunyuan_v1_dense_normalises_after_rope_and_exports_as_itself(tmp_path, alpha):
    """Hunyuan V1 (dense): QK-norm after RoPE, with perturbed norm weights (so the placement shows), and an NTK
    ``alpha`` making a fixed RoPE base (exported as that base)."""
    from transformers import HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM

    rope = {"rope_type": "dynamic", "alpha": alpha, "factor": 1.0, "rope_theta": 10000.0} if alpha else None
    config = HunYuanDenseV1Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  max_position_embeddings=64, rope_parameters=rope)
    spec = _holds_to(_perturbed(lambda: HunYuanDenseV1ForCausalLM(config)), tmp_path / "checkpoint",
                     "hunyuan_v1_dense")
    mixer = spec_blocks(spec)[0].mixer
    assert mixer.qk_norm == "rmsnorm" and mixer.qk_norm_after_rope
    assert mixer.position.base == pytest.approx(10000.0 * (alpha or 1.0) ** (8 / 6))


def test_hunyuan_v1_moe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Hunyuan V1 (MoE): softmax-routed experts in every layer, the top two of four renormalised, beside an
    ungated shared GLU, with QK-norm after RoPE."""
    from transformers import HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM

    config = HunYuanMoEV1Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                num_experts=4, moe_topk=2)
    spec = _holds_to(_perturbed(lambda: HunYuanMoEV1ForCausalLM(config)), tmp_path / "checkpoint", "hunyuan_v1_moe")
    moe = spec_blocks(spec)[0].mlp
    assert (moe.kind, moe.experts, moe.top_k, moe.shared, moe.shared_hidden) == ("moe", 4, 2, 1, 24)


@pytest.mark.parametrize("qk_layernorm", [True, False])
def test_persimmon_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, qk_layernorm):
    """Persimmon: GPT-NeoX's packed, biased blocks in sequence, with perturbed LayerNorms (weights and biases) of
    each head's q and k before RoPE on half of each head."""
    from transformers import PersimmonConfig, PersimmonForCausalLM

    config = PersimmonConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=64, qk_layernorm=qk_layernorm)
    spec = _holds_to(_perturbed(lambda: PersimmonForCausalLM(config)), tmp_path / "checkpoint", "persimmon")
    block = spec_blocks(spec)[0]
    assert block.mixer.qk_norm == ("layernorm" if qk_layernorm else "none") and block.parallel == "none"
    assert block.mixer.position.rotary_fraction == 0.5 and block.mlp.activation == "relu2"


def test_the_language_model_of_a_fuyu_release_imports_logit_equal(tmp_path):
    """Fuyu: its Persimmon language model's config and ``language_model.`` tensors import (the image patches'
    projection is left unread) and compute FuyuForCausalLM's logits on text."""
    from transformers import FuyuConfig, FuyuForCausalLM

    text = dict(model_type="persimmon", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64)
    reference = _perturbed(lambda: FuyuForCausalLM(FuyuConfig(text_config=text, hidden_size=32, patch_size=4)))
    spec, model = _text_model_holds_to(reference, tmp_path / "checkpoint", "fuyu", "persimmon")
    assert spec_blocks(spec)[0].mixer.qk_norm == "layernorm"


@pytest.mark.parametrize("model_type", ["apertus", "apertus1p5_text"])
def test_apertus_computes_transformers_logits_with_xielu_and_exports_as_itself(tmp_path, model_type):
    """Apertus (and Apertus 1.5's text model): QK-norm attention under llama3 RoPE and a plain MLP of xIELU, its
    learnt α_p, α_n perturbed per layer and its β, ε set away from their defaults (read from the weights)."""
    import transformers

    names = {"apertus": ("ApertusConfig", "ApertusForCausalLM"),
             "apertus1p5_text": ("Apertus1p5TextConfig", "Apertus1p5TextForCausalLM")}[model_type]
    config = getattr(transformers, names[0])(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=64)

    def build():
        model = getattr(transformers, names[1])(config)
        for index, layer in enumerate(model.model.layers):
            layer.mlp.act_fn.beta.fill_(0.5 + 0.1 * index)
            layer.mlp.act_fn.eps.fill_(-1e-3)
        return model

    spec = _holds_to(_perturbed(build), tmp_path / "checkpoint", model_type)
    block = spec_blocks(spec)[0]
    assert block.mlp.kind == "mlp" and block.mlp.activation == "xielu" and block.mixer.qk_norm == "rmsnorm"
    assert block.mixer.position.scaling == "llama3"


def test_gpt_oss_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """gpt-oss: biased attention with perturbed sinks, a window on alternate layers, YaRN RoPE, and experts routed
    by a biased router, each a clamped GLU with biases whose gate and up projections alternate in one fused,
    transposed tensor; a limit low enough (0.5) that both clamps act on these inputs."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                          sliding_window=4, num_local_experts=4, num_experts_per_tok=2, swiglu_limit=0.5,
                          rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                           "truncate": False, "original_max_position_embeddings": 16,
                                           "rope_theta": 1000.0})
    reference = _perturbed(lambda: GptOssForCausalLM(config))
    with torch.no_grad():  # the clamps bite: some gate pre-activations exceed the limit on these tokens
        hidden = reference.model.embed_tokens(_tokens())
        gate_up = hidden @ reference.model.layers[0].mlp.experts.gate_up_proj[0]
        assert (gate_up[..., ::2] > 0.5).any() and (gate_up[..., 1::2].abs() > 0.5).any()
    spec = _holds_to(reference, tmp_path / "checkpoint", "gpt_oss")
    blocks = spec_blocks(spec)
    assert [b.mixer.window for b in blocks] == [4, None, 4] and all(b.mixer.sinks for b in blocks)
    moe = blocks[0].mlp
    assert (moe.router_bias, moe.expert_bias, moe.glu_limit, moe.activation) == (True, True, 0.5, "quick_gelu")


@pytest.mark.parametrize("rope, window", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
      "llama_4_scaling_beta": 0.5, "rope_theta": 1000.0}, None),
    ({"rope_type": "default", "original_max_position_embeddings": 5, "llama_4_scaling_beta": 0.3,
      "rope_theta": 1000.0}, 6),
])
def test_ministral3_scales_its_queries_by_position_and_exports_as_itself(tmp_path, rope, window):
    """Ministral 3: queries scaled by 1 + β ln(1 + floor(t / period)) after RoPE (YaRN's trained context as the
    period, or plain RoPE with its own), over 21 positions (two to four steps of the scale), with and without a
    window; decoding scales each new query by its own position."""
    from transformers import Ministral3Config, Ministral3ForCausalLM

    config = Ministral3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                              sliding_window=window, rope_parameters=rope)
    spec = _holds_to(_perturbed(lambda: Ministral3ForCausalLM(config)), tmp_path / "checkpoint", "ministral3")
    mixer = spec_blocks(spec)[0].mixer
    assert (mixer.query_scale_beta, mixer.query_scale_period) == (rope["llama_4_scaling_beta"],
                                                                  rope["original_max_position_embeddings"])
    assert spec_blocks(spec)[0].mixer.window == window


@pytest.mark.parametrize("clip, normalize", [(0.3, 1.0), (8.0, None)])
def test_dbrx_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, clip, normalize):
    """DBRX: GQA attention whose fused q/k/v are clamped (at 0.3, where the perturbed projections cross it, or
    at a released 8), experts stored as three (experts x ffn, d) tensors (w2 transposed per expert), renormalised or
    not, under LayerNorms without biases; its nested attn_config and ffn_config."""
    from transformers import DbrxConfig, DbrxForCausalLM

    config = DbrxConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
                        attn_config=dict(kv_n_heads=2, clip_qkv=clip, rope_theta=10000.0),
                        ffn_config=dict(ffn_hidden_size=24, moe_num_experts=4, moe_top_k=2,
                                        moe_normalize_expert_weights=normalize))
    reference = _perturbed(lambda: DbrxForCausalLM(config))
    if clip < 1:
        with torch.no_grad():
            attention = reference.transformer.blocks[0].norm_attn_norm
            assert (attention.attn.Wqkv(attention.norm_1(reference.transformer.wte(_tokens()))).abs() > clip).any()
    spec = _holds_to(reference, tmp_path / "checkpoint", "dbrx")
    block = spec_blocks(spec)[0]
    assert block.mixer.qkv_clip == clip and block.mixer.kv_heads == 2 and block.mlp.normalize == (normalize is not None)
    assert (block.norm.kind, block.norm.bias) == ("layernorm", False)


@pytest.mark.parametrize("attn, ffn, field", [({"clip_qkv": None}, {}, "attn_config.clip_qkv"),
                                              ({"rope_theta": 500000.0}, {}, "attn_config.rope_theta"),
                                              ({}, {"moe_normalize_expert_weights": 2.0},
                                               "ffn_config.moe_normalize_expert_weights")])
def test_a_dbrx_config_attnspec_cannot_hold_to_transformers_is_refused_by_its_nested_field(tmp_path, attn, ffn, field):
    """No clip (transformers' DBRX attention fails without one), a rope_theta its rotary embedding does not use, a
    p-norm other than 1: each names the nested field, and nothing is written."""
    from transformers import DbrxConfig

    DbrxConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=1, attn_config=dict(kv_n_heads=2, clip_qkv=8.0),
               ffn_config=dict(ffn_hidden_size=24, moe_num_experts=4, moe_top_k=2)).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["attn_config"].update(attn)
    data["ffn_config"].update(ffn)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(InteropError, match=f"`{re.escape(field)}`"):
        spec_from_checkpoint(tmp_path)


def test_ctrl_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """CTRL: scaled embeddings plus sin/cos sinusoids, pre-norm biased attention and ReLU MLPs (their LayerNorms at
    eps 1e-6 whatever the config says, the final one at its `layer_norm_epsilon`), and a tied head with a
    perturbed bias."""
    from transformers import CTRLConfig, CTRLLMHeadModel

    config = CTRLConfig(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, dff=48, n_positions=64,
                        layer_norm_epsilon=1e-3)
    spec = _holds_to(_perturbed(lambda: CTRLLMHeadModel(config)), tmp_path / "checkpoint", "ctrl")
    assert spec.position.kind == "sinusoidal" and spec.head.tied and spec.head.bias
    assert spec_blocks(spec)[0].norm.eps == 1e-6 and spec.final_norm.eps == 1e-3


def test_the_language_model_of_a_got_ocr2_release_imports_logit_equal(tmp_path):
    """GOT-OCR 2.0: its Qwen2 language model's config and ``language_model.`` tensors import (the vision tower and
    projector are left unread) and compute GotOcr2ForConditionalGeneration's logits on text."""
    from transformers import GotOcr2Config, GotOcr2ForConditionalGeneration

    text = dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    vision = dict(hidden_size=16, output_channels=16, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=16, global_attn_indexes=[0], mlp_dim=16)
    reference = _perturbed(lambda: GotOcr2ForConditionalGeneration(GotOcr2Config(text_config=text,
                                                                                 vision_config=vision)))
    spec, model = _text_model_holds_to(reference, tmp_path / "checkpoint", "got_ocr2", "qwen2")
    assert spec_blocks(spec)[0].mixer.qkv_bias


def test_the_language_model_of_an_emu3_release_imports_and_checks_itself_against_the_class_that_reads_it(tmp_path):
    """Emu3: its Llama language model's config and ``text_model.`` tensors import (the VQ image tokenizer is left
    unread) and compute Emu3ForConditionalGeneration's logits on text; import-hf's check loads that class, since
    transformers' Emu3ForCausalLM reads none of a release's weights (it would compare against random ones)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from attnspec.interop.check import compare, our_side

    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vq = dict(embed_dim=32, codebook_size=16, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, attn_resolutions=[])
    reference = _perturbed(lambda: Emu3ForConditionalGeneration(Emu3Config(text_config=text, vq_config=vq,
                                                                           vocabulary_map={})))
    spec, model = _text_model_holds_to(reference, tmp_path / "checkpoint", "emu3", "llama")
    check = compare(tmp_path / "checkpoint", our_side(model))
    assert check.skipped is None and check.relative_logit_diff < BOUND and check.tokens_agree == check.new_tokens


def test_kolibri1_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Kolibri 1: EXAONE 4.0's attention (windowed RoPE layers, a global layer without positions) in GLM-4's four
    norms, experts chosen by the logits plus a perturbed correction bias and weighted by their sigmoid,
    renormalised, beside a shared expert; its released tensor names."""
    from transformers import Kolibri1Config, Kolibri1ForCausalLM

    config = Kolibri1Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4,
                            moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
                            num_experts_per_tok=2, norm_topk_prob=True)

    def build():
        model = Kolibri1ForCausalLM(config)
        for layer in model.model.layers:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4) * 2)
        return model

    spec = _holds_to(_perturbed(build), tmp_path / "checkpoint", "kolibri1")
    blocks = spec_blocks(spec)
    assert [b.mixer.window for b in blocks] == [4, 4, 4, 4, None] and blocks[4].mixer.position.kind == "none"
    assert blocks[0].norm_placement == "sandwich" and blocks[0].mlp.score_bias_on_logits


@pytest.mark.parametrize("gating, cap", [(True, 0.5), ("per-element", 0.0)])
def test_laguna_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, gating, cap):
    """Laguna: heads per layer (4, 6, 4), RoPE per layer type (half of each head on the global layers), a window on the
    sliding layer, a softplus output gate per head or per channel, a dense first layer then experts of soft-capped
    logits (a cap the perturbed logits reach) with a perturbed correction bias, renormalised and scaled, beside a
    shared expert."""
    from transformers import LagunaConfig, LagunaForCausalLM

    config = LagunaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                          sliding_window=4, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                          num_experts=4, num_experts_per_tok=2, gating=gating, moe_router_logit_softcapping=cap,
                          moe_routed_scaling_factor=1.5, num_attention_heads_per_layer=[4, 6, 4],
                          layer_types=["full_attention", "sliding_attention", "full_attention"])

    def build():
        model = LagunaForCausalLM(config)
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(4))
        return model

    reference = _perturbed(build)
    if cap:
        with torch.no_grad():  # the cap acts on these inputs (the layer's normed input is of the same scale)
            assert (reference.model.layers[1].mlp.gate.weight @ reference.model.embed_tokens(_tokens())[0].T
                    ).abs().max() > cap
    spec = _holds_to(reference, tmp_path / "checkpoint", "laguna")
    mixers = [b.mixer for b in spec_blocks(spec)]
    assert [m.heads for m in mixers] == [4, 6, 4] and [m.window for m in mixers] == [None, 4, None]
    assert mixers[0].position.rotary_fraction == 0.5 and mixers[1].position.rotary_fraction == 1.0
    assert mixers[0].output_gate == "softplus" and mixers[0].gate_per_head == (gating is True)
    assert spec_blocks(spec)[1].mlp.router_softcap == (cap or None)


def test_nanochat_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """nanochat: weightless RMSNorms on the embeddings, each sub-layer and the output, RoPE turning the other way then
    a weightless QK-norm, a squared-ReLU MLP, soft-capped logits (a cap of 3 the perturbed logits reach)."""
    from transformers import NanoChatConfig, NanoChatForCausalLM

    config = NanoChatConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            final_logit_softcapping=3.0)
    spec = _holds_to(_perturbed(lambda: NanoChatForCausalLM(config)), tmp_path / "checkpoint", "nanochat")
    mixer = spec_blocks(spec)[0].mixer
    assert mixer.position.reverse and mixer.qk_norm == "rmsnorm_unweighted" and mixer.qk_norm_after_rope
    assert not spec.final_norm.affine and spec.input.norm.kind == "rmsnorm" and spec.head.softcap == 3.0


def _llama4_text(**changes):
    return {**dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=16, intermediate_size_mlp=48,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                   attention_chunk_size=4, floor_scale=4, attn_scale=0.3), **changes}


@pytest.mark.parametrize("changes", [{}, {"use_qk_norm": False, "attn_temperature_tuning": False,
                                          "attention_chunk_size": None, "num_experts_per_tok": 2}])
def test_llama4_text_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, changes):
    """Llama 4: three RoPE layers (interleaved pairs, an unweighted QK-norm after RoPE, attention within chunks of 4
    over 21 positions) and a fourth without positions whose queries grow by 0.3 ln(1 + floor((t + 1) / 4)); experts
    on layers 1 and 3 (the top logit's sigmoid weighting the expert's input, a shared expert), a dense GLU on 0 and
    2; and the same without QK-norm, tuning or chunks, two experts per token."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    spec = _holds_to(_perturbed(lambda: Llama4ForCausalLM(Llama4TextConfig(**_llama4_text(**changes)))),
                     tmp_path / "checkpoint", "llama4_text")
    blocks = spec_blocks(spec)
    assert [b.mixer.position.kind for b in blocks] == ["rope", "rope", "rope", "none"]
    assert [b.mlp.kind for b in blocks] == ["glu", "moe", "glu", "moe"] and blocks[1].mlp.weight_inputs
    if not changes:
        assert blocks[0].mixer.chunk == 4 and blocks[0].mixer.qk_norm == "rmsnorm_unweighted"
        assert (blocks[3].mixer.query_scale_beta, blocks[3].mixer.query_scale_offset) == (0.3, 1)


def test_the_text_model_of_a_multimodal_llama4_release_imports_logit_equal(tmp_path):
    """Llama 4's multimodal release: its text config and ``language_model.`` tensors import (the vision model and
    projector are left unread) and compute its language model's logits on text (transformers 5.24's
    Llama4ForConditionalGeneration fails on text alone, reading `image_outputs` its language model does not
    return, so the test reads the language model it holds)."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                  patch_size=8, vision_output_dim=16, projector_input_dim=16, projector_output_dim=16)
    reference = _perturbed(lambda: Llama4ForConditionalGeneration(Llama4Config(text_config=_llama4_text(),
                                                                               vision_config=vision)))
    spec, model = _text_model_holds_to(reference, tmp_path / "checkpoint", "llama4", "llama4_text",
                                         text_logits=lambda tokens: reference.language_model(input_ids=tokens).logits)


def test_gpt_neox_japanese_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """GPT-NeoX Japanese: packed attention without biases in sequential pre-norm blocks, a perturbed bias on the last
    block's attention output alone, a bias-free MLP twice as wide, a tied head."""
    from transformers import GPTNeoXJapaneseConfig, GPTNeoXJapaneseForCausalLM

    config = GPTNeoXJapaneseConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                   intermediate_multiple_size=2, max_position_embeddings=64,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                    "partial_rotary_factor": 0.5})
    spec = _holds_to(_perturbed(lambda: GPTNeoXJapaneseForCausalLM(config)), tmp_path / "checkpoint",
                     "gpt_neox_japanese")
    blocks = spec_blocks(spec)
    assert [b.mixer.out_bias for b in blocks] == [False, False, True] and blocks[0].mlp.hidden == 64
    assert blocks[0].mixer.position.rotary_fraction == 0.5 and spec.head.tied


@pytest.mark.parametrize("scale", [None, 0.5])
def test_cohere_compass_text_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, scale):
    """Cohere Compass's text model: Command R7B's parallel blocks, windowed layers with RoPE in halves (its
    multimodal RoPE on text) and a global layer whose layer type maps RoPE to null, the logits scaled or not."""
    from transformers import CohereCompassForCausalLM, CohereCompassTextConfig

    config = CohereCompassTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     sliding_window=4, logit_scale=scale, eos_token_id=2, bos_token_id=1,
                                     pad_token_id=0,
                                     layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                     rope_parameters={"sliding_attention": {"rope_type": "default",
                                                                            "rope_theta": 1000.0},
                                                      "full_attention": None})
    spec = _holds_to(_perturbed(lambda: CohereCompassForCausalLM(config)), tmp_path / "checkpoint",
                     "cohere_compass_text")
    mixers = [b.mixer for b in spec_blocks(spec)]
    assert [m.position.kind for m in mixers] == ["rope", "rope", "rope", "none"] and not mixers[0].position.interleaved
    assert spec.head.scale == (scale or 1.0) and spec_blocks(spec)[0].parallel == "shared_norm"


def test_mimo_v2_flash_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """MiMo-V2-Flash: values narrower than queries (scaled by ``attention_value_scale``), partial RoPE per layer
    type, windowed layers with twice the key/value heads and perturbed sinks, a dense first layer, then
    DeepSeek-V3's group-limited sigmoid experts without shared ones."""
    from transformers import MiMoV2FlashConfig, MiMoV2FlashForCausalLM

    rope = {"full_attention": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}
    config = MiMoV2FlashConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=1, head_dim=12, v_head_dim=8,
                               max_position_embeddings=64, sliding_window=3, moe_intermediate_size=16,
                               n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                               routed_scaling_factor=1.5, attention_value_scale=0.6, rope_parameters=rope,
                               layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                            "full_attention"])
    spec = _holds_to(_perturbed(lambda: MiMoV2FlashForCausalLM(config)), tmp_path / "checkpoint", "mimo_v2_flash")
    mixers = [b.mixer for b in spec_blocks(spec)]
    assert [m.window for m in mixers] == [None, 3, 3, None] and [m.sinks for m in mixers] == [False, True, True, False]
    assert [m.kv_heads for m in mixers] == [1, 2, 2, 1] and mixers[0].d_v == 8
    assert [b.mlp.kind for b in spec_blocks(spec)] == ["glu", "moe", "moe", "moe"]


@pytest.mark.parametrize("model_type, config_class", [("afmoe", "AfmoeConfig"), ("cohere2_moe", "Cohere2MoeConfig"),
                                                      ("flint", "FlintConfig"), ("hy_v3", "HYV3Config")])
def test_a_config_without_head_dim_takes_its_config_class_default(tmp_path, model_type, config_class):
    """These config classes default ``head_dim`` to 128 whatever the width: a released config.json that leaves
    it out has transformers build heads 128 wide, and so does the import (not hidden_size / heads)."""
    import transformers

    getattr(transformers, config_class)(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data.pop("head_dim") == 128
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert {block.mixer.d_qk for block in spec_blocks(spec_from_checkpoint(tmp_path)[1])} == {128}


@pytest.mark.parametrize("heads, kv_heads, bias", [(6, 2, False), (4, 4, True)])
def test_diffllama_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, heads, kv_heads, bias):
    """DiffLlama's differential attention: transformers' pairs (heads p and p + heads / 2, over kv heads p // g and
    p // g + kv_heads / 2) reordered into attnspec's on import and back on export; three query heads per key head
    (g = 3) and none shared with biases; λ's vectors perturbed, λ_init by depth over three layers."""
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    config = DiffLlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=48, num_hidden_layers=3,
                             num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                             attention_bias=bias)
    spec = _holds_to(_perturbed(lambda: DiffLlamaForCausalLM(config)), tmp_path / "checkpoint", "diffllama")
    assert all(block.mixer.differential for block in spec_blocks(spec))


def test_diffllama_with_odd_key_value_heads_is_refused_by_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "diffllama", **SMALL, "num_key_value_heads": 1}))
    with pytest.raises(InteropError, match="num_key_value_heads.*even"):
        spec_from_checkpoint(tmp_path)


def test_bitnet_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """BitNet unquantised: the attention's output normalised over every head before o_proj, the MLP's hidden before
    down_proj (both norms' weights perturbed), a squared-ReLU GLU."""
    from transformers import BitNetConfig, BitNetForCausalLM

    config = BitNetConfig(**SMALL)
    spec = _holds_to(_perturbed(lambda: BitNetForCausalLM(config)), tmp_path / "checkpoint", "bitnet")
    block = spec_blocks(spec)[0]
    assert (block.mixer.group_norm, block.mixer.norm_span, block.mlp.inner_norm.kind) == (True, "full", "rmsnorm")


@pytest.mark.parametrize("method", ["bitnet", "fp8", None])
def test_a_quantised_checkpoint_is_refused_by_field_whatever_its_type(tmp_path, method):
    """A `quantization_config` (BitNet b1.58's ternary weights, DeepSeek's FP8 blocks, GPTQ's integers) stores
    tensors attnspec's maps do not read: refused by field, naming the method, before anything else is read."""
    config = {"model_type": "bitnet" if method == "bitnet" else "llama", **SMALL,
              "quantization_config": {"quant_method": method} if method else "yes"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    named = f" \\(quant_method '{method}'\\)" if method else ";"
    with pytest.raises(InteropError, match=f"quantization_config`: a quantised checkpoint{named}"):
        spec_from_checkpoint(tmp_path)


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_deepseek_sparse_attention_computes_transformers_logits_and_exports_as_itself(tmp_path, model_type):
    """DeepSeek-V3.2 and GLM-5: DeepSeek-V3's layers (YaRN, a query latent, a dense first layer then grouped experts)
    with the lightning indexer choosing 4 of the up to 21 earlier keys per query (16 index heads, so that exact ties
    of the ReLU'd scores, whose order transformers' and attnspec's top-k may break differently, are rare), its RoPE
    in halves (V3.2) or interleaved (GLM-5), the indexer's keys cached in decoding."""
    import transformers

    names = {"deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
             "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM")}[model_type]
    fields = dict(SMALL, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=12, q_lora_rank=10,
                  qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5, n_routed_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=12, n_group=2, topk_group=1, first_k_dense_replace=1,
                  routed_scaling_factor=2.5, n_shared_experts=1, index_n_heads=16, index_head_dim=8, index_topk=4,
                  rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                                   "beta_fast": 32.0, "beta_slow": 1.0})

    def build():
        model = getattr(transformers, names[1])(getattr(transformers, names[0])(**fields))
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.2, -0.3, 0.0, 0.1]))
        return model

    spec = _holds_to(_perturbed(build), tmp_path / "checkpoint", model_type)
    blocks = spec_blocks(spec)
    assert [(b.mixer.kind, b.mixer.indexer.topk, b.mlp.kind) for b in blocks] == [
        ("mla", 4, "glu"), ("mla", 4, "moe"), ("mla", 4, "moe")]
    assert blocks[0].mixer.indexer.interleaved == (model_type == "glm_moe_dsa")


def test_glm_moe_dsa_layers_sharing_a_choice_of_keys_are_refused_by_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "glm_moe_dsa", **SMALL, "num_hidden_layers": 3, "kv_lora_rank": 12, "q_lora_rank": 10,
        "qk_rope_head_dim": 4, "qk_nope_head_dim": 6, "v_head_dim": 5, "indexer_types": ["full", "shared", "full"]}))
    with pytest.raises(InteropError, match=r"indexer_types` \(layers 1\).*shared"):
        spec_from_checkpoint(tmp_path)


def test_deepseek_v32_without_a_query_latent_is_refused_by_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v32", **SMALL, "q_lora_rank": None,
                                                      "kv_lora_rank": 12, "qk_rope_head_dim": 4,
                                                      "qk_nope_head_dim": 6, "v_head_dim": 5}))
    with pytest.raises(InteropError, match="q_lora_rank.*indexer"):
        spec_from_checkpoint(tmp_path)


@pytest.mark.parametrize("rescale_every", [0, 1, 2])
def test_rwkv_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path, rescale_every):
    """RWKV-4: every layer's time mixing (WKV in each of its modes) and channel mixing, the decays, bonuses and
    token-shift mixes perturbed; transformers' inference rescaling (weights divided by 2^(i // R), the hidden state
    halved after every R-th layer) reproduced as residual scales, and none."""
    from transformers import RwkvConfig, RwkvForCausalLM

    # (transformers' decoding state is hidden_size wide: it fails for another attention_hidden_size)
    config = RwkvConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, attention_hidden_size=32,
                        intermediate_size=40, context_length=64, rescale_every=rescale_every)
    reference = _perturbed(lambda: RwkvForCausalLM(config))
    spec = _holds_to(reference, tmp_path / "checkpoint", "rwkv", modes=("chunk", "quadratic", "recurrent"),
                     generate=False)
    assert [b.mixer.kind for b in spec_blocks(spec)] == ["rwkv", "rwkv_channel"] * 3
    # transformers' one-token step broadcasts a batch's (B, d) shift state against (B, 1, d) inputs: its generate is
    # right for one row alone. Two rows are held to its full pass's greedy choice, one row to its generate too.
    model, prompt = _imported(tmp_path / "checkpoint", "rwkv"), _tokens(length=9)
    with torch.no_grad():
        greedy = prompt
        for _ in range(NEW_TOKENS):
            greedy = torch.cat([greedy, reference(greedy).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(model.generate(prompt, NEW_TOKENS, temperature=0.0), greedy)
        one = reference.generate(prompt[:1], max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                                 attention_mask=torch.ones_like(prompt[:1]))
        assert torch.equal(one, greedy[:1])


def test_jetmoe_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """JetMoE: 2 of 4 attention experts per token over shared keys and values (queries and output projections stored
    (experts, out, in)), 2 of 4 GLU experts (their halves fused), a bias on each mixture's output, RMSNorms whose eps
    differs between the layers (1e-6, fixed) and the final norm (`rms_norm_eps`)."""
    from transformers import JetMoeConfig, JetMoeForCausalLM

    config = JetMoeConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8,
                          intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                          rms_norm_eps=1e-3)
    spec = _holds_to(_perturbed(lambda: JetMoeForCausalLM(config)), tmp_path / "checkpoint", "jetmoe")
    block = spec_blocks(spec)[0]
    assert (block.mixer.query_experts.experts, block.mlp.output_bias, spec.final_norm.eps) == (4, True, 1e-3)


def test_lara_mini_computes_transformers_logits_decodes_alike_and_exports_as_itself(tmp_path):
    """Lara Mini: Gated DeltaNet layers (their input projections fused in one stored `in_proj`, value heads sharing
    key heads), windowed rotary attention and global position-free attention in its default order, experts in every
    layer with one ungated shared expert (stored fused), plain RMSNorms, a tied head."""
    from transformers import LaraMiniConfig, LaraMiniForCausalLM

    config = LaraMiniConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
                            linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=12,
                            shared_expert_intermediate_size=12, num_experts=4, num_experts_per_tok=2,
                            sliding_window=4, max_position_embeddings=64, eos_token_id=2)
    spec = _holds_to(_perturbed(lambda: LaraMiniForCausalLM(config)), tmp_path / "checkpoint", "lara_mini",
                     modes=("chunk", "recurrent"))
    assert [b.mixer.kind for b in spec_blocks(spec)] == ["delta", "softmax", "delta", "softmax", "softmax"]
    assert [getattr(b.mixer, "window", None) for b in spec_blocks(spec)] == [None, 4, None, None, 4]
