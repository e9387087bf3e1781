"""A corpus of malformed specs: each must raise SpecError at the marked line/column with key words.

In each text the marker ``⟪`` stands immediately before the node the error must point at;
it is removed before parsing, and its line/column is the expected location.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from attnspec.errors import SpecError
from attnspec.spec import load_spec

MARK = "⟪"

BASE = """\
name: t
input: {kind: tokens, vocab_size: 32}
d_model: 16
max_len: 64
layers:
  - mixer:
      kind: linear
      heads: 2
"""


def yaml_with(mixer_lines: str = "", top: str = "") -> str:
    """BASE plus extra mixer keys (indented under the mixer) and extra top-level lines."""
    mixer = textwrap.indent(textwrap.dedent(mixer_lines), " " * 6) if mixer_lines else ""
    return BASE + mixer + top


# (id, format, text, overrides, key words that must all appear in the message)
CASES = [
    # --- YAML syntax and structure
    ("yaml-unclosed-flow", "yaml", "name: t\ninput: {kind: tokens, vocab_size: 32\nd_model⟪: 16\n", (), ["YAML syntax error"]),
    ("yaml-bad-indent", "yaml", "name: t\n  input⟪: x\n", (), ["YAML syntax error", "mapping values"]),
    ("yaml-tab", "yaml", "name: t\n⟪\tinput: 3\n", (), ["YAML syntax error", "cannot start any token"]),
    ("yaml-duplicate-top", "yaml", BASE + "⟪d_model: 32\n", (), ["duplicate key 'd_model'", "line 3"]),
    ("yaml-duplicate-nested", "yaml", yaml_with("⟪heads: 4\n"), (), ["duplicate key 'heads'"]),
    ("yaml-not-mapping", "yaml", "⟪- a\n- b\n", (), ["must be a mapping"]),
    ("yaml-empty", "yaml", "⟪", (), ["empty"]),
    ("yaml-nonstring-key", "yaml", BASE + "⟪3: x\n", (), ["keys must be strings"]),
    # --- unknown keys and values
    ("unknown-top-key", "yaml", BASE + "⟪d_modle: 3\n", (), ["unknown key 'd_modle'", "did you mean 'd_model'"]),
    ("unknown-mixer-key", "yaml", yaml_with("⟪feture_map: relu\n"), (), ["unknown key 'feture_map'", "feature_map"]),
    ("unknown-feature-kind", "yaml", yaml_with("feature_map: {kind: ⟪rleu}\n"), (), ["unknown kind 'rleu'", "did you mean 'relu'"]),
    ("unknown-feature-shorthand", "yaml", yaml_with("feature_map: ⟪rleu\n"), (), ["unknown kind 'rleu'", "relu"]),
    ("unknown-mixer-kind", "yaml", BASE.replace("kind: linear", "kind: ⟪lineer"), (), ["unknown kind 'lineer'", "linear"]),
    ("mixer-missing-kind", "yaml", BASE.replace("      kind: linear\n", ""), (), ["missing 'kind'", "linear", "softmax"]),
    ("unknown-norm", "yaml", BASE + "    norm: ⟪batchnorm\n", (), ["unknown kind 'batchnorm'", "layernorm"]),
    ("unknown-mode", "yaml", yaml_with("mode: ⟪chunked\n"), (), ["unknown value 'chunked'", "did you mean 'chunk'"]),
    ("unknown-input-kind", "yaml", BASE.replace("input: {kind: tokens", "input: {kind: ⟪token"), (), ["unknown kind 'token'", "tokens"]),
    ("unknown-transition-key", "yaml", yaml_with("transition: {kind: data, ⟪magnitud: sigmoid}\ncausal: true\n"), (), ["unknown key 'magnitud'", "magnitude"]),
    # --- wrong types and ranges
    ("heads-string", "yaml", yaml_with().replace("heads: 2", "heads: ⟪\"2\""), (), ["expected an integer", "str"]),
    ("causal-int", "yaml", yaml_with("causal: ⟪1\n"), (), ["expected true or false"]),
    ("eps-string", "yaml", yaml_with("eps: ⟪small\n"), (), ["expected a number"]),
    ("heads-negative", "yaml", yaml_with().replace("heads: 2", "heads: ⟪-2"), (), ["greater than 0", "-2"]),
    ("d-model-zero", "yaml", BASE.replace("d_model: 16", "d_model: ⟪0"), (), ["greater than 0"]),
    ("missing-name", "yaml", "⟪" + BASE.replace("name: t\n", ""), (), ["missing required key 'name'"]),
    ("block-missing-mixer", "yaml", BASE + "  - ⟪mlp: none\n", (), ["missing required key 'mixer'"]),
    ("layers-empty", "yaml", BASE.split("layers:")[0] + "layers: ⟪[]\n", (), ["at least 1"]),
    ("repeat-zero", "yaml", BASE + "  - repeat: ⟪0\n    layers: [{mixer: softmax}]\n", (), ["greater than 0"]),
    ("layers-not-list", "yaml", BASE.split("layers:")[0] + "layers: ⟪3\n", (), ["expected a list"]),
    ("budget-above-one", "yaml", BASE.replace("kind: linear", "kind: scatterbrain") + "      budget: ⟪1.5\n", (), ["less than or equal to 1"]),
    ("ratio-three", "yaml", BASE.replace("kind: linear", "kind: scatterbrain") + "      ratio: ⟪[3, 1, 1]\n", (), ["at most 2"]),
    # --- cross-field rules
    ("rule-identity-normalised", "yaml", yaml_with("feature_map: ⟪identity\n"), (), ["non-negative feature map", "normalize: false"]),
    ("rule-exp-chunk", "yaml", yaml_with("feature_map: exp\nmode: ⟪chunk\n"), (), ["quadratic", "mode: quadratic"]),
    ("rule-softmax-recurrent", "yaml", BASE.replace("kind: linear", "kind: softmax") + "      mode: ⟪recurrent\n", (), ["only be computed", "quadratic"]),
    ("rule-cos-causal-no-m", "yaml", yaml_with("feature_map: relu\nreweighting: ⟪cos\n"), (), ["fixed M", "M: 64"]),
    ("rule-cos-small-m", "yaml", yaml_with("feature_map: relu\nreweighting: {kind: cos, M: ⟪32}\n"), (), ["below max_len", "M >= 64"]),
    ("rule-transition-noncausal", "yaml", yaml_with("causal: false\nnormalize: false\nfeature_map: identity\ntransition: ⟪data\n"), (), ["causal: true"]),
    ("rule-chunk-size", "yaml", yaml_with("chunk_size: ⟪48\n"), (), ["power of two", "48"]),
    ("rule-heads-divide", "yaml", yaml_with().replace("heads: 2", "heads: ⟪3"), (), ["not divisible", "heads"]),
    ("rule-softmax-complex", "yaml", BASE.replace("kind: linear", "kind: softmax") + "      transition: ⟪{kind: fixed, complex: true}\n", (), ["must be real", "complex: false"]),
    ("rule-softmax-per-channel", "yaml", BASE.replace("kind: linear", "kind: softmax") + "      transition: {kind: data, phase: none, per: ⟪channel}\n", (), ["per head", "per: head"]),
    ("rule-exp-unnormalised", "yaml", yaml_with("feature_map: exp\nnormalize: ⟪false\n"), (), ["normalize: true"]),
    ("rule-exp-cos", "yaml", yaml_with("feature_map: exp\nreweighting: ⟪{kind: cos, M: 64}\n"), (), ["finite features"]),
    ("rule-aoglu-rank", "yaml", yaml_with("feature_map: {kind: aoglu, rank: ⟪4}\n"), (), ["below n/2", "n/4"]),
    ("rule-performer-redraw", "yaml", yaml_with("feature_map: ⟪{kind: performer, redraw: interval}\n"), (), ["redraw_interval"]),
    ("rule-lm-head-features", "yaml", BASE.replace("input: {kind: tokens, vocab_size: 32}", "input: {kind: features, dim: 4}") + "head: ⟪lm\n", (), ["lm", "classifier"]),
    ("rule-budget-mismatch", "yaml", BASE.replace("kind: linear", "kind: scatterbrain") + "      budget: 0.5\n      lowrank: {kind: performer, num_features: ⟪3}\n", (), ["budget 0.5", "gives 8 features"]),
    ("rule-lsh-odd", "yaml", BASE.replace("kind: linear", "kind: scatterbrain") + "      sparse: {kind: lsh, buckets: ⟪7}\n", (), ["even", "7"]),
    ("rule-scatterbrain-scan", "yaml", BASE.replace("kind: linear", "kind: scatterbrain") + "      mode: ⟪scan\n", (), ["no scan mode"]),
    ("rule-lowrank-identity", "yaml", BASE.replace("kind: linear", "kind: scatterbrain") + "      lowrank: {kind: linear, feature_map: ⟪identity}\n", (), ["non-negative", "normaliser"]),
    # --- overrides
    ("set-unknown-key", "yaml", BASE, ("layers[0].mixer.feture_map=relu",), ["unknown key 'feture_map'", "feature_map", "--set"]),
    ("set-wrong-type", "yaml", BASE, ("d_model=abc",), ["expected an integer", "--set d_model=abc"]),
    ("set-malformed-path", "yaml", BASE, ("layers[0]..mixer=relu",), ["malformed path"]),
    ("set-index-range", "yaml", BASE, ("layers[5].mixer.heads=2",), ["out of range", "1 item"]),
    ("set-no-equals", "yaml", BASE, ("d_model",), ["path.to.key=value"]),
    ("set-rule", "yaml", BASE, ("layers[0].mixer.feature_map=identity",), ["non-negative", "--set"]),
    # --- grammar syntax and semantics
    ("attn-missing-equals", "attn", 'name "t"\n', (), ["syntax error", "'='"]),
    ("attn-eof", "attn", 'name = "t"\ninput = tokens(vocab_size=3⟪\n', (), ["syntax error"]),
    ("attn-bad-char", "attn", 'name = "t"\nd_model = ⟪$3\n', (), ["unexpected character '$'"]),
    ("attn-unknown-call-key", "attn", 'name = "t"\ninput = tokens(vocab_size=3)\nd_model = 8\nmax_len = 8\nlayers { block { mixer = linear(⟪heds=2) } }\n', (), ["unknown key 'heds'", "heads"]),
    ("attn-sum-outside", "attn", 'name = "t"\nmixer = ⟪a(b) + c(d)\n', (), ["only allowed as an argument"]),
    ("attn-duplicate", "attn", 'name = "t"\n⟪name = "u"\n', (), ["duplicate key 'name'"]),
    ("attn-duplicate-argument", "attn", 'name = "t"\ninput = tokens(vocab_size=3, ⟪vocab_size=4)\n', (), ["argument 'vocab_size' given twice"]),
    ("attn-bad-positional", "attn", 'name = "t"\ninput = tokens(⟪3)\n', (), ["positional argument", "key=value"]),
    ("attn-unknown-kind", "attn", 'name = "t"\ninput = tokens(vocab_size=3)\nd_model = 8\nmax_len = 8\nlayers { block { mixer = linear(feature_map=⟪rleu) } }\n', (), ["unknown kind 'rleu'", "relu"]),
    ("attn-wrong-type", "attn", 'name = "t"\ninput = tokens(vocab_size=3)\nd_model = ⟪"8"\nmax_len = 8\nlayers { block { mixer = softmax } }\n', (), ["expected an integer"]),
    ("attn-rule", "attn", 'name = "t"\ninput = tokens(vocab_size=3)\nd_model = 8\nmax_len = 8\nlayers { block { mixer = softmax(mode=⟪chunk) } }\n', (), ["only be computed", "quadratic"]),
]


def _locate_marker(text: str) -> tuple[str, int | None, int | None]:
    if MARK not in text:
        return text, None, None
    before = text[: text.index(MARK)]
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    return text.replace(MARK, ""), line, column


@pytest.mark.parametrize("case_id, fmt, text, overrides, words", CASES, ids=[c[0] for c in CASES])
def test_malformed_spec_is_reported_at_its_place(tmp_path: Path, case_id, fmt, text, overrides, words):
    clean, line, column = _locate_marker(text)
    file = tmp_path / f"spec.{fmt}"
    file.write_text(clean)
    with pytest.raises(SpecError) as caught:
        load_spec(file, overrides)
    problem = caught.value.problems[0]
    message = str(problem)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    if overrides:
        assert problem.source.startswith("--set"), message
        assert problem.line is None
    elif line is not None:
        assert problem.source == str(file)
        assert (problem.line, problem.column) == (line, column), message


def test_corpus_is_large_enough():
    assert len(CASES) >= 40


def _write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (directory / name).write_text(text)


def test_extends_missing_file(tmp_path: Path):
    _write(tmp_path, {"child.yaml": "extends: nope.yaml\nname: c\n"})
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "child.yaml")
    problem = caught.value.problems[0]
    assert "no such file" in problem.message and (problem.line, problem.column) == (1, 10)


def test_extends_cycle_is_reported(tmp_path: Path):
    _write(tmp_path, {"a.yaml": "extends: b.yaml\n", "b.yaml": "name: b\nextends: a.yaml\n"})
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "a.yaml")
    problem = caught.value.problems[0]
    assert "cycle" in problem.message and "a.yaml -> b.yaml -> a.yaml" in problem.message
    assert problem.source.endswith("b.yaml") and problem.line == 2


def test_extends_not_a_string(tmp_path: Path):
    _write(tmp_path, {"a.yaml": BASE + "extends: [x]\n"})
    with pytest.raises(SpecError, match="relative file path"):
        load_spec(tmp_path / "a.yaml")


def test_extends_deep_merges_and_reports_child_positions(tmp_path: Path):
    _write(tmp_path, {
        "base.yaml": BASE,
        "child.yaml": "extends: base.yaml\nd_model: 32\ninput: {vocab_size: 64}\n",
        "bad.yaml": "extends: base.yaml\nd_model: ⟪0\n".replace(MARK, ""),
    })
    spec = load_spec(tmp_path / "child.yaml")
    assert spec.d_model == 32 and spec.input.vocab_size == 64 and spec.input.kind == "tokens"
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "bad.yaml")
    problem = caught.value.problems[0]
    assert problem.source.endswith("bad.yaml") and (problem.line, problem.column) == (2, 10)


def test_all_problems_are_reported_at_once(tmp_path: Path):
    file = tmp_path / "spec.yaml"
    file.write_text(yaml_with("feture_map: relu\nmode: chunked\n"))
    with pytest.raises(SpecError) as caught:
        load_spec(file)
    assert len(caught.value.problems) == 2


def test_unknown_file_suffix(tmp_path: Path):
    file = tmp_path / "spec.txt"
    file.write_text(BASE)
    with pytest.raises(SpecError, match=r"\*\.yaml"):
        load_spec(file)


def test_missing_file():
    with pytest.raises(SpecError, match="no such file"):
        load_spec("does/not/exist.yaml")
