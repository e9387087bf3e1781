"""Softmax attention: the op (:mod:`.attention`), its decoding step over a key/value cache (:mod:`.cache`)
and its float64 reference by loops (:mod:`.naive`)."""

from attnspec.ops.softmax.attention import decay_bias, softmax_attention, window_mask
from attnspec.ops.softmax.cache import Cache, cache_of, empty_cache, softmax_step

__all__ = ["Cache", "cache_of", "decay_bias", "empty_cache", "softmax_attention", "softmax_step", "window_mask"]
