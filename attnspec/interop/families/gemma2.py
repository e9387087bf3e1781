"""transformers' ``gemma2`` model type as attnspec specs, and back (what a family states:
:mod:`attnspec.interop.architecture`)."""

from __future__ import annotations

from attnspec.interop.architecture import Row
from attnspec.interop.families.gemma3 import Gemma3


class Gemma2(Gemma3):
    """Gemma 2: Gemma 3's blocks (sandwich norms of weight 1 + w, the softmax scale
    ``query_pre_attn_scalar``^-1/2, a tanh-GeLU GLU, embeddings times sqrt(hidden_size), a tied head with a
    logit soft-cap) without QK-norm, every attention's logits soft-capped (``attn_logit_softcapping``: s
    becomes cap * tanh(s / cap) before the mask), windows on alternate layers by default and one RoPE base."""

    model_types = ("gemma2",)
    causal_lm = {"gemma2": "Gemma2ForCausalLM"}
    wrappers = {}
    rows = (
        Row(("gemma2",),
            "Gemma 3's sandwich-norm blocks without QK-norm, the attention logits soft-capped (`softcap`), windows "
            "per layer type (alternate by default), a tied head with `final_logit_softcapping`",
            "bidirectional attention"),
    )

    QK_NORM = False
    ATTENTION_SOFTCAP = True
    SOFTCAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    WINDOW_PATTERN = 2
    ROPE_PER_LAYER_TYPE = False


class VaultGemma(Gemma2):
    """VaultGemma (Gemma 2 trained with differential privacy): Gemma 2's attention and MLP with one norm
    before each sub-layer (`input_layernorm`, `pre_feedforward_layernorm`) and none after."""

    model_types = ("vaultgemma",)
    causal_lm = {"vaultgemma": "VaultGemmaForCausalLM"}
    rows = (
        Row(("vaultgemma",),
            "Gemma 2's attention (logits soft-capped) and MLP with pre-norms only (`norm_placement: pre`)",
            "bidirectional attention"),
    )

    NORM_PLACEMENT = "pre"


ARCHITECTURES = (Gemma2(), VaultGemma())
