"""transformers' activations (``ACT2FN``) as attnspec's: each one attnspec names equals transformers' own in
float64 (exactly, or within 1e-15 where transformers writes the formula out), and a config naming it imports
logit-equal (within test_interop's 1e-4) in a dense MLP (Llama) and in experts (Mixtral, which applies
``hidden_act`` to its experts)."""

from __future__ import annotations

import pytest
import torch

from attnspec.interop.config import ACTIVATION_NAMES, HF_ACTIVATIONS
from attnspec.nn.channel import _ACTIVATIONS
from tests.hf.test_interop import SMALL, _imported, _perturbed, _relative, _tokens

BOUND = 1e-4
NEW = ["relu6", "gelu_10", "mish", "tanh", "gelu_accurate", "gelu_python"]


@pytest.mark.parametrize("name", sorted(set(ACTIVATION_NAMES) - {"xielu"}))
def test_each_activation_is_transformers_own(name):
    from transformers.activations import ACT2FN

    x = torch.cat([torch.linspace(-30, 30, 2001, dtype=torch.float64), torch.tensor([0.0, -0.0, 1e-8, -1e-8])])
    ours, theirs = _ACTIVATIONS[name](x), ACT2FN[ACTIVATION_NAMES[name]](x)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-15), (name, float((ours - theirs).abs().max()))


@pytest.mark.parametrize("name", sorted(HF_ACTIVATIONS))
def test_each_alias_is_its_activation_within_float32_rounding(name):
    from transformers.activations import ACT2FN

    x = torch.linspace(-12, 12, 2001, dtype=torch.float32)
    assert torch.allclose(_ACTIVATIONS[HF_ACTIVATIONS[name]](x), ACT2FN[name](x), rtol=0, atol=2e-6), name


@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
@pytest.mark.parametrize("activation", NEW)
def test_a_config_naming_it_imports_logit_equal(tmp_path, model_type, activation):
    import transformers

    extra = {"num_local_experts": 3, "num_experts_per_tok": 2} if model_type == "mixtral" else {}
    config = transformers.CONFIG_MAPPING[model_type](**SMALL, hidden_act=activation, **extra)
    reference = _perturbed(lambda: transformers.AutoModelForCausalLM.from_config(config))
    with torch.no_grad():  # inputs large enough that a clip (relu6, gelu_10) or a saturation (tanh) acts
        for name, parameter in reference.named_parameters():
            if "up_proj" in name or "gate_proj" in name or name.endswith(("w1.weight", "w3.weight")):
                parameter.mul_(8.0)
    reference.save_pretrained(tmp_path)
    with torch.no_grad():
        assert _relative(_imported(tmp_path, model_type)(_tokens()), reference(_tokens()).logits) < BOUND
