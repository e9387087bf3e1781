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

INKLING = ("a relative position bias computed from learned relative states (`d_rel`, `rel_extent`) and logits "
           "scaled logarithmically past `log_scaling_n_floor`")
DOTS3 = ("latent attention with a sigmoid gate per head (`g_proj`), an RMSNorm of the shared RoPE key "
         "(`k_rope_only_layernorm`), latents rescaled by sqrt(hidden / rank) and sliding-window latent layers "
         "(`layer_types`) beside its DeepSeek Sparse Attention ones")
"""What dots.llm3's text model needs beyond DeepSeek Sparse Attention."""

LACKS: dict[str, tuple[str, str]] = {
    "phimoe": ("model_type", "the SparseMixer router (experts chosen and weighted by masked softmaxes, not top-k of "
                             "one softmax)"),
    "reformer": ("attn_layers", "LSH attention and local chunked attention"),
    "xlnet": ("model_type", "permutation language modelling with two-stream relative attention"),
    "axk2": ("gated_norm_rank", "RMSNorms followed by a low-rank sigmoid gate of their output (`gated_norm_rank`) and a "
                                "query projection reading the query latent before and after its norm side by side, "
                                "fused with a sigmoid output gate (`q_gate_proj`), beside its DeepSeek Sparse "
                                "Attention"),
    "deepseek_v4": ("hc_mult", "hyper-connections (`hc_mult` residual streams mixed by learned maps) and compressed "
                               "sparse attention (keys pooled per `layer_types` and chosen by an indexer)"),
    "hy_v4": ("hc_mult", "hyper-connections (`hc_mult` residual streams mixed by learned maps) and a sparse-attention "
                         "indexer choosing `index_topk` keys per query"),
    "qwen4_exp": ("hc_count", "hyper-connections (`hc_count` residual streams), per-layer n-gram embeddings "
                              "(`ple_layer_ids`, `ngram_size`) and a sparse-attention indexer (`indexer_budget`)"),
    "qwen4_exp_text": ("hc_count", "hyper-connections (`hc_count` residual streams), per-layer n-gram embeddings "
                                   "(`ple_layer_ids`, `ngram_size`) and a sparse-attention indexer (`indexer_budget`)"),
    "axk1": ("model_type", "an RMSNorm of the experts' output before the residual on its expert layers alone "
                           "(`post_mlp_layernorm`), where attnspec's output norms are every sub-layer's or none"),
    "beam": ("layer_types", "queries scaled by a function of their position on its global layers (no positions, "
                            "Llama 4's temperature tuning) and a bias per head on its sigmoid output gate"),
    "doge": ("keep_window_size", "dynamic mask attention (a learned mask per head computed from the values, keeping "
                                 "the `keep_window_size` highest-scoring keys)"),
    "dory": ("n_recurrent_loops", "a section of layers run `n_recurrent_loops` times with the same weights, each "
                                  "loop with its own cache, and nGPT's normalised residual interpolation"),
    "hrm_text": ("H_cycles", "the Hierarchical Reasoning Model's nested recurrence of two layer stacks "
                             "(`H_cycles` x `L_cycles`)"),
    "inkling_text": ("d_rel", INKLING),
    "gemma3n_text": ("hidden_size_per_layer_input", "per-layer input embeddings, AltUp's predicted and corrected "
                                                    "residual streams, LAuReL's low-rank residual and activation "
                                                    "sparsity"),
    "gemma3n": ("text_config.hidden_size_per_layer_input", "in its text model, per-layer input embeddings, AltUp's "
                                                           "residual streams and LAuReL's low-rank residual"),
    "lfm3": ("rope_parameters.full_attention.rope_type", "the `proportional` RoPE of its global layers (frequencies "
                                                         "spread over the whole head, the unrotated part left as it "
                                                         "is) and a sigmoid gate per head (`use_attention_gate`: one "
                                                         "scalar scaling each head's output)"),
    "blt": ("patch_size", "the Byte Latent Transformer's byte-level local encoder and decoder around a global "
                          "transformer over patches an entropy model chooses"),
    "cpmant": ("position_bias_num_buckets", "relative position biases in buckets per segment (T5's, with segment "
                                            "types) and learned prompt embeddings"),
    "mllama": ("text_config.cross_attention_layers", "cross-attention layers reading an image encoder's output "
                                                     "between its self-attention layers"),
    "zaya": ("model_type", "compressed convolutional attention (queries and keys compressed and convolved before "
                           "attention) and learned residual scaling"),
    "dots3_note_text": ("layer_types", DOTS3),
    "dots3_note": ("text_config.layer_types", "in its text model, " + DOTS3),
    "minimax_m3_vl_text": ("index_topk_blocks", "a lightning indexer choosing `index_topk_blocks` blocks of keys for "
                                                "each query (block-sparse attention)"),
    "inkling2_text": ("d_rel", INKLING),
    "inkling2_loop_text": ("d_rel", INKLING + ", and layers run in loops"),
    "gemma4_assistant": ("text_config.num_kv_shared_layers", "a draft model reading its target model's key/value "
                                                             "caches in every layer (`num_kv_shared_layers`)"),
    "gemma4_unified_assistant": ("text_config.num_kv_shared_layers", "a draft model reading its target model's "
                                                                     "key/value caches in every layer"),
    "longcat_flash": ("zero_expert_num", "zero-computation experts (`zero_expert_num`: a token routed there passes "
                                         "unchanged) and two attentions and MLPs in each layer"),
    "bailing_hybrid": ("kda_safe_gate", "Kimi Delta Attention with a forget gate bounded below (`kda_safe_gate`, "
                                        "`kda_lower_bound`; attnspec's KDA gate is unbounded)"),
    "phi4_multimodal": ("model_type", "vision and speech LoRA adapters inside its language model's layers, chosen "
                                      "by each input's modality"),
    "moshi": ("model_type", "a speech model: a temporal transformer over text and audio-codebook tokens with a depth "
                            "transformer at each step"),
    "moss_transcribe_diarize": ("model_type", "a speech recognition model: an audio encoder's features spliced "
                                              "into its decoder's input"),
    "git": ("model_type", "GIT's image-to-text decoder: BERT-style post-norm layers with absolute positions whose "
                          "prompt is an image encoder's tokens"),
    "zamba": ("model_type", "Zamba's shared attention block reading the hidden state concatenated with the original "
                            "embeddings (2 x hidden_size) between Mamba-1 layers"),
    "modernbert-decoder": ("model_type", "ModernBERT's prediction head (a dense layer, activation and LayerNorm "
                                         "before the decoder) and its embedding norm"),
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
