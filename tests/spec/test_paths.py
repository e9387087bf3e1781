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
from attnspec.spec.walk import block_labels, iter_blocks

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _mixers(spec) -> list:
    return [block.mixer for _, block in iter_blocks(spec)]


def test_parse_wildcards():
    assert parse_dotted_path("layers[*].mixer.heads") == ("layers", EVERY, "mixer", "heads")
    assert parse_dotted_path("blocks[2].mixer") == ("blocks", 2, "mixer")
    for bad in ("blocks.mixer", "blocks", "[*].x", "layers[*", "layers[-1]"):
        with pytest.raises(ValueError):
            parse_dotted_path(bad)


def _heads(spec) -> list[int]:
    return [block.mixer.heads for _, block in iter_blocks(spec, expand=True)]


def test_blocks_wildcard_reaches_blocks_inside_nested_repeat_groups():
    spec = load_spec(SPECS / "hybrid.yaml", ["blocks[*].mixer.heads=8"])
    assert [m.heads for m in _mixers(spec)] == [8, 8] and _heads(spec) == [8] * 8


@pytest.mark.parametrize("index", range(8))
def test_blocks_n_is_the_model_s_n_th_block_even_inside_repeat_copies(index):
    """hybrid is 2 x (3 x gateloop, softmax): blocks[N] is the N-th of the 8 blocks explain and the
    build summary label; its copy is written out, the other copies keep their repeat groups."""
    spec = load_spec(SPECS / "hybrid.yaml", [f"blocks[{index}].mixer.heads=2"])
    assert _heads(spec) == [2 if i == index else 4 for i in range(8)]
    labels = block_labels(spec)
    assert labels[index].startswith(f"blocks[{index}] (") and len(labels) == 8
    plain = load_spec(SPECS / "hybrid.yaml")
    assert [b.mixer.kind for _, b in iter_blocks(spec, expand=True)] == \
        [b.mixer.kind for _, b in iter_blocks(plain, expand=True)]


def test_a_label_names_the_copy_of_every_repeat_group():
    labels = block_labels(load_spec(SPECS / "hybrid.yaml"))
    assert labels[5] == "blocks[5] (layers[0]#1.layers[0]#1.layers[0])"  # outer copy 1, inner copy 1
    assert labels[7] == "blocks[7] (layers[0]#1.layers[1])"


def test_two_overrides_of_copies_of_one_group_compose():
    spec = load_spec(SPECS / "hybrid.yaml", ["blocks[7].mixer.heads=2", "blocks[1].mixer.heads=8"])
    assert _heads(spec) == [4, 8, 4, 4, 4, 4, 4, 2]


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
        load_spec(SPECS / "hybrid.yaml", ["blocks[8].mixer.heads=2"])
    assert "--set blocks[8]" in str(error.value) and "matches nothing" in str(error.value)
    assert "blocks[0] to blocks[7]" in str(error.value)
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
          "layers[0].layers[0].layers[0].mixer.transition.per": channel
          "layers[0].layers[1].mixer": {kind: linear, heads: 2, feature_map: elu1}
        """))
    spec = load_spec(tmp_path / "child.yaml")
    first, second = _mixers(spec)
    assert spec.name == "child" and first.transition.per == "channel" and first.heads == 4
    assert (second.kind, second.heads, second.feature_map.kind) == ("linear", 2, "elu1")
    assert len(spec.layers) == 1 and spec.layers[0].repeat == 2  # the list was patched, not replaced


def test_set_errors_point_at_the_file(tmp_path: Path):
    (tmp_path / "base.yaml").write_text((SPECS / "hybrid.yaml").read_text())
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nset:\n  \"blocks[9].mixer.heads\": 2\n")
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


def test_an_unrolled_copy_keeps_the_file_positions_of_what_moved(tmp_path: Path):
    """blocks[1] splits both repeat groups; the softmax block after them moves, and an error in it still
    points at its line in the base file (once per copy)."""
    base = (SPECS / "hybrid.yaml").read_text().replace("- mixer: {kind: softmax, heads: 4}",
                                                       "- mixer: {kind: softmax, heads: 4, chunk_size: 3}")
    (tmp_path / "base.yaml").write_text(base)
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nset:\n  \"blocks[1].mixer.heads\": 2\n")
    line = next(n for n, text in enumerate(base.splitlines(), 1) if "chunk_size: 3" in text)
    with pytest.raises(SpecError) as error:
        load_spec(tmp_path / "child.yaml")
    assert str(error.value).count(f"base.yaml:{line}:") == 2 and "power of two" in str(error.value)


def test_addressing_a_block_of_hostile_nested_groups_ends_at_once():
    from attnspec.spec.compose import expanded_blocks

    group: dict = {"repeat": 256, "layers": []}
    for _ in range(6):  # 256^6 copies of nothing: the walk gives up after a bounded number of steps
        group = {"repeat": 256, "layers": [group]}
    assert expanded_blocks({"layers": [group]}, stop=10 ** 9) == []
    data = {"name": "x", "input": {"kind": "tokens", "vocab_size": 8}, "d_model": 8, "max_len": 8, "layers": [group]}
    with pytest.raises(SpecError, match="the spec has no blocks"):
        load_spec(data, ["blocks[3].mixer.heads=2"])


def test_blocks_n_in_a_group_whose_repeat_is_not_a_count_is_a_located_error():
    data = {"name": "x", "input": {"kind": "tokens", "vocab_size": 8}, "d_model": 8, "max_len": 8,
            "layers": [{"repeat": "three", "layers": [{"mixer": {"kind": "softmax", "heads": 2}}]}]}
    with pytest.raises(SpecError, match="repeat"):
        load_spec(data, ["blocks[0].mixer.heads=4"])


def test_one_copy_of_each_group_keeps_every_distinct_block_in_order():
    """What the compile check builds of a deep model: hybrid is 2 x (3 x gateloop, softmax), so one copy
    of each group is (gateloop, softmax), the blocks first_copies marks. An override of blocks[5] writes
    the second copy out of its group (four groups of one copy): all four stay."""
    from attnspec.spec.emit import spec_to_data
    from attnspec.spec.validate import validate_data
    from attnspec.spec.walk import first_copies, one_copy_each

    for overrides, kept in (((), [0, 3]), (("blocks[5].mixer.heads=2",), [0, 3, 4, 5, 6, 7])):
        spec = load_spec(SPECS / "hybrid.yaml", list(overrides))
        assert [i for i, first in enumerate(first_copies(spec)) if first] == kept
        shallow = validate_data(one_copy_each(spec_to_data(spec, minimal=False)))
        blocks = [block for _, block in iter_blocks(spec, expand=True)]
        assert [block for _, block in iter_blocks(shallow, expand=True)] == [blocks[i] for i in kept]


def test_an_override_of_one_place_leaves_another_that_shared_its_object_alone():
    """A spec from Python may list one layer dict twice (``[block] * 2``); setting one block's field must not
    change the other (a deep copy keeps the sharing), nor the caller's data."""
    from attnspec.spec.load import load_data

    block = {"mixer": {"kind": "softmax", "heads": 4, "kv_heads": 2}}
    data = {"name": "shared", "input": {"kind": "tokens", "vocab_size": 8}, "d_model": 16, "max_len": 8,
            "layers": [block] * 2}
    edited, _ = load_data(data, ["blocks[1].mixer.kv_heads=4", "blocks[0].mixer.heads=2"])
    assert [layer["mixer"]["kv_heads"] for layer in edited["layers"]] == [2, 4]
    assert [layer["mixer"]["heads"] for layer in edited["layers"]] == [2, 4]
    assert block == {"mixer": {"kind": "softmax", "heads": 4, "kv_heads": 2}}


def test_a_slice_of_blocks_sets_each_as_blocks_n():
    """``blocks[3::4]`` (one in four, from the fourth: a hybrid's swap) sets blocks 3 and 7 of a 10-block
    ``repeat``, unrolling the copies around them; a slice that picks nothing, or one outside ``blocks``,
    is a located error."""
    from attnspec.spec.load import load_data

    data = {"name": "ten", "input": {"kind": "tokens", "vocab_size": 8}, "d_model": 16, "max_len": 8,
            "layers": [{"repeat": 10, "layers": [{"mixer": {"kind": "softmax", "heads": 2}}]}]}
    edited, _ = load_data(data, ["blocks[3::4].mixer={kind: delta, heads: 2}", "blocks[:2].mixer.heads=4"])
    spec = load_spec(edited)
    assert [m.kind for m in _expanded_mixers(spec)] == ["softmax"] * 3 + ["delta"] + ["softmax"] * 3 + ["delta"] + \
        ["softmax"] * 2
    assert [m.heads for m in _expanded_mixers(spec)][:3] == [4, 4, 2]
    with pytest.raises(SpecError, match="picks no block; the spec has 10 block"):
        load_data(data, ["blocks[12:].mixer.heads=4"])
    with pytest.raises(SpecError, match="a slice"):
        load_data(data, ["layers[0:1].repeat=2"])


def _expanded_mixers(spec) -> list:
    return [block.mixer for _, block in iter_blocks(spec, expand=True)]
