"""Softmax attention: the op (:mod:`.attention`) and its float64 reference by loops (:mod:`.naive`)."""

from attnspec.ops.softmax.attention import decay_bias, softmax_attention

__all__ = ["decay_bias", "softmax_attention"]
