"""The model types attnspec refuses, and why: what an import of one of them says instead of a spec.

:data:`CAUSAL_LM_TYPES` is transformers 5.24's causal-LM mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), the
zoo this project measures itself against; ``tests/hf/test_registry.py`` holds it to the installed
transformers of that version. Of its types, the registry's import; encoders run as decoders and the
decoders of encoder-decoder models are refused as such; decoder-only types whose missing part is known
say which part and which config field; the rest say that no family maps them yet. Nothing here imports
torch or transformers.
"""

from __future__ import annotations

from attnspec.errors import shorten

TRANSFORMERS_VERSION = "5.24"
CAUSAL_LM_TYPES = (
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "axk2", "bailing_hybrid", "bamba",
    "bart", "beam", "bert", "bert-generation", "big_bird", "bigbird_pegasus", "biogpt", "bitnet", "blenderbot",
    "blenderbot-small", "bloom", "blt", "camembert", "codegen", "cohere", "cohere2", "cohere2_moe",
    "cohere_compass_text", "cpmant", "ctrl", "cwm", "data2vec-text", "dbrx", "deepseek_v2", "deepseek_v3",
    "deepseek_v32", "deepseek_v4", "diffllama", "doge", "dory", "dots1", "dots3_note", "dots3_note_text",
    "electra", "emu3", "ernie", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon",
    "falcon_h1", "falcon_mamba", "flex_olmo", "flint", "fuyu", "gemma", "gemma2", "gemma3", "gemma3_text",
    "gemma3n", "gemma3n_text", "gemma4", "gemma4_assistant", "gemma4_text", "gemma4_unified",
    "gemma4_unified_assistant", "gemma4_unified_text", "git", "glm", "glm4", "glm4_moe", "glm4_moe_lite",
    "glm_moe_dsa", "got_ocr2", "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_neox_japanese",
    "gpt_oss", "gptj", "granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoehybrid",
    "granitemoeshared", "helium", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hy_v4",
    "hyperclovax", "inkling2_loop_text", "inkling2_text", "inkling_text", "internlm3", "iquestcoder", "jais2",
    "jamba", "jetmoe", "kimi_linear", "kolibri1", "laguna", "lara_mini", "lfm2", "lfm2_moe", "lfm3", "llama",
    "llama4", "llama4_text", "longcat_flash", "mamba", "mamba2", "marian", "mbart", "megatron-bert", "mellum",
    "mimo_v2_flash", "minicpm3", "minimax", "minimax_m2", "minimax_m3_vl_text", "ministral", "ministral3",
    "mistral", "mixtral", "mllama", "modernbert-decoder", "moshi", "moss_transcribe_diarize", "mpt", "musicgen",
    "musicgen_melody", "mvp", "nanochat", "nemotron", "nemotron_h", "olmo", "olmo2", "olmo3", "olmo_hybrid",
    "olmoe", "openai-gpt", "opt", "pegasus", "persimmon", "phi", "phi3", "phi4_multimodal", "phimoe", "plbart",
    "prophetnet", "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text",
    "qwen3_moe", "qwen3_next", "qwen4_exp", "qwen4_exp_text", "recurrent_gemma", "reformer", "rembert",
    "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "rwkv", "sarvam_mla", "sarvam_moe", "seed_oss",
    "smollm3", "solar_open", "stablelm", "starcoder2", "trocr", "vaultgemma", "whisper", "xglm", "xlm",
    "xlm-roberta", "xlm-roberta-xl", "xlnet", "xlstm", "xmod", "youtu", "zamba", "zamba2", "zaya",
)

ENCODERS = frozenset({"bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                      "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm",
                      "xlm-roberta", "xlm-roberta-xl", "xmod"})
"""Encoders (trained bidirectionally) whose causal-LM class is the encoder run with ``is_decoder``."""

DECODERS_OF_ENCODER_DECODERS = frozenset({"bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian",
                                          "mbart", "musicgen", "musicgen_melody", "mvp", "pegasus", "plbart",
                                          "prophetnet", "trocr", "whisper"})
"""Decoders that cross-attend to an encoder's output (text, speech, images or audio codes)."""

LACKS: dict[str, tuple[str, str]] = {
    "kolibri1": ("model_type", "a router choosing experts by their raw logits plus a correction bias and weighting "
                               "them by the logits' sigmoid (attnspec's sigmoid router adds the bias to the sigmoid)"),
    "rwkv": ("model_type", "RWKV's WKV time mixing (token shift, a per-channel decay with a bonus for the current "
                           "token), which is no attnspec mixer yet"),
    "hunyuan_v1_dense": ("model_type", "an RMSNorm of q and k applied after RoPE (attnspec's QK-norm comes before "
                                       "it, and a per-channel weight does not commute with the rotation)"),
    "hunyuan_v1_moe": ("model_type", "an RMSNorm of q and k applied after RoPE (attnspec's QK-norm comes before "
                                     "it, and a per-channel weight does not commute with the rotation)"),
    "phimoe": ("model_type", "the SparseMixer router (experts chosen and weighted by masked softmaxes, not top-k of "
                             "one softmax)"),
    "nanochat": ("model_type", "RoPE turning each pair the other way (its rotate_half is [x2, -x1]) and QK-norm "
                               "after it"),
    "persimmon": ("qk_layernorm", "LayerNorms with biases on each head's q and k (attnspec's QK-norm is an RMSNorm)"),
    "gpt_oss": ("model_type", "clamped SwiGLU experts with biases (its attention sinks import: `sinks`)"),
    "gpt_neox_japanese": ("model_type", "attention and the MLP in parallel, with a bias added after the residual"),
    "diffllama": ("model_type", "differential attention (the difference of two softmax maps, weighted by a learned "
                                "lambda)"),
    "jetmoe": ("model_type", "a mixture of attention heads (experts over attention projections)"),
    "reformer": ("attn_layers", "LSH attention and local chunked attention"),
    "xlnet": ("model_type", "permutation language modelling with two-stream relative attention"),
    "bitnet": ("model_type", "BitNet's ternary-quantised linear maps and their sub-layer norms"),
    "apertus": ("hidden_act", "the xIELU activation (with its learned parameters per layer)"),
    "ministral3": ("rope_parameters.llama_4_scaling_beta", "queries scaled by a factor growing with the position "
                                                           "past `original_max_position_embeddings` (Llama 4's)"),
}
"""Decoder-only types whose missing part is known: type -> (the config field that asks for it, the part)."""


def refusal(model_type, config: dict) -> str:
    """What an import says of a ``config.json`` whose ``model_type`` no family imports (``config``: the
    config's data): the message after its location, naming the field and the part it lacks."""
    known = model_type if isinstance(model_type, str) and model_type in CAUSAL_LM_TYPES else None
    if config.get("is_encoder_decoder") is True or known in DECODERS_OF_ENCODER_DECODERS:
        return (f"`model_type`: {known or shorten(model_type)} is the decoder of an encoder-decoder model (it "
                "cross-attends to an encoder's output); attnspec imports decoder-only language models")
    if known in ENCODERS:
        return (f"`model_type`: {known} is an encoder (trained bidirectionally; transformers runs it "
                "as a decoder with `is_decoder`); attnspec imports decoder-only language models")
    if known in LACKS:
        field, part = LACKS[known]
        return f"`{field}`: {model_type} needs {part}; attnspec cannot import it yet"
    if known is not None:
        return (f"`model_type`: {model_type} is a decoder-only type no attnspec family maps yet (nobody has held its "
                "modelling code to attnspec's parts); `attnspec import-hf --help` lists the types that import")
    return (f"`model_type`: {shorten(model_type)} is not a causal language model type of transformers "
            f"{TRANSFORMERS_VERSION}; `attnspec import-hf --help` lists the types that import")
