"""The path language of ``--set``, a spec's ``set:`` and sweep variants: wildcards, ``blocks[*]``,
replacing components, patching inside lists from ``extends``; errors located and nothing matched
is an error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from attnspec.errors import SpecError
from attnspec.spec import load_spec
from attnspec.spec.compose import EVERY, parse_dotted_path
from attnspec.spec.walk import iter_blocks

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _mixers(spec) -> list:
    return [block.mixer for _, block in iter_blocks(spec)]


def test_parse_wildcards():
    assert parse_dotted_path("layers[*].mixer.heads") == ("layers", EVERY, "mixer", "heads")
    assert parse_dotted_path("blocks[2].mixer") == ("blocks", 2, "mixer")
    for bad in ("blocks.mixer", "blocks", "[*].x", "layers[*", "layers[-1]"):
        with pytest.raises(ValueError):
            parse_dotted_path(bad)


def test_blocks_wildcard_reaches_blocks_inside_nested_repeat_groups():
    spec = load_spec(SPECS / "hybrid.yaml", ["blocks[*].mixer.heads=8"])
    assert [m.heads for m in _mixers(spec)] == [8, 8]
    spec = load_spec(SPECS / "hybrid.yaml", ["blocks[1].mixer.heads=2"])
    assert [m.heads for m in _mixers(spec)] == [4, 2]


def test_list_wildcard_sets_every_item():
    spec = load_spec(SPECS / "softmax-transformer.yaml", ["blocks[*].mixer.heads=2"])
    flat = load_spec({**_flat_two_blocks()}, ["layers[*].mixer.heads=2"])
    assert all(m.heads == 2 for m in _mixers(spec)) and [m.heads for m in _mixers(flat)] == [2, 2]


def test_replacing_a_component_drops_the_old_fields():
    spec = load_spec(SPECS / "gateloop.yaml", ["blocks[*].mixer={kind: softmax, heads: 4}"])
    assert [(m.kind, m.heads) for m in _mixers(spec)] == [("softmax", 4)]


def test_changing_a_kind_keeps_only_the_fields_the_new_kind_has():
    spec = load_spec(SPECS / "linear-elu.yaml", ["blocks[*].mixer.kind=softmax"])
    (mixer,) = _mixers(spec)
    base = _mixers(load_spec(SPECS / "linear-elu.yaml"))[0]
    assert mixer.kind == "softmax" and mixer.heads == base.heads  # `heads` kept, `feature_map` dropped


def test_a_pattern_that_matches_nothing_is_a_located_error():
    with pytest.raises(SpecError) as error:
        load_spec(SPECS / "hybrid.yaml", ["blocks[5].mixer.heads=2"])
    assert "--set blocks[5]" in str(error.value) and "matches nothing" in str(error.value)
    assert "blocks[0] to blocks[1]" in str(error.value)
    with pytest.raises(SpecError, match="matches nothing"):
        load_spec(SPECS / "hybrid.yaml", ["nothing[*].x=1"])


def test_a_block_key_on_a_group_says_to_use_blocks():
    with pytest.raises(SpecError) as error:
        load_spec(SPECS / "hybrid.yaml", ["layers[*].mixer.heads=2"])
    assert "--set layers[*].mixer.heads=2" in str(error.value) and "`blocks[*]`" in str(error.value)


def test_an_error_in_a_wildcard_value_points_at_the_override():
    with pytest.raises(SpecError) as error:
        load_spec(SPECS / "hybrid.yaml", ["blocks[*].mixer.heads=0"])
    assert "--set blocks[*].mixer.heads=0" in str(error.value)


def test_extends_patches_inside_lists_with_set(tmp_path: Path):
    (tmp_path / "base.yaml").write_text((SPECS / "hybrid.yaml").read_text())
    (tmp_path / "child.yaml").write_text(textwrap.dedent("""\
        extends: base.yaml
        name: child
        set:
          "blocks[0].mixer.transition.per": channel
          "blocks[1].mixer": {kind: linear, heads: 2, feature_map: elu1}
        """))
    spec = load_spec(tmp_path / "child.yaml")
    first, second = _mixers(spec)
    assert spec.name == "child" and first.transition.per == "channel" and first.heads == 4
    assert (second.kind, second.heads, second.feature_map.kind) == ("linear", 2, "elu1")
    assert len(spec.layers) == 1 and spec.layers[0].repeat == 2  # the list was patched, not replaced


def test_set_errors_point_at_the_file(tmp_path: Path):
    (tmp_path / "base.yaml").write_text((SPECS / "hybrid.yaml").read_text())
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nset:\n  \"blocks[7].mixer.heads\": 2\n")
    with pytest.raises(SpecError) as error:
        load_spec(tmp_path / "child.yaml")
    assert "child.yaml:3:3" in str(error.value)
    (tmp_path / "bad.yaml").write_text("extends: base.yaml\nset:\n  \"blocks[*].mixer.heads\": -1\n")
    with pytest.raises(SpecError) as error:
        load_spec(tmp_path / "bad.yaml")
    assert "bad.yaml:3:28" in str(error.value)
    (tmp_path / "list.yaml").write_text("extends: base.yaml\nset: [1]\n")
    with pytest.raises(SpecError, match="`set` must be a mapping"):
        load_spec(tmp_path / "list.yaml")


def _flat_two_blocks() -> dict:
    block = {"mixer": {"kind": "softmax", "heads": 4}}
    return {"name": "flat", "input": {"kind": "tokens", "vocab_size": 32}, "d_model": 16, "max_len": 32,
            "layers": [block, dict(block)]}
