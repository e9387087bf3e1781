"""attnspec: a declarative model-composition DSL and compiler for sequence mixers.

The spec layer (``attnspec.spec``) is importable without torch. The model-building
API (``attnspec.build``, ``attnspec.load``) lives in the compiler and is imported on
first use, so ``attnspec check`` stays fast.
"""

from __future__ import annotations

from typing import Any

from attnspec.errors import AttnSpecError, BuildError, ShapeError, SpecError
from attnspec.spec import load_spec, loads_spec

__version__ = "0.1.0"

__all__ = ["AttnSpecError", "SpecError", "ShapeError", "BuildError", "load_spec", "loads_spec",
           "build", "load", "__version__"]


def build(spec_or_path: Any, *overrides: str, **kwargs: Any) -> Any:
    """Build an eager ``nn.Module`` from a spec (path, dict or Spec); see :func:`attnspec.compiler.build_model`."""
    from attnspec.compiler import build_model

    return build_model(spec_or_path, *overrides, **kwargs)


def load(directory: Any) -> Any:
    """Load a build directory written by ``attnspec build``; see :func:`attnspec.compiler.load_model`."""
    from attnspec.compiler import load_model

    return load_model(directory)
