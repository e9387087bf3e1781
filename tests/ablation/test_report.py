"""Reports: the best learning rate per variant and task point, mean and std over seeds, files that
link every number to its runs, plots in PNG and SVG, and a self-contained, well-formed report.html."""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from attnspec.ablation.ablate import ablate
from attnspec.ablation.report import write_report
from attnspec.ablation.results import RunRow, _results
from tests.ablation.sweeps import sweep


def _row(variant, lr, seed, metric, params=None) -> RunRow:
    return RunRow(f"{abs(hash((variant, lr, seed))):016x}"[:16], variant, "mqar", params or {"n": 1}, seed, lr, "done",
                  metric, 10, 20, 100.0)


def test_the_best_learning_rate_is_chosen_on_the_mean_over_seeds():
    runs = [_row("a", 1e-3, 0, 0.9), _row("a", 1e-3, 1, 0.5),  # mean 0.7
            _row("a", 3e-3, 0, 0.8), _row("a", 3e-3, 1, 0.8),  # mean 0.8: best, though 0.9 is the best single run
            _row("b", 1e-3, 0, 0.1), _row("b", 3e-3, 0, None)]  # a failed run is not a result
    (a, b) = _results(runs, "accuracy")
    assert a.lr == 3e-3 and a.mean == pytest.approx(0.8) and a.std == 0.0 and a.seeds == 2
    assert a.runs == [f"runs/{r.key}" for r in runs[2:4]] and a.by_lr[1e-3] == (pytest.approx(0.7), 2, 0.5, 0.9)
    assert b.lr == 1e-3 and b.mean == pytest.approx(0.1) and b.std is None
    (low,) = _results([_row("a", 1e-3, 0, 12.0), _row("a", 3e-3, 0, 9.0)], "perplexity")
    assert low.lr == 3e-3 and low.mean == 9.0 and low.by_lr[3e-3] == (9.0, 1, 9.0, 9.0)
    (worse,) = _results([_row("a", 1e-3, 0, 12.0), _row("a", 1e-3, 1, 10.0)], "perplexity")
    assert worse.by_lr[1e-3] == (11.0, 2, 12.0, 10.0)  # worst is the higher perplexity
    (spread,) = _results([_row("a", 1e-3, s, v) for s, v in enumerate([0.2, 0.4, 0.9])], "accuracy")
    assert spread.std == pytest.approx(statistics.stdev([0.2, 0.4, 0.9]))


def test_a_result_within_noise_of_chance_is_not_learned():
    def row(values, chance):
        (result,) = _results([_row("a", 1e-3, seed, value) for seed, value in enumerate(values)], "accuracy")
        result.chance = chance
        return result

    assert row([0.26, 0.27], 0.25).learned is False  # within NOISE (0.03) of 1/4
    assert row([0.30, 0.31], 0.25).learned is True
    assert row([0.20, 0.60], 0.25).learned is False  # above chance by less than two seed stds
    assert row([0.99, 1.0], None).learned is None  # no chance level: no verdict


def test_chance_is_the_majority_answer_or_the_tasks_trivial_strategy():
    from attnspec.training.config import load_config

    mqar = load_config(task="mqar", task_overrides=["seq_len=64", "vocab_size=128", "num_kv_pairs=8"]).task
    assert mqar.chance(0, 64) == 1 / 8  # any value of the context, above the majority value's share
    hull = load_config(task="convex_hull", task_overrides=["seq_len=10", "grid=16", "spread=12"]).task
    inputs, targets = hull.batch("test", 0, 100, 0)
    answers = targets[targets >= 0]
    assert hull.chance(0, 100) == pytest.approx(float((answers == answers.mode().values).float().mean()))
    assert load_config(task="python_source", task_overrides=["seq_len=16"]).task.chance() is None  # perplexity


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> Path:
    """A toy sweep over two difficulties, two seeds and two learning rates, run and reported."""
    directory = tmp_path_factory.mktemp("report") / "runs"
    data = sweep(seeds=[0, 1], lr=[0.003, 0.01], tasks=[{"task": {"kind": "mqar", "seq_len": 16, "vocab_size": 32},
                                                        "grid": {"num_kv_pairs": [1, 2]}}])
    outcome = ablate(data, directory, workers=2, threads=1)
    assert outcome.ran == 16 and not outcome.failed
    return directory


@pytest.mark.slow
def test_report_files_link_every_number_to_its_runs(reported: Path):
    out = reported / "report"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * 2  # variants x task points
    for row in rows:
        assert row["best_lr"] in ("0.003", "0.01") and int(row["seeds"]) == 2 and row["metric"] == "accuracy"
        runs = row["runs"].split()
        assert len(runs) == 2 and all((reported / run / "result.json").is_file() for run in runs)
        assert 0 <= float(row["mean"]) <= 1 and float(row["std"]) >= 0
        assert float(row["worst"]) <= float(row["mean"]) <= float(row["best"])  # the seeds' range, worst first
        assert int(row["parameters"]) > 0 and int(row["state_size"]) > 0 and float(row["tokens_per_s"]) > 0
    assert len(list(csv.DictReader((out / "runs.csv").open()))) == 16
    assert all(row["modes"] for row in csv.DictReader((out / "runs.csv").open())), "each run's modes are listed"
    markdown = (out / "results.md").read_text()
    assert "| variant | task | point | accuracy (mean ± std) | chance |" in markdown and "## By learning rate" in markdown
    runs = {row["run"]: row for row in csv.DictReader((out / "runs.csv").open())}
    for row in rows:  # every seed's own value beside the mean, the value its run directory holds
        chosen = sorted((runs[run] for run in row["runs"].split()), key=lambda run: int(run["seed"]))
        shown = " · ".join(f"s{run['seed']} {float(run['accuracy']):.4f}" for run in chosen)
        assert shown in markdown, shown
    assert {float(row["chance"]) for row in rows} == {1.0, 0.5}  # 1 / num_kv_pairs at 1 and 2 pairs
    assert "| lr 0.003: mean (worst / best) |" in markdown  # every rate's spread, not its mean alone
    assert "torch " in markdown and "attnspec " in markdown


def test_log_axes_label_their_ticks_as_plain_numbers():
    """Text is drawn literally (mathtext off, so a variant named `$x$` stays `$x$`); matplotlib's own
    log tick labels are mathtext, which would print as `$\\mathdefault{10^{0}}$` on every log axis."""
    from attnspec.figures import log_scale, pyplot

    plt = pyplot()
    figure, panel = plt.subplots()
    panel.plot([0, 1, 2], [0.3, 1.0, 60.0])
    panel.set_xlim(1, 1024)
    log_scale(panel, "y")
    log_scale(panel, "x", base=2)
    figure.canvas.draw()
    labels = [label.get_text() for axis in (panel.xaxis, panel.yaxis)
              for label in (*axis.get_ticklabels(), *axis.get_ticklabels(minor=True))]
    plt.close(figure)
    assert {"0.1", "1", "10", "100", "4", "256"} <= set(labels) and not any("$" in label for label in labels)


@pytest.mark.slow
def test_plots_are_png_and_svg_and_the_html_embeds_every_one(reported: Path):
    plots = reported / "report" / "plots"
    names = sorted(path.stem for path in plots.glob("*.png"))
    assert names == sorted(path.stem for path in plots.glob("*.svg"))
    assert {"mqar-accuracy-vs-num_kv_pairs", "mqar-training-curves", "accuracy-vs-state-size",
            "accuracy-vs-parameters"} <= set(names)
    assert all((plots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in names)
    assert not any("mathdefault" in (plots / f"{name}.svg").read_text() for name in names)  # ticks read as numbers
    text = (reported / "report" / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "http" not in text.split("<body>")[1]
    root = ElementTree.fromstring(text.split("\n", 1)[1])  # well-formed (as XML) after the doctype
    images = {image.get("data-plot"): image.get("src") for image in root.iter("img")}
    assert sorted(images) == names and all(src.startswith("data:image/png;base64,") for src in images.values())
    assert len(list(root.iter("table"))) == 2


@pytest.mark.slow
def test_report_command_rewrites_the_report_and_refuses_other_directories(reported: Path, tmp_path: Path):
    (reported / "report" / "results.md").unlink()
    result = subprocess.run([sys.executable, "-m", "attnspec", "report", str(reported)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert (reported / "report" / "results.md").is_file() and "accuracy at the best learning rate" in result.stdout
    result = subprocess.run([sys.executable, "-m", "attnspec", "report", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "sweep.json" in result.stderr
    assert write_report(reported).metric == "accuracy"


@pytest.mark.parametrize("corrupt", [
    lambda record: record.update(sweep={"name": "x"}),  # not a sweep
    lambda record: record["runs"][0].update(task_params=[1]),
    lambda record: record["runs"][0].update(key="../../etc"),
    lambda record: record.update(format=2),
])
@pytest.mark.slow
def test_a_corrupt_runs_file_is_a_clear_error(reported: Path, tmp_path: Path, corrupt):
    import json
    import shutil

    copy = tmp_path / "runs"
    shutil.copytree(reported, copy)
    record = json.loads((copy / "sweep.json").read_text())
    corrupt(record)
    (copy / "sweep.json").write_text(json.dumps(record))
    result = subprocess.run([sys.executable, "-m", "attnspec", "report", str(copy)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "sweep" in result.stderr, result.stderr


@pytest.mark.parametrize("points", [[4], [2, 4, 8]])
def test_the_chance_level_is_drawn_with_one_difficulty_value_as_with_several(tmp_path, monkeypatch, points):
    """A single difficulty value used to give a one-point chance "line" that was in the legend but not drawn:
    it is a line across the panel at the chance level."""
    from types import SimpleNamespace

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnspec.ablation import report as report_module

    rows = [SimpleNamespace(variant="a", task_params={"n": n}, mean=0.5, std=0.1, chance=1 / n) for n in points]
    saved = []
    monkeypatch.setattr(report_module, "_save", lambda plt_, figure, out, name: saved.append(figure) or name)
    report = SimpleNamespace(variants=["a"], metric="accuracy")
    report_module._difficulty_plot(plt, report, "mqar", "n", rows, {"a": "C0"}, tmp_path)
    (panel,) = saved[0].axes
    (line,) = [line for line in panel.get_lines() if line.get_label() == "chance"]
    expected = [1 / points[0]] * 2 if len(points) == 1 else [1 / n for n in points]  # axhline: two ends
    assert line.get_visible() and list(line.get_ydata()) == pytest.approx(expected)
    plt.close("all")
