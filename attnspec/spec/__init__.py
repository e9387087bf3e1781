"""The spec layer: IR, front-ends (YAML, grammar), composition, validation, emitters. No torch here."""

from attnspec.spec.emit import spec_to_data, to_attn, to_yaml
from attnspec.spec.ir import Spec, iter_blocks
from attnspec.spec.load import load_data, load_spec, loads_spec
from attnspec.spec.schema import json_schema, reference_markdown
from attnspec.spec.validate import validate_data

__all__ = [
    "Spec", "iter_blocks", "load_spec", "loads_spec", "load_data", "validate_data",
    "spec_to_data", "to_yaml", "to_attn", "json_schema", "reference_markdown",
]
