"""Pure functional kernels (no YAML, no modules): one file or folder per family, every mode beside its reference."""

from attnspec.ops.delta import delta_rule, delta_step
from attnspec.ops.features import performer_features, random_projection
from attnspec.ops.linear import MODES, Decay, PairState, linear_attention, recurrent_step
from attnspec.ops.scatterbrain import scatterbrain_attention
from attnspec.ops.softmax import decay_bias, empty_cache, softmax_attention, softmax_step
from attnspec.ops.support import Support, block_support, deduplicate, local_support, lsh_buckets, lsh_support

__all__ = [
    "MODES", "Decay", "PairState", "linear_attention", "recurrent_step", "softmax_attention", "softmax_step", "empty_cache", "decay_bias", "scatterbrain_attention",
    "delta_rule", "delta_step",
    "performer_features", "random_projection", "Support", "local_support", "block_support", "lsh_support",
    "lsh_buckets", "deduplicate",
]
