"""``nn.Module``s built from the IR: feature maps, transitions, mixers, blocks and the model."""

from attnspec.nn.model import Block, Mlp, Model, build_model_from_spec, redraw_random_features
from attnspec.nn.registry import REGISTRY, build, register

__all__ = ["Model", "Block", "Mlp", "build_model_from_spec", "redraw_random_features", "REGISTRY", "build",
           "register"]
