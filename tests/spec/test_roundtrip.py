"""Front-ends and emitters agree: YAML -> IR -> grammar -> IR -> YAML is the identity on the IR."""

from __future__ import annotations

import pytest

from attnspec.spec import iter_blocks, load_spec, loads_spec, to_attn, to_yaml
from tests.conftest import SPECS


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_yaml_grammar_yaml_roundtrip_is_identity(path):
    written = load_spec(path, resolved=False)
    via_grammar = loads_spec(to_attn(written), "attn", resolved=False)
    assert via_grammar == written
    via_yaml = loads_spec(to_yaml(via_grammar), "yaml", resolved=False)
    assert via_yaml == written


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_resolved_spec_revalidates_to_itself(path):
    resolved = load_spec(path)
    again = loads_spec(to_yaml(resolved, minimal=False), "yaml")
    assert again == resolved
    for _, block in iter_blocks(resolved):
        assert block.mixer.d_qk and block.mixer.d_v and block.mixer.scale


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_specs_have_header_and_modeline(path):
    lines = path.read_text().splitlines()
    assert lines[0] == "# yaml-language-server: $schema=../schema/attnspec.schema.json"
    assert lines[1].startswith("# ") and len(lines[1]) > 20, "a comment header naming the source"


def test_string_shorthand_equals_full_form():
    base = 'name = "t"\ninput = tokens(vocab_size=4)\nd_model = 8\nmax_len = 8\n'
    short = loads_spec(base + "layers { block { mixer = linear(feature_map=relu) mlp = none } }", "attn")
    full = loads_spec(base + "layers { block { mixer = linear(feature_map=relu()) mlp = { kind = none } } }", "attn")
    assert short == full


def test_scatterbrain_sum_syntax():
    text = ('name = "t"\ninput = tokens(vocab_size=4)\nd_model = 8\nmax_len = 64\n'
            "layers { block { mixer = scatterbrain(lowrank(performer(num_features=5)) + sparse(local(window=7))) } }")
    mixer = loads_spec(text, "attn").layers[0].mixer
    assert mixer.lowrank.num_features == 5 and mixer.sparse.window == 7


def test_override_expands_shorthand_and_budget_derivation():
    spec = load_spec(SPECS[0].parent / "scatterbrain.yaml")
    mixer = spec.layers[0].layers[0].mixer
    # budget 1/8 of max_len 1024 = 128 keys per query, 3:1 -> 96 sparse (48 per round), 32 features
    assert (mixer.lowrank.num_features, mixer.sparse.capacity) == (32, 48)
    tweaked = load_spec(SPECS[0].parent / "gateloop.yaml", ["layers[0].layers[0].mixer.transition.magnitude=stable_exp"])
    assert tweaked.layers[0].layers[0].mixer.transition.magnitude == "stable_exp"


def test_an_emitted_spec_names_the_schema_as_the_shipped_specs_do(tmp_path):
    """``fmt --to yaml`` and ``import-hf --spec`` write a modeline whose path, relative to the written file's
    folder, reaches the committed schema (not a URL that does not resolve); a build's record has none."""
    from attnspec.spec import load_spec
    from attnspec.spec.emit import SCHEMA_FILE, to_yaml

    spec = load_spec(SPECS[0], ())
    for folder in (SPECS[0].parent, tmp_path):
        first = to_yaml(spec, folder=folder).splitlines()[0]
        relative = first.removeprefix("# yaml-language-server: $schema=")
        assert relative != first and (folder / relative).resolve() == SCHEMA_FILE.resolve()
    assert to_yaml(spec, folder=SPECS[0].parent).splitlines()[0] == SPECS[0].read_text().splitlines()[0]
    assert not to_yaml(spec).startswith("#")
