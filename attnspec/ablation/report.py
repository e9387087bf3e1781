"""``attnspec report RUNS_DIR``: the comparison a sweep was run for, as tables, CSV, plots and HTML.

Reads the runs directory (:mod:`attnspec.ablation.runsdir`) and writes ``RUNS_DIR/report/``:

- ``results.csv``: one row per (variant, task point): the metric at the best learning rate, mean and
  standard deviation over seeds, parameters, state size, tokens/s, and the run directories behind
  the numbers; ``runs.csv``: one row per run (status, metric, error);
- ``results.md``: the same table, the per-learning-rate table, versions and machine;
- ``plots/*.png`` and ``*.svg`` (matplotlib): the metric against each task's difficulty axis per
  variant (Zoology's figure), training curves, the metric against state size and parameters;
- ``report.html``: everything above in one self-contained file (plots embedded), well-formed XML.

What is shown is computed by :mod:`attnspec.ablation.results` (the best learning rate of each
variant and task point, over seeds); this module only renders it.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from pathlib import Path

from attnspec.ablation.results import Report, ResultRow, collect, lr_table, run_counts, summary_rows
from attnspec.ablation.runsdir import params_text
from attnspec.figures import log_scale
from attnspec.io import ensure_directory, write_atomic
from attnspec.training.tasks.base import NOISE


def write_report(directory: str | Path) -> Report:
    """Collect the runs directory and write ``report/`` (see the module doc); returns the report."""
    report = collect(directory)
    out = ensure_directory(report.directory / "report")  # a link here is refused: nothing is written through it
    report.plots = _plots(report, ensure_directory(out / "plots"))
    _results_csv(report, out / "results.csv")
    _runs_csv(report, out / "runs.csv")
    write_atomic(out / "results.md", results_markdown(report))
    write_atomic(out / "report.html", _html(report, out))
    return report


def _results_csv(report: Report, path: Path) -> None:
    from attnspec.figures import write_csv

    params = list(dict.fromkeys(k for row in report.results for k in row.task_params))
    write_csv(path, ["variant", "task", *params, "metric", "mean", "std", "worst", "best", "chance", "learned", "seeds",
                     "best_lr", "parameters", "state_size", "tokens_per_s", "runs"],
              [[row.variant, row.task, *(row.task_params.get(k, "") for k in params), report.metric, row.mean,
                row.std, row.worst, row.best, row.chance, "" if row.learned is None else row.learned, row.seeds, row.lr,
                row.parameters, row.state_size, row.tokens_per_s, " ".join(row.runs)]
               for row in report.results])


def _runs_csv(report: Report, path: Path) -> None:
    from attnspec.figures import write_csv

    write_csv(path, ["run", "variant", "task", "point", "seed", "lr", "status", report.metric, "parameters",
                     "state_size", "tokens_per_s", "modes", "error"],
              [[run.directory, run.variant, run.task, params_text(run.task_params), run.seed, run.lr, run.status,
                run.metric, run.parameters, run.state_size, run.tokens_per_s, " ".join(run.modes), run.error or ""]
               for run in report.runs])


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def _provenance(report: Report) -> str:
    m = report.machine
    return (f"attnspec {m.get('attnspec', '?')}, torch {m.get('torch', '?')}, Python {m.get('python', '?')}; "
            f"{m.get('platform', '?')}, {m.get('cpus', '?')} CPUs ({m.get('processor', '?')})"
            + (f", GPU {m['cuda']}" if m.get("cuda") else ""))


def results_markdown(report: Report) -> str:
    """results.md: the summary table, the learning-rate table, failures and provenance."""
    counts = run_counts(report)
    parts = [f"# Sweep `{report.sweep.get('name')}`", "",
             f"{report.metric} on the test set at the end of training; mean ± std over seeds at each variant's best "
             f"learning rate (marked * below; a diverged run is never chosen). `chance` is the accuracy of answering "
             "without the skill (the most common answer, or a task's trivial strategy such as MQAR's 1/pairs); a mean "
             f"below chance + max({NOISE}, 2 std) is marked *not learned*. Runs: {counts['done']} done, "
             f"{counts['diverged']} diverged, {counts['failed']} failed, {counts['unfinished']} not finished. Run "
             "directories are listed in results.csv.", "",
             _markdown_table(*summary_rows(report)), "", "## By learning rate", "", _markdown_table(*lr_table(report))]
    for status, title in (("diverged", "Diverged runs"), ("failed", "Failed runs")):
        listed = [run for run in report.runs if run.status == status]
        if listed:
            parts += ["", f"## {title}", ""] + [f"- `{run.directory}` ({run.variant}, {run.task} "
                                                f"{params_text(run.task_params)}, seed {run.seed}, lr {run.lr:g}): "
                                                f"{(run.error or '').splitlines()[0] if run.error else 'unknown'}"
                                                for run in listed]
    if report.plots:
        parts += ["", "## Plots", ""] + [f"![{name}](plots/{name}.png)" for name in report.plots]
    parts += ["", f"Measured with {_provenance(report)}.", ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- plots


def _plots(report: Report, out: Path) -> list[str]:
    """Write every plot as PNG and SVG; returns their names (without suffix)."""
    from attnspec.figures import pyplot

    plt = pyplot()
    names = []
    palette = "tab10" if len(report.variants) <= 10 else "tab20"  # no two variants share a colour up to 20
    size = 10 if palette == "tab10" else 20
    colors = {variant: plt.get_cmap(palette)(i % size) for i, variant in enumerate(report.variants)}
    for task in report.tasks:
        rows = [row for row in report.results if row.task == task]
        axis = report.difficulty.get(task)
        if axis is not None:
            names.append(_difficulty_plot(plt, report, task, axis, rows, colors, out))
        names.append(_curves_plot(plt, report, task, colors, out))
    for attribute, label in (("state_size", "state size (numbers per sequence)"), ("parameters", "parameters")):
        names.append(_scatter_plot(plt, report, attribute, label, colors, out))
    return names


def _legend_beside(panel) -> None:
    """The variants' legend to the right of the last panel, never over its lines or points."""
    panel.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))


def _save(plt, figure, out: Path, name: str) -> str:
    from attnspec.figures import save_figure

    save_figure(figure, out, name)
    return name


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:60]


def _difficulty_plot(plt, report: Report, task: str, axis: str, rows: list[ResultRow], colors, out: Path) -> str:
    """The metric against the difficulty axis, one line per variant, a panel per value of the other axes."""
    others = sorted({json.dumps({k: v for k, v in row.task_params.items() if k != axis}, sort_keys=True) for row in rows})
    figure, panels = plt.subplots(1, len(others), figsize=(4.2 * len(others) + 2.5, 3.6), squeeze=False)
    for panel, other in zip(panels[0], others):
        for variant in report.variants:
            points = sorted((row.task_params.get(axis), row.mean, row.std or 0.0) for row in rows
                            if row.variant == variant and row.mean is not None
                            and json.dumps({k: v for k, v in row.task_params.items() if k != axis}, sort_keys=True) == other)
            if points:
                xs, ys, errors = zip(*points)
                panel.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=variant, color=colors[variant])
        chance = sorted({(row.task_params.get(axis), row.chance) for row in rows if row.chance is not None
                         and json.dumps({k: v for k, v in row.task_params.items() if k != axis}, sort_keys=True) == other})
        if len(chance) == 1:  # one difficulty value: a line of one point would not be drawn
            panel.axhline(chance[0][1], linestyle="--", color="0.45", linewidth=1.0, label="chance")
        elif chance:
            xs, ys = zip(*chance)
            panel.plot(xs, ys, linestyle="--", color="0.45", linewidth=1.0, label="chance")
        title = params_text(json.loads(other))
        panel.set_title(f"{task} {title}".strip(), fontsize=9)
        values = sorted({row.task_params.get(axis) for row in rows if isinstance(row.task_params.get(axis), (int, float))})
        if values:
            panel.set_xticks(values)  # the grid's own values, not fractions between them
        panel.set_xlabel(axis)
        panel.set_ylabel(report.metric)
        if report.metric == "perplexity":
            log_scale(panel, "y")
        panel.grid(alpha=0.3)
    _legend_beside(panels[0][-1])
    return _save(plt, figure, out, f"{_slug(task)}-{report.metric}-vs-{_slug(axis)}")


def _curves_plot(plt, report: Report, task: str, colors, out: Path) -> str:
    """Training loss against step at the best learning rate (seed mean), a panel per task point."""
    rows = [row for row in report.results if row.task == task]
    points = list(dict.fromkeys(json.dumps(row.task_params, sort_keys=True) for row in rows))[:12]
    columns = min(4, len(points))
    figure, panels = plt.subplots(math.ceil(len(points) / columns), columns, figsize=(3.6 * columns, 3.0 * math.ceil(len(points) / columns)),
                                  squeeze=False)
    runs = {run.directory: run for run in report.runs}
    for index, point in enumerate(points):
        panel = panels[index // columns][index % columns]
        for row in rows:
            if json.dumps(row.task_params, sort_keys=True) != point:
                continue
            curves = [runs[name].curve for name in row.runs if runs.get(name) and runs[name].curve]
            if curves:
                length = min(len(c) for c in curves)
                steps = [c[0] for c in curves[0][:length]]
                losses = [statistics.fmean(c[i][1] for c in curves) for i in range(length)]
                panel.plot(steps, losses, label=row.variant, color=colors[row.variant], linewidth=1.2)
        panel.set_title(f"{task} {params_text(json.loads(point))}".strip(), fontsize=9)
        panel.set_xlabel("step")
        panel.set_ylabel("training loss")
        log_scale(panel, "y")
        panel.grid(alpha=0.3)
    for index in range(len(points), panels.size):
        panels[index // columns][index % columns].axis("off")
    _legend_beside(panels[0][-1])
    return _save(plt, figure, out, f"{_slug(task)}-training-curves")


def _scatter_plot(plt, report: Report, attribute: str, label: str, colors, out: Path) -> str:
    """The metric against state size or parameters: a point per (variant, task point), labelled with
    the task point's difficulty value."""
    tasks = report.tasks
    figure, panels = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks) + 2.4, 3.6), squeeze=False)
    for panel, task in zip(panels[0], tasks):
        axis = report.difficulty.get(task)
        for variant in report.variants:
            points = [(getattr(row, attribute), row.mean, row.task_params.get(axis, "")) for row in report.results
                      if row.task == task and row.variant == variant and row.mean is not None
                      and getattr(row, attribute)]
            if points:
                xs, ys, labels = zip(*points)
                panel.scatter(xs, ys, label=variant, color=colors[variant], s=24)
                for x, y, text in zip(xs, ys, labels):  # which task point each dot is
                    panel.annotate(str(text), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6)
        log_scale(panel, "x")
        panel.set_title(task, fontsize=9)
        panel.set_xlabel(label)
        panel.set_ylabel(report.metric)
        panel.grid(alpha=0.3)
    _legend_beside(panels[0][-1])
    return _save(plt, figure, out, f"{report.metric}-vs-{attribute.replace('_', '-')}")


# --------------------------------------------------------------------------- HTML


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html(report: Report, out: Path) -> str:
    """report.html: self-contained (plots as data URIs), well-formed XML, no script, no server."""
    images = []
    for name in report.plots:
        data = base64.b64encode((out / "plots" / f"{name}.png").read_bytes()).decode()
        images.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(name)}" '
                      f'data-plot="{html.escape(name)}"/><figcaption>{html.escape(name)} '
                      f'(<a href="plots/{html.escape(name)}.svg">SVG</a>)</figcaption></figure>')
    def listing(status: str) -> str:
        return "".join(f"<li><code>{html.escape(run.directory)}</code> {html.escape(run.variant)}, "
                       f"{html.escape(run.task)} {html.escape(params_text(run.task_params))}, seed {run.seed}, "
                       f"lr {run.lr:g}: {html.escape(((run.error or '').splitlines() or ['unknown'])[0])}</li>"
                       for run in report.runs if run.status == status)

    failures, diverged = listing("failed"), listing("diverged")
    style = ("body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}"
             "td:first-child,td:nth-child(2),td:nth-child(3){text-align:left}img{max-width:100%}"
             "figure{display:inline-block;margin:1em}")
    title = html.escape(f"attnspec sweep {report.sweep.get('name')}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f"<title>{title}</title><style>{style}</style></head><body>"
            f"<h1>{title}</h1><p>{html.escape(report.metric)} on the test set at the end of training: mean ± std "
            "over seeds at each variant's best learning rate (* in the second table). Run directories are in "
            "results.csv and runs.csv.</p>"
            + _html_table(*summary_rows(report)) + "<h2>By learning rate</h2>" + _html_table(*lr_table(report))
            + (f"<h2>Diverged runs</h2><ul>{diverged}</ul>" if diverged else "")
            + (f"<h2>Failed runs</h2><ul>{failures}</ul>" if failures else "")
            + "<h2>Plots</h2>" + "".join(images)
            + f"<p>Measured with {html.escape(_provenance(report))}.</p></body></html>\n")
