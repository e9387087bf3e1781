"""Property tests: any mutation of a valid spec, and any text, gives a Spec or a SpecError, nothing else."""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnspec.errors import SpecError
from attnspec.spec import load_data, loads_spec, validate_data
from attnspec.spec.compose import apply_override
from attnspec.spec.source import SourceMap
from tests.conftest import SPECS

VALID = [load_data(path)[0] for path in SPECS]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5000), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["relu", "exp", "identity", "cos", "data", "fixed", "lsh", "local",
                                           "chunk", "scan", "quadratic", "softmax", "linear", "scatterbrain",
                                           "performer", "aoglu", "none", "tokens", "lm", "classifier"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


@st.composite
def mutated_specs(draw):
    data = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(values)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_mutated_specs_validate_or_raise_spec_error(data):
    try:
        validate_data(data)
    except SpecError as error:
        assert error.problems and all(p.message for p in error.problems)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_text_parses_or_raises_spec_error(text):
    for fmt in ("yaml", "attn"):
        try:
            loads_spec(text, fmt)
        except SpecError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(VALID), st.text(max_size=40))
def test_random_overrides_apply_or_raise_spec_error(data, assignment):
    try:
        validate_data(apply_override(data, SourceMap(), assignment))
    except SpecError:
        pass


@settings(max_examples=100, deadline=None)
@given(mutated_specs())
def test_mutated_specs_as_yaml_text(data):
    try:
        loads_spec(yaml.safe_dump(data), "yaml")
    except SpecError:
        pass
