"""Hugging Face interop (DESIGN sec. 3, layer 6).

``import attnspec.hf`` registers the ``attnspec`` model type with transformers' Auto classes, so a
directory written by ``attnspec export-hf`` as that type loads with
``transformers.AutoModelForCausalLM.from_pretrained(dir)`` (no ``trust_remote_code``). It needs the
``hf`` extra (transformers); ``import attnspec`` never imports this package.

Import and export themselves (:mod:`attnspec.interop`) read and write config.json and safetensors,
need no transformers and never import this package: registering the model type imports transformers'
modelling stack (~200 MB and seconds), which a conversion does not need.
"""

from __future__ import annotations

try:
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError:  # conversion works without it; only the model type needs it
    AutoConfig = AutoModelForCausalLM = None

if AutoConfig is not None:
    from attnspec.hf.modeling import AttnspecConfig, AttnspecForCausalLM

    AutoConfig.register("attnspec", AttnspecConfig, exist_ok=True)
    AutoModelForCausalLM.register(AttnspecConfig, AttnspecForCausalLM, exist_ok=True)
    __all__ = ["AttnspecConfig", "AttnspecForCausalLM"]
