"""Specs written to hurt: unbounded expansion, deep nesting, YAML 1.1 coercions, tags, huge numbers,
special files and `extends` that reaches outside the spec's directory. Each is a located SpecError,
fast, and never a RecursionError, ValueError, JSONDecodeError or a hang.

The marker ``⟪`` stands before the node the error must point at (as in test_error_corpus.py).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from attnspec.errors import SpecError
from attnspec.spec import limits, load_spec, loads_spec
from tests.spec.test_error_corpus import BASE, _locate_marker, yaml_with

LAYERS = "layers:\n  - mixer: {kind: linear, heads: 2}\n"
HEAD = "name: t\ninput: {kind: tokens, vocab_size: 32}\nd_model: 16\nmax_len: 64\n"

CASES = [
    # --- YAML 1.1 forms PyYAML would have read differently: errors saying what to write
    ("leading-zero", HEAD.replace("d_model: 16", "d_model: ⟪016") + LAYERS, ["leading zero", "octal (14)", "write 16"]),
    ("hex", HEAD.replace("d_model: 16", "d_model: ⟪0x10") + LAYERS, ["hexadecimal", "write 16"]),
    ("sexagesimal", HEAD.replace("max_len: 64", "max_len: ⟪1:04") + LAYERS, ["base-60", "write 64"]),
    ("underscore", HEAD.replace("max_len: 64", "max_len: ⟪6_4") + LAYERS, ["digit separator", "write 64"]),
    ("yes", yaml_with("causal: ⟪yes\n"), ["YAML 1.1", "write true"]),
    ("off", yaml_with("causal: ⟪Off\n"), ["write false"]),
    ("merge-key", HEAD + "⟪<<: {seed: 1}\n" + LAYERS, ["merge keys", "extends"]),
    # --- tags: a spec is plain data
    ("python-tag", HEAD.replace("name: t", "name: ⟪!!python/object/apply:os.system [id]") + LAYERS, ["tags", "plain data"]),
    ("int-tag", HEAD.replace("d_model: 16", "d_model: ⟪!!int 16") + LAYERS, ["tags"]),
    # --- sizes
    ("huge-integer", HEAD.replace("d_model: 16", "d_model: ⟪" + "9" * 5000) + LAYERS, ["5000 characters", "64"]),
    ("repeat-billion", HEAD + "layers:\n  - repeat: ⟪1000000000\n    layers: [{mixer: {kind: linear}}]\n",
     ["less than or equal to 256", "limit"]),
    ("chunk-2-40", yaml_with("chunk_size: ⟪1099511627776\n"), ["less than or equal to 4096"]),
    ("d-model-2-32", HEAD.replace("d_model: 16", "d_model: ⟪4294967296") + LAYERS, ["less than or equal to 8192"]),
    ("vocab-10-23", HEAD.replace("vocab_size: 32", "vocab_size: ⟪100000000000000000000000") + LAYERS, ["1048576"]),
    ("negative-seed", HEAD + "seed: ⟪-1\n" + LAYERS, ["greater than or equal to 0"]),
    ("nan-eps", yaml_with("eps: ⟪.nan\n"), ["finite"]),
    ("inf-scale", yaml_with("scale: ⟪.inf\n"), ["finite"]),
    ("long-name", HEAD.replace("name: t", "name: ⟪" + "x" * 300) + LAYERS, ["at most 128 characters"]),
    ("nested-repeats", HEAD + "layers:\n  ⟪- repeat: 100\n    layers:\n      - repeat: 100\n        layers:\n"
                               "          - {mixer: {kind: linear}}\n", ["10,000 blocks", "256"]),
]


@pytest.mark.parametrize("case_id, text, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_spec_is_a_located_error(tmp_path: Path, case_id, text, words):
    clean, line, column = _locate_marker(text)
    file = tmp_path / "spec.yaml"
    file.write_text(clean)
    with pytest.raises(SpecError) as caught:
        load_spec(file)
    problem = caught.value.problems[0]
    assert (problem.source, problem.line, problem.column) == (str(file), line, column), str(problem)
    for word in words:
        assert word in str(problem), f"{word!r} not in {str(problem)!r}"
    assert len(str(problem)) < 600  # long values are shortened in messages


def test_yaml_1_2_reads_what_1_1_did_not():
    spec = loads_spec(yaml_with("eps: 1e-30\n"))  # a string under YAML 1.1
    assert spec.layers[0].mixer.eps == 1e-30
    assert loads_spec(BASE.replace("name: t", "name: '0x10'")).name == "0x10"  # quoted stays a string


def _error(text: str, fmt: str = "yaml") -> SpecError:
    with pytest.raises(SpecError) as caught:
        loads_spec(text, fmt, source="hostile")
    return caught.value


def test_alias_bomb_is_refused_after_bounded_work(monkeypatch):
    from attnspec.spec import yaml_front

    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    text = "\n".join(lines) + "\n"
    assert len(text) < 400  # expands to 9^9 = 387 million strings
    calls = []
    convert = yaml_front._Converter.convert
    monkeypatch.setattr(yaml_front._Converter, "convert", lambda self, *a: (calls.append(1), convert(self, *a))[1])
    error = _error(text)
    # The work is bounded by the value limit, not by the expansion (0.18 s measured on 2 cores).
    assert len(calls) == limits.MAX_VALUES + 1
    assert f"more than {limits.MAX_VALUES:,} values" in str(error) and error.problems[0].line is not None


@pytest.mark.parametrize("text, fmt", [
    ("a: " + "[" * 100_000, "yaml"),
    ("a:\n" + "".join(" " * i + "- \n" for i in range(0, 2000, 2)), "yaml"),
    ("a: &a [*a]", "yaml"),
    ("x = " + "[" * 5000 + "]" * 5000, "attn"),
    ("x = " + "f(" * 1000 + ")" * 1000, "attn"),
    ("layers { " + "repeat 2 { " * 600 + "}" * 600 + " }", "attn"),
])
def test_deep_nesting_is_refused_without_recursion_error(text, fmt):
    assert "levels deep" in str(_error(text, fmt))


@pytest.mark.parametrize("text, words", [
    ('name = "bad \\q escape"', ["invalid string", "escape"]),
    ('name = "raw\ttab"', ["invalid string", "control character"]),
    ("d_model = 9" + "9" * 5000, ["characters", "64"]),
    ("layers { repeat 9" + "9" * 5000 + " { } }", ["characters"]),
])
def test_attn_literals_are_located_errors(text, words):
    error = _error(text, "attn")
    assert error.problems[0].line == 1
    for word in words:
        assert word in str(error)


def test_dict_specs_are_bounded_too():
    deep: dict = {}
    node = deep
    for _ in range(2000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(SpecError, match="levels deep"):
        load_spec({"name": "t", "extra": deep})
    with pytest.raises(SpecError, match="bits"):
        load_spec({"name": "t", "d_model": 10 ** 5000})


def test_special_files_are_refused(tmp_path: Path):
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    # A FIFO with no writer would block open() forever: the refusal must come before reading.
    result: list = []
    worker = threading.Thread(target=lambda: result.append(_load_error(fifo)), daemon=True)
    worker.start()
    worker.join(5)
    assert result and "not a regular file" in result[0]
    assert "not a regular file" in _load_error(Path("/dev/zero"), suffix_ok=False)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * limits.MAX_SPEC_BYTES)
    assert "limited to" in _load_error(big)


def _load_error(path: Path, suffix_ok: bool = True) -> str:
    from attnspec.spec.load import read_text_file

    try:
        load_spec(path) if suffix_ok else read_text_file(path)
    except SpecError as error:
        return str(error)
    return "no error"


def _spec_dir(tmp_path: Path) -> Path:
    inside = tmp_path / "project"
    inside.mkdir()
    (inside / "base.yaml").write_text(HEAD + LAYERS)
    return inside


def test_extends_takes_only_paths_inside_the_spec_tree(tmp_path: Path):
    inside = _spec_dir(tmp_path)
    secret = tmp_path / "secret.yaml"
    secret.write_text("name: hunter2-secret-line\nthis is: [not, a spec\n")
    for target in ("../secret.yaml", str(secret), "sub/../../secret.yaml"):
        child = inside / "child.yaml"
        child.write_text(f"extends: {target}\nseed: 1\n")
        with pytest.raises(SpecError) as caught:
            load_spec(child)
        message = str(caught.value)
        assert "hunter2" not in message and ("outside" in message or "absolute" in message), message
        assert caught.value.problems[0].line == 1
    (inside / "link.yaml").symlink_to(secret)  # a symlink inside the tree pointing out of it
    (inside / "child.yaml").write_text("extends: link.yaml\n")
    with pytest.raises(SpecError, match="outside"):
        load_spec(inside / "child.yaml")
    (inside / "child.yaml").write_text("extends: base.yaml\nseed: 3\n")
    assert load_spec(inside / "child.yaml").seed == 3


def test_errors_in_an_extended_file_do_not_echo_its_text(tmp_path: Path):
    inside = _spec_dir(tmp_path)
    (inside / "base.yaml").write_text("name: private-text-here\ninput: [unclosed\n")
    (inside / "child.yaml").write_text("extends: base.yaml\n")
    with pytest.raises(SpecError) as caught:
        load_spec(inside / "child.yaml")
    problem = caught.value.problems[0]
    assert problem.source.endswith("base.yaml") and problem.line is not None
    assert problem.excerpt is None and "private-text-here" not in str(caught.value)


def test_set_values_are_read_like_specs():
    with pytest.raises(SpecError, match="leading zero"):
        load_spec(_base_data(), ["d_model=016"])
    with pytest.raises(SpecError, match="levels deep"):
        load_spec(_base_data(), ["seed=" + "[" * 1000])


def _base_data() -> dict:
    from attnspec.spec.yaml_front import parse_yaml

    return parse_yaml(BASE)[0]
