"""Every size attnspec accepts has a limit, and this module is where each one is written down.

Specs are often written by someone else (a colleague's ablation, a paper's release), so nothing
they say may make attnspec run unbounded: a YAML alias bomb, `repeat: 1000000000`, a 10,000-digit
number or a 1 GB file are refused at parse or validation time with a located error that names the
limit. The IR (:mod:`attnspec.spec.ir`) reads the model limits from here, the front-ends the text
limits; docs/trust.md's "Limits" table lists them. The values are far above any model these tools are
for (a 2-core CPU to a single GPU) and far below what would exhaust memory before an error.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- text
MAX_SPEC_BYTES = 1 << 20
"""Size of a spec file, spec text or `--set` value (1 MiB; shipped specs are under 1 KiB)."""
MAX_DEPTH = 32
"""Nesting of mappings and lists (shipped specs nest at most 7 deep)."""
MAX_VALUES = 100_000
"""Values in one spec after YAML aliases are expanded (an alias bomb expands to billions)."""
MAX_NUMBER_CHARS = 64
"""Characters of one number literal (Python refuses integers of more than 4,300 digits)."""
MAX_STRING_CHARS = 4096
"""Characters of one string value (names are limited further, below)."""
MAX_NAME_CHARS = 128
"""Characters of the model name."""

# ----------------------------------------------------------------------------- the model
MAX_BLOCKS = 256
"""Blocks in the model after every `repeat` is expanded."""
MAX_REPEAT = 256
"""`repeat` count of one group."""
MAX_D_MODEL = 8192
MAX_HEADS = 256
MAX_HEAD_WIDTH = 1024
"""`d_qk` and `d_v`: per-head widths."""
MAX_INNER = 1 << 15
"""`d_inner`: channels of a Mamba-1 scan (Falcon-Mamba-7B has 8,192)."""
MAX_VOCAB = 1 << 20
"""`vocab_size` (about a million token ids)."""
MAX_INPUT_DIM = 1 << 16
"""`dim` of real-valued inputs."""
MAX_CLASSES = 1 << 20
MAX_LEN = 1 << 20
"""`max_len`: the longest sequence (1,048,576 positions)."""
MAX_CHUNK = 4096
"""`chunk_size` of the chunked mode."""
MAX_CONV_WIDTH = 64
"""`width` of a short convolution."""
MAX_FEATURES = 1 << 16
"""Random or trainable features per head (Performer `num_features`)."""
MAX_BUCKETS = 4096
"""LSH buckets per round."""
MAX_ROUNDS = 64
"""LSH hash rounds."""
MAX_SUPPORT = 1 << 20
"""Keys per query of a sparse support (`capacity`, `window`, block `size`) and the cos horizon `M`."""
MAX_EXPANSION = 64
"""MLP hidden width as a multiple of `d_model`."""
MAX_EXPERTS = 1024
"""Routed experts of a mixture-of-experts MLP (DeepSeek-V3 has 256)."""
MAX_STACK = 16
"""Units stacked in a trainable feature map."""
MAX_SEED = (1 << 31) - 1
"""Seeds are in [0, 2^31 - 1]: seeds are added together (model seed, component seed, block index
times a prime, redraw steps) and must stay within what torch.Generator accepts."""
MAX_STEPS = 1 << 40
"""Step counts such as Performer's `redraw_interval`."""
MAX_RATIO = 1000
"""Each side of Scatterbrain's `ratio`."""
MAX_PARAMETERS = 1 << 32
"""Parameters of one model (16 GiB of float32 weights), checked before anything is allocated."""
MAX_DECODE_STATE_BYTES = 1 << 34
"""Bytes of the decoding state one generation allocates, all its rows together (16 GiB, as the
parameters): recurrent states and key/value caches at their capacity (``max_len`` or the window).
Checked per sequence when a model is built or loaded, and for the batch before any state is
allocated (``generate``, ``prefill``, ``init_state``, ``attnspec run``, ``from_pretrained``)."""

TABLE: list[tuple[str, str, int]] = [
    ("spec file, spec text or --set value", "bytes", MAX_SPEC_BYTES),
    ("nesting of mappings and lists", "levels", MAX_DEPTH),
    ("values after YAML aliases are expanded", "values", MAX_VALUES),
    ("one number literal", "characters", MAX_NUMBER_CHARS),
    ("one string value", "characters", MAX_STRING_CHARS),
    ("name", "characters", MAX_NAME_CHARS),
    ("blocks after expanding `repeat`", "blocks", MAX_BLOCKS),
    ("repeat", "copies", MAX_REPEAT),
    ("d_model", "", MAX_D_MODEL),
    ("heads", "", MAX_HEADS),
    ("d_qk, d_v", "", MAX_HEAD_WIDTH),
    ("d_inner of a mamba mixer", "", MAX_INNER),
    ("vocab_size", "", MAX_VOCAB),
    ("input dim", "", MAX_INPUT_DIM),
    ("classifier classes", "", MAX_CLASSES),
    ("max_len", "positions", MAX_LEN),
    ("chunk_size", "positions", MAX_CHUNK),
    ("short convolution width", "positions", MAX_CONV_WIDTH),
    ("num_features", "", MAX_FEATURES),
    ("LSH buckets", "", MAX_BUCKETS),
    ("LSH rounds", "", MAX_ROUNDS),
    ("capacity, window, block size, cos M", "", MAX_SUPPORT),
    ("MLP expansion", "", MAX_EXPANSION),
    ("experts of an MoE MLP", "", MAX_EXPERTS),
    ("trainable kernel stack", "units", MAX_STACK),
    ("seeds (any seed field)", "", MAX_SEED),
    ("redraw_interval", "steps", MAX_STEPS),
    ("each side of a Scatterbrain ratio", "", MAX_RATIO),
    ("parameters of a model", "", MAX_PARAMETERS),
    ("decoding state of one generation (every row, at capacity)", "bytes", MAX_DECODE_STATE_BYTES),
]
"""(what, unit, limit) rows for docs/trust.md's table and the generated reference."""
