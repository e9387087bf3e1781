"""The compiler (``attnspec.compiler``): plan, lower, compile, export, load, verify, run.

Public API: :func:`build_model` (spec -> eager, planned model), :func:`load_model` (build
directory -> model), :func:`build_directory` (the ``attnspec build`` job).
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: loading a build directory needs neither the spec front-ends nor the
# build machinery (rich, torch.compile, export), and `import attnspec.compiler.manifest` stays light.
_LAZY = {"build_model": "lower", "count_parameters": "sizes", "plan_spec": "plan", "load_model": "load",
         "build_directory": "build"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'attnspec.compiler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnspec.compiler.{_LAZY[name]}"), name)


__all__ = sorted(_LAZY)
