"""Seeded fuzzing of the spec front-ends: every malformed spec is a located SpecError, nothing else.

Malformed specs are made from the shipped ones (YAML and their `.attn` forms) by text mutations
(deleting, inserting and repeating characters and lines, inserting YAML/grammar punctuation, deep
brackets, long numbers, YAML 1.1 scalars, tags, anchors and aliases, control characters) and by data
mutations (a value replaced by a wrong type, a huge or negative number, a deep list, a long string;
keys renamed or added), then read. The run asserts that each either validates or raises SpecError
whose every problem names the source and a line, and that a sample run through the CLI exits 0 or 2
without a traceback. The seed is fixed, so a failure reproduces; the count is printed.
"""

from __future__ import annotations

import copy
import random
import subprocess
import sys
from pathlib import Path

import pytest

from attnspec.errors import SpecError
from attnspec.spec import load_spec, loads_spec, to_attn
from attnspec.spec.yaml_front import parse_yaml
from tests.conftest import SPECS

SEED = 20261122
COUNT = 10_400  # at least 10,000, half YAML and half .attn
CLI_SAMPLE = 320

PUNCTUATION = list("{}[](),:=-+#&*!|>'\"%@`\\\t\n ") + ["\x00", "\x07", "\u2028", "é", "\ufeff"]
SNIPPETS = [
    "0x40", "064", "1:04", "6_4", "yes", "off", "~", "null", ".inf", "-.nan", "1e999", "9" * 80, "-" + "9" * 30,
    "!!python/object/apply:os.system [ls]", "!!int", "&a", "*a", "*undefined", "<<: *a", "[" * 60, "{" * 60,
    "f(" * 40, '"\\q"', "\t", "repeat 1000000000 { }", "layers { }", "extends: /etc/passwd",
    "extends: ../../x.yaml", "mixer = softmax(", "kind: ", "\"unterminated", "'", "? complex key",
    "--- \n", "...\n", "%YAML 1.1\n",
]
WRONG_VALUES = [None, True, -1, 0, 2 ** 70, 10 ** 30, -(2 ** 63), 1.5, float("inf"), "x" * 5000, "rleu", [],
                [[[[[[[[1]]]]]]]], {"kind": "nope"}, {"a": {"b": {"c": {}}}}, [1] * 300, "0x10", "yes"]


def _base_texts() -> list[tuple[str, str]]:
    texts = []
    for path in SPECS:
        yaml_text = path.read_text()
        texts.append(("yaml", yaml_text))
        texts.append(("attn", to_attn(load_spec(path, resolved=False))))
    return texts


def _mutate_text(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        if not text:
            return rng.choice(SNIPPETS)
        i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        choice = rng.randrange(6)
        if choice == 0:  # delete a range
            text = text[:i] + text[j:][: len(text)]
        elif choice == 1:  # insert punctuation
            text = text[:i] + "".join(rng.choice(PUNCTUATION) for _ in range(rng.randint(1, 4))) + text[i:]
        elif choice == 2:  # insert a snippet
            text = text[:i] + rng.choice(SNIPPETS) + text[i:]
        elif choice == 3:  # repeat a range
            text = text[:i] + text[i:j] * rng.randint(2, 5) + text[j:]
        elif choice == 4:  # swap two lines
            lines = text.split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:  # truncate
            text = text[:i]
    return text


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


def _mutate_data(rng: random.Random, data: dict) -> dict:
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([p for p in _paths(data) if p])
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        choice = rng.randrange(3)
        if choice == 0:
            parent[path[-1]] = copy.deepcopy(rng.choice(WRONG_VALUES))
        elif choice == 1 and isinstance(parent, dict):
            parent[str(path[-1]) + rng.choice(["", "x", "_"])] = parent.pop(path[-1])
        elif isinstance(parent, dict):
            key = rng.choice(["kind", "repeat", "layers", "heads", "extends", "unknown"])
            parent[key] = copy.deepcopy(rng.choice(WRONG_VALUES))
    return data


def _dump(rng: random.Random, fmt: str, data: dict) -> str:
    """Data back to text: YAML with flow style at random; .attn through the converter when it can."""
    import yaml

    if fmt == "yaml":
        return yaml.safe_dump(data, default_flow_style=rng.random() < 0.5, sort_keys=False, allow_unicode=True)
    try:
        return to_attn(load_spec(data, resolved=False))
    except SpecError:
        return yaml.safe_dump(data)  # not representable: fed to the .attn parser as garbage


def malformed_specs(count: int = COUNT, seed: int = SEED):
    """``count`` (format, text) pairs, deterministic for ``seed``."""
    rng = random.Random(seed)
    bases = _base_texts()
    datas = [parse_yaml(text)[0] for fmt, text in bases if fmt == "yaml"]
    for n in range(count):
        fmt = "yaml" if n % 2 == 0 else "attn"
        if rng.random() < 0.7:
            text = rng.choice([t for f, t in bases if f == fmt])
            yield fmt, _mutate_text(rng, text)
        else:
            yield fmt, _dump(rng, fmt, _mutate_data(rng, rng.choice(datas)))


@pytest.mark.slow
def test_every_malformed_spec_is_a_located_spec_error():
    counts = {"valid": 0, "invalid": 0}
    for n, (fmt, text) in enumerate(malformed_specs()):
        source = f"fuzz-{n}.{fmt}"
        try:
            loads_spec(text, fmt, source=source)
            counts["valid"] += 1
        except SpecError as error:
            counts["invalid"] += 1
            for problem in error.problems:
                assert problem.source is not None and problem.source.startswith(("fuzz-", "--set")), (n, str(problem))
                assert problem.line is not None, (n, text[:200], str(problem))
        except Exception as error:  # noqa: BLE001 - the point of the test
            pytest.fail(f"spec {n} ({fmt}) raised {type(error).__name__}: {error}\n{text[:500]!r}")
    print(f"fuzzed {COUNT} specs: {counts}")
    assert counts["invalid"] > COUNT // 2  # the mutations do break specs


def test_a_cli_sample_exits_2_without_a_traceback(tmp_path: Path):
    files = []
    for n, (fmt, text) in enumerate(malformed_specs(CLI_SAMPLE, seed=SEED + 1)):
        file = tmp_path / f"spec{n}.{fmt}"
        file.write_text(text, encoding="utf-8", errors="surrogatepass")
        files.append(str(file))
    result = subprocess.run([sys.executable, "-m", "attnspec", "check", *files], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.count("error: ") >= CLI_SAMPLE // 2
