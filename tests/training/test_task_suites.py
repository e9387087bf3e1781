"""The suites the papers use: MAD-Lab's recall and memorisation tasks, LRA's ListOps, learning to
sort and the standard-library byte corpus, each against a plain Python statement of its definition;
and finite training sets (``train_examples``)."""

from __future__ import annotations

import hashlib
import itertools
import sysconfig
from pathlib import Path

import pytest
import torch

from attnspec.errors import SpecError
from attnspec.training.config import load_config
from attnspec.training.tasks import IGNORE
from attnspec.training.tasks.structured import listops_value


def task(kind, *sets):
    return load_config(task=kind, task_overrides=list(sets)).task


def _answered(row: list[int]) -> list[tuple[int, int]]:
    return [(t, v) for t, v in enumerate(row) if v != IGNORE]


@pytest.mark.parametrize("multi_query", [True, False])
@pytest.mark.parametrize("noise", [0.0, 0.4])
def test_in_context_recall_answers_are_values_of_keys_seen_before(multi_query, noise):
    recall = task("in_context_recall", "seq_len=64", "vocab_size=32", f"multi_query={str(multi_query).lower()}",
                  "noise_vocab_size=6", f"frac_noise={noise}")
    K = recall.num_keys
    inputs, targets = recall.batch("test", 0, 40, seed=3)
    full_inputs, train_targets = recall.batch("train", 0, 40, seed=3)
    assert inputs.shape == (40, 64) and int(inputs.max()) < 32
    noise_seen = False
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        assert row_in[-2] == recall.special and 0 <= row_in[-1] < K  # copy prefix, then the probe key
        values: dict[int, int] = {}
        for t in range(len(row_in) - 2):  # pairs: every key is followed by its value, wherever it recurs
            if 0 <= row_in[t] < K and (t + 1) < len(row_in) and K <= row_in[t + 1] < 2 * K:
                assert values.setdefault(row_in[t], row_in[t + 1]) == row_in[t + 1]
            noise_seen |= row_in[t] >= 2 * K and row_in[t] != recall.special
        answered = _answered(row_out)
        assert answered[-1] == (63, values[row_in[-1]])  # the probe's value
        assert multi_query or len(answered) == 1
        for t, value in answered[:-1]:  # multi-query: a key that appeared earlier, answered with its value
            assert row_in[t] in values and values[row_in[t]] == value and row_in[:t].count(row_in[t]) >= 1
    assert noise_seen == (noise > 0)
    # training targets are the next token (a language model's loss), padding and the copy prefix excepted
    for row_in, row_out in zip(full_inputs.tolist(), train_targets.tolist()):
        for t in range(63):
            assert row_out[t] in (row_in[t + 1], IGNORE) and (row_out[t] == IGNORE) == (row_in[t + 1] == recall.special)


def test_noisy_in_context_recall_has_mad_s_defaults():
    noisy = task("noisy_in_context_recall")
    assert (noisy.vocab_size, noisy.noise_vocab_size, noisy.frac_noise, noisy.seq_len) == (32, 16, 0.2, 128)


def test_fuzzy_recall_probes_a_motif_key_with_its_motif_value():
    fuzzy = task("fuzzy_in_context_recall", "seq_len=96", "vocab_size=16", "k_motif_size=3", "v_motif_size=3")
    K = fuzzy.num_keys
    inputs, targets = fuzzy.batch("test", 0, 30, seed=1)
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        copy_at = max(t for t in range(len(row_in)) if row_in[t] == fuzzy.special and
                      any(x != fuzzy.special for x in row_in[:t]))
        tail = row_in[copy_at + 1:]
        key = [x for x in tail if x < K]
        assert len(key) == 3  # test keys have the full motif size
        value_at = [t for t, _ in _answered(row_out) if t >= copy_at]
        value = [row_out[t] for t in value_at]
        assert 1 <= len(value) <= 3 and all(K <= v < 2 * K for v in value)
        # the same key motif appeared earlier, followed by the same value motif
        earlier = row_in[:copy_at]
        motif = key + value[:-1] if len(value) > 1 else key
        assert any(earlier[i:i + len(motif)] == motif for i in range(len(earlier)))


def test_memorization_uses_one_fixed_map_for_every_example_split_and_seed():
    memory = task("memorization", "vocab_size=65", "seq_len=16")
    mapping = memory.key_value_map()
    assert sorted(mapping.tolist()) == list(range(32, 64))
    for split, seed in (("train", 0), ("test", 0), ("train", 9)):
        inputs, targets = memory.batch(split, 2, 20, seed=seed)
        assert (inputs[:, 1::2] == 64).all() and (targets[:, 0::2] == IGNORE).all()
        assert torch.equal(targets[:, 1::2], mapping[inputs[:, 0::2]])


def _evaluate_listops(tokens: list[int]) -> int:
    """Evaluate a token list with a stack, independently of the generator's recursion."""
    stack: list[list] = []
    result = None
    for token in tokens:
        if 10 <= token <= 13:
            stack.append([("MAX", "MIN", "MED", "SM")[token - 10]])
        elif token == 14:
            operator, *args = stack.pop()
            value = listops_value(operator, args)
            if stack:
                stack[-1].append(value)
            else:
                result = value
        else:
            stack[-1].append(token)
    assert not stack
    return result


def test_listops_answers_are_the_values_of_the_expressions():
    listops = task("listops", "seq_len=96", "min_length=20", "max_depth=4", "max_args=5")
    inputs, targets = listops.batch("train", 0, 60, seed=2)
    answers = []
    for row_in, row_out in zip(inputs.tolist(), targets.tolist()):
        body = [x for x in row_in[:-1] if x != listops.PAD]
        assert row_in[-1] == listops.EQUALS and 20 <= len(body) <= 95
        assert row_in[:len(row_in) - 1 - len(body)] == [listops.PAD] * (len(row_in) - 1 - len(body))  # left padding
        assert _answered(row_out) == [(95, _evaluate_listops(body))]
        answers.append(row_out[-1])
        depth = max_depth = 0
        for x in body:
            depth += 1 if 10 <= x <= 13 else -1 if x == 14 else 0
            max_depth = max(max_depth, depth)
        assert max_depth <= 4
    assert len(set(answers)) >= 5
    assert listops_value("MED", [1, 2, 3, 4]) == 2 and listops_value("SM", [9, 8]) == 7


def test_listops_refuses_an_impossible_length_range():
    with pytest.raises(SpecError, match="min_length"):
        from attnspec.training.loop import check_fit
        import attnspec

        spec = attnspec.load_spec(Path(__file__).resolve().parents[2] / "specs" / "softmax-transformer.yaml",
                                  ["input.vocab_size=32"])
        check_fit(spec, task("listops", "seq_len=16", "min_length=16"))


def test_sort_answers_are_stable_sorted_positions():
    sort = task("sort", "seq_len=8", "alphabet=4")
    letters, ranks = sort.batch("train", 0, 50, seed=0)
    for row_in, row_out in zip(letters.tolist(), ranks.tolist()):
        order = sorted(range(8), key=lambda i: (row_in[i], i))
        assert row_out == [order.index(i) for i in range(8)]


def _in_hull_of_others(points: list[tuple[int, int]], i: int) -> bool:
    """Brute force (Caratheodory in the plane): point i lies in the closed convex hull of the others
    iff it is on a segment of two of them or inside a triangle of three."""
    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    p, others = points[i], [q for j, q in enumerate(points) if j != i]
    for a, b in itertools.combinations(others, 2):
        if cross(a, b, p) == 0 and min(a[0], b[0]) <= p[0] <= max(a[0], b[0]) and \
                min(a[1], b[1]) <= p[1] <= max(a[1], b[1]):
            return True
    for a, b, c in itertools.combinations(others, 3):
        if cross(a, b, c) == 0:  # a degenerate triangle is covered by its segments
            continue
        signs = [cross(a, b, p), cross(b, c, p), cross(c, a, p)]
        if all(s >= 0 for s in signs) or all(s <= 0 for s in signs):
            return True
    return False


def test_convex_hull_answers_are_the_corners_of_the_points_hull():
    hull = task("convex_hull", "seq_len=10", "grid=16", "spread=12")
    cells, corners = hull.batch("train", 0, 40, seed=0)
    assert hull.vocab_size == 256 and cells.max() < 256
    for row_in, row_out in zip(cells.tolist(), corners.tolist()):
        points = [(c // 16, c % 16) for c in row_in]
        assert len(set(points)) == 10  # distinct cells
        assert max(x for x, _ in points) - min(x for x, _ in points) < 12  # inside one spread x spread window
        assert row_out == [0 if _in_hull_of_others(points, i) else 1 for i in range(10)]
    assert 0.3 < corners.double().mean() < 0.8  # both answers are common
    with pytest.raises(SpecError, match="spread"):
        from attnspec.training.loop import check_fit
        import attnspec

        spec = attnspec.load_spec(Path(__file__).resolve().parents[2] / "specs" / "softmax-transformer.yaml",
                                  ["input.vocab_size=256"])
        check_fit(spec, task("convex_hull", "seq_len=10", "grid=8", "spread=2"))


def test_python_source_is_the_stdlib_with_a_split_by_file_name():
    corpus = task("python_source", "seq_len=64", "max_bytes=2000000")
    arrays = corpus.arrays()
    assert 0 < len(arrays["test"]) < len(arrays["train"]) and len(arrays["train"]) + len(arrays["test"]) <= 2_000_000
    root = Path(sysconfig.get_paths()["stdlib"])
    held_out = hashlib.sha256(b"abc.py").digest()[0] < 0.1 * 256
    text = bytes(arrays["test" if held_out else "train"])
    assert (root / "abc.py").read_bytes()[:200] in text  # abc.py sorts early: inside the 2 MB budget
    inputs, targets = corpus.batch("train", 5, 4, seed=0)
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and int(inputs.max()) < 256


def test_train_examples_is_a_fixed_training_set_and_leaves_the_test_set_alone():
    finite = task("mqar", "seq_len=32", "vocab_size=64", "num_kv_pairs=2", "train_examples=10")
    seen = {tuple(row) for step in range(30) for row in finite.batch("train", step, 8, seed=4)[0].tolist()}
    assert len(seen) == 10
    pool = {tuple(row) for row in finite.sample("train", 0, 10, seed=4)[0].tolist()}
    assert seen == pool
    infinite = task("mqar", "seq_len=32", "vocab_size=64", "num_kv_pairs=2")
    assert torch.equal(finite.batch("test", 0, 16, seed=4)[0], infinite.batch("test", 0, 16, seed=4)[0])
    assert len({tuple(row) for step in range(5) for row in infinite.batch("train", step, 8, 4)[0].tolist()}) == 40
