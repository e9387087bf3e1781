"""The spec layer: IR, front-ends (YAML, grammar), composition, validation, emitters. No torch here.

Names are imported on first use, so that ``import attnspec.spec.ir`` (pydantic) or
``attnspec.spec.limits`` does not also load the front-ends (PyYAML, lark) for code that needs
only the IR, such as loading a build directory.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "spec_to_data": "emit", "to_attn": "emit", "to_yaml": "emit",
    "Spec": "ir", "iter_blocks": "walk",
    "load_data": "load", "load_spec": "load", "loads_spec": "load",
    "json_schema": "schema", "reference_markdown": "schema",
    "validate_data": "validate",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'attnspec.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnspec.spec.{_LAZY[name]}"), name)


__all__ = sorted(_LAZY)
