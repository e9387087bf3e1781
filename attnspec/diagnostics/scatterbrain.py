"""Scatterbrain's approximation study (Chen et al. 2021, Fig. 1, 3 and sec. 3.3): the error of
sparse alone, low-rank alone (Performer) and their sum against exact softmax attention of the same
q and k, as a function of the memory budget, of the sparse:low-rank ratio and of attention entropy,
including the paper's choice of the ratio from the observed entropy.

Budget b means every query may spend b * L entries of its row (L = length): Performer gets b * L
random features; sparse attention b * L keys of its support (exact softmax renormalised over them,
as Reformer and SMYRF compute); Scatterbrain splits b * L between its support and its features by
the ratio. Every method runs through the product's own code (the Scatterbrain and linear mixers,
the support modules), seen through :func:`implied_attention` (V = I).

q and k are synthetic with a controlled entropy (:func:`synthetic_qk`) or those of every layer of a
trained softmax model on its task's test inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnspec.diagnostics import SEED, Diagnostic, Parameter, Result, Table, output_option, output_directory
from attnspec.diagnostics.attention import (approximation_error, exact_attention, implied_attention, row_entropy,
                                            synthetic_qk)
from attnspec.diagnostics.subject import mixer_inputs
from attnspec.figures import log_scale

RATIOS: tuple[tuple[int, int], ...] = ((7, 1), (3, 1), (1, 1), (1, 3), (1, 7))
"""Sparse:low-rank splits the study sweeps, from mostly sparse to mostly low-rank."""
BUDGETS: tuple[float, ...] = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
"""The paper's budgets (BigGAN, Fig. 5)."""


def entropy_ratio(entropy: float, length: int) -> tuple[int, int]:
    """The paper's rule (sec. 3.3): more of the budget to low-rank when the attention's entropy is
    high. The low-rank share follows the normalised entropy H / log L (0: one key per row, 1:
    uniform), rounded to the nearest split of :data:`RATIOS`."""
    share = min(max(entropy / math.log(length), 0.0), 1.0)
    return min(RATIOS, key=lambda ratio: abs(ratio[1] / sum(ratio) - share))


def sparse_attention(q: Tensor, k: Tensor, support: Any, scale: float) -> Tensor:
    """Exact softmax renormalised over each query's support (sparse attention alone), as a dense
    (B, H, L, L) matrix; a query with no key in its support gets a zero row."""
    index, valid = support.index, support.valid
    keys = torch.gather(k.double().unsqueeze(2).expand(*index.shape[:3], *k.shape[-2:]), 3,
                        index.unsqueeze(-1).expand(*index.shape, k.shape[-1]))  # (B, H, L, S, d)
    scores = scale * (keys @ q.double().unsqueeze(-1)).squeeze(-1)
    weights = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num(0.0)
    dense = torch.zeros(*index.shape[:3], k.shape[-2], dtype=torch.float64)
    return dense.scatter_add_(-1, index, weights * valid)


def _mixer(mixer_data: dict, *, heads: int, d_qk: int, length: int, causal: bool) -> Any:
    """The first mixer of a one-block float64 model of ``mixer_data`` (d_model = heads * d_qk)."""
    from attnspec.compiler.lower import as_spec
    from attnspec.nn.model import build_model_from_spec

    spec = as_spec({"name": "approximation-study", "input": {"kind": "features", "dim": heads * d_qk},
                    "d_model": heads * d_qk, "max_len": length, "dtype": "float64", "head": {"kind": "none"},
                    "layers": [{"mixer": {"heads": heads, "d_qk": d_qk, "causal": causal,
                                          "scale": 1 / math.sqrt(d_qk), **mixer_data}}]})
    return build_model_from_spec(spec).blocks[0].mixer


def methods(budget: float, *, heads: int, d_qk: int, length: int, causal: bool, support: dict,
            ratios: tuple[tuple[int, int], ...]) -> dict[str, tuple[tuple[int, int] | None, Any]]:
    """name -> (Scatterbrain's ratio or None, the mixer or the support module) for one budget:
    Performer with every entry as features, sparse alone on ``support`` (a sparse component's data,
    e.g. ``{"kind": "lsh"}``; the module, not a mixer) and Scatterbrain at each ratio."""
    from pydantic import TypeAdapter

    from attnspec.nn.registry import build
    from attnspec.spec.ir import SparseSupport

    entries = max(1, round(budget * length))
    shape = {"heads": heads, "d_qk": d_qk, "length": length, "causal": causal}
    found: dict[str, tuple[tuple[int, int] | None, Any]] = {
        "performer": (None, _mixer({"kind": "linear", "feature_map": {"kind": "performer", "num_features": entries,
                                                                      "projection": "orthogonal"}}, **shape))}
    node = TypeAdapter(SparseSupport).validate_python(support)
    found[f"sparse[{node.kind}]"] = (None, build("sparse", node.resolved(entries, length), d_qk=d_qk, seed=0,
                                                 causal=causal))
    for s, r in ratios:
        found[f"scatterbrain[{node.kind} {s}:{r}]"] = ((s, r), _mixer(
            {"kind": "scatterbrain", "budget": budget, "ratio": [s, r], "sparse": support}, **shape))
    return found


@dataclass
class StudyRow:
    """One method at one budget on one set of q/k (a synthetic sharpness, or a trained layer)."""

    method: str
    budget: float
    source: str
    """``sharpness=<s>`` for synthetic q/k, ``layer <l>`` for a trained model's."""
    entropy: float
    """Mean row entropy of the exact attention (nats)."""
    error_mean: float
    """Normalised error ||A - M||_F / ||M||_F, mean over batch and heads."""
    error_std: float


def study(qk_sets: list[tuple[str, Tensor, Tensor]], *, causal: bool, budgets: tuple[float, ...] = BUDGETS,
          ratios: tuple[tuple[int, int], ...] = RATIOS, support: dict | None = None) -> list[StudyRow]:
    """Every method's normalised error against exact softmax, for each budget and each (source, q, k)
    with q, k (B, H, L, d_qk). Adds ``scatterbrain[... entropy]``: the ratio :func:`entropy_ratio`
    picks from that source's exact entropy (the row of that ratio, relabelled)."""
    support = support or {"kind": "lsh"}
    rows = []
    for source, q, k in qk_sets:
        B, H, L, d_qk = q.shape
        exact = exact_attention(q, k, 1 / math.sqrt(d_qk), causal)
        entropy = float(row_entropy(exact).mean())
        chosen = entropy_ratio(entropy, L)
        for budget in budgets:
            for name, (ratio, method) in methods(budget, heads=H, d_qk=d_qk, length=L, causal=causal,
                                                 support=support, ratios=tuple(dict.fromkeys((*ratios, chosen)))
                                                 ).items():
                if name.startswith("sparse"):
                    approx = sparse_attention(q, k, method(q, k), 1 / math.sqrt(d_qk))
                else:
                    approx = implied_attention(method, torch.zeros(B, L, H * d_qk, dtype=torch.float64),
                                               qk=(q, k))[0]
                error = approximation_error(approx, exact)["relative"].flatten()
                row = StudyRow(name, budget, source, entropy, float(error.mean()), float(error.std(correction=0)))
                if ratio == chosen:
                    rows.append(StudyRow(f"scatterbrain[{support['kind']} entropy]", budget, source, entropy,
                                         row.error_mean, row.error_std))
                if ratio is None or ratio in ratios:  # the chosen ratio alone is only there for the entropy row
                    rows.append(row)
    return rows


def synthetic_sets(*, heads: int, d_qk: int, length: int, sharpness: list[float], samples: int, seed: int
                   ) -> list[tuple[str, Tensor, Tensor]]:
    """(``sharpness=<s>``, q, k) for each sharpness (see :func:`synthetic_qk`)."""
    return [(f"sharpness={s:g}", *synthetic_qk(samples, heads, length, d_qk, s, seed)) for s in sharpness]


def trained_sets(model: Any, inputs: Tensor) -> list[tuple[str, Tensor, Tensor]]:
    """(``layer <l>``, q, k) of every block's mixer of a trained model on ``inputs``, in float64."""
    found = []
    for layer, (block, x) in enumerate(zip(model.blocks, mixer_inputs(model, inputs))):
        _, q, k = implied_attention(block.mixer, x)
        found.append((f"layer {layer}", q.double(), k.double()))
    return found


def write(rows: list[StudyRow], out: Path, title: str) -> list[Path]:
    """``scatterbrain.csv`` and two plots (PNG, SVG): error against budget per source, and error
    against entropy at each budget."""
    from attnspec.figures import pyplot, save_figure, write_csv

    output_directory(out)
    table = write_csv(out / "scatterbrain.csv", ["method", "budget", "source", "entropy", "relative_error_mean",
                                                  "relative_error_std"],
                      [[r.method, r.budget, r.source, r.entropy, r.error_mean, r.error_std] for r in rows])
    plt = pyplot()
    sources = list(dict.fromkeys(r.source for r in rows))
    entropy = {r.source: r.entropy for r in rows}
    by_budget = _panels(plt, rows, sources, lambda r: r.source, lambda r: r.budget,
                        lambda source: f"{source} (H = {entropy[source]:.2f})", "budget", title)
    for panel in by_budget.axes:
        log_scale(panel, "x", base=2)
    by_entropy = _panels(plt, rows, sorted({r.budget for r in rows}), lambda r: r.budget, lambda r: r.entropy,
                         lambda budget: f"budget 1/{round(1 / budget)}", "entropy of exact attention (nats)", title)
    return [table, *save_figure(by_budget, out, "scatterbrain_budget"),
            *save_figure(by_entropy, out, "scatterbrain_entropy")]


def _panels(plt, rows: list[StudyRow], groups: list, group_of, x_of, name_of, x_label: str, title: str):
    """One panel per group, one line per method: the error against ``x_of(row)``."""
    methods = list(dict.fromkeys(r.method for r in rows))
    figure, panels = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.4), sharey=True, squeeze=False)
    for panel, group in zip(panels[0], groups):
        for name in methods:
            mine = sorted((r for r in rows if group_of(r) == group and r.method == name), key=x_of)
            panel.plot([x_of(r) for r in mine], [r.error_mean for r in mine], marker="o", markersize=3, label=name)
        panel.set_title(name_of(group), fontsize=8)
        log_scale(panel, "y")
        panel.set_xlabel(x_label)
        panel.grid(alpha=0.3)
    panels[0][0].set_ylabel("||A - softmax||_F / ||softmax||_F")
    panels[0][-1].legend(fontsize=6)
    figure.suptitle(title, fontsize=10)
    return figure


# ----------------------------------------------------------------------------- the command


SUPPORTS = ("lsh", "local", "block", "topk")


def run(output: Path, qk_from: Path | None, length: int, heads: int, d_qk: int, sharpness: list[float],
        budgets: list[float], support: str, causal: bool, samples: int, seed: int) -> Result:
    """``attnspec diagnose scatterbrain``: the study on synthetic or trained q/k, a row per (q/k, budget)."""
    from attnspec.diagnostics.subject import load_subject
    from attnspec.errors import AttnSpecError

    if support not in SUPPORTS:
        raise AttnSpecError(f"--support {support!r}: choose {', '.join(SUPPORTS[:-1])} or {SUPPORTS[-1]}")
    if qk_from is not None:
        subject = load_subject(qk_from)
        model = subject.model(float64=True)
        if not subject.trained or model.blocks[0].mixer.kind != "softmax":
            raise AttnSpecError(f"{qk_from}: --qk-from takes a trained run of a softmax-attention model")
        sets = trained_sets(model, subject.inputs(samples, seed=seed))
        causal = model.blocks[0].mixer.causal
        title = f"{subject.spec.name}: trained q/k"
    else:
        sets = synthetic_sets(heads=heads, d_qk=d_qk, length=length, sharpness=sharpness or [0.25, 0.5, 1, 1.5, 2, 3],
                              samples=samples, seed=seed)
        title = f"synthetic q/k (L = {length}, d_qk = {d_qk})"
    rows = study(sets, causal=causal, budgets=tuple(budgets or BUDGETS), support={"kind": support})
    files = write(rows, output, title)
    methods = list(dict.fromkeys(row.method for row in rows))
    columns = [column.replace("scatterbrain[", "SB ").replace(f"{support} ", "").rstrip("]").replace("sparse[", "sparse ")
               for column in ("q/k", "entropy", "budget", *methods)]
    table, strong = [], set()
    for source, budget in dict.fromkeys((row.source, row.budget) for row in rows):
        mine = {row.method: row for row in rows if (row.source, row.budget) == (source, budget)}
        best = min(row.error_mean for row in mine.values())
        strong |= {(len(table), 3 + i) for i, method in enumerate(methods) if mine[method].error_mean == best}
        table.append([source, f"{next(iter(mine.values())).entropy:.2f}", f"1/{round(1 / budget)}",
                      *(f"{mine[method].error_mean:.3g}" for method in methods)])
    return Result(Table(f"||A - softmax||_F / ||softmax||_F (mean over heads and samples); SB: Scatterbrain on the "
                        f"{support} support at a sparse:low-rank ratio", columns, table, left=frozenset({"q/k"}),
                        strong=frozenset(strong)), files)


DIAGNOSTIC = Diagnostic(
    "scatterbrain",
    "Scatterbrain's study (Chen et al. 2021): sparse alone, Performer alone and Scatterbrain at each sparse:low-rank "
    "ratio (and at the ratio chosen from the entropy) against exact softmax, by budget and by attention entropy.",
    (output_option("scatterbrain.csv and its plots"),
     Parameter("qk_from", Path, "Use the q and k of every layer of this trained softmax run on its task's test inputs "
                                "instead of synthetic ones.", default=None, metavar="RUN"),
     Parameter("length", int, "Positions of synthetic q/k.", default=256, minimum=8, maximum=4096),
     Parameter("heads", int, "Heads of synthetic q/k.", default=4, minimum=1, maximum=64),
     Parameter("d_qk", int, "Width of synthetic q/k.", default=32, minimum=1, maximum=512),
     Parameter("sharpness", float, "Standard deviation of synthetic q and k (repeatable; default 0.25 0.5 1 1.5 2 3).",
               default=None, minimum=0.01, maximum=100, many=True),
     Parameter("budgets", float, "Fraction of a row each query may spend (repeatable; default 1/32 1/16 1/8 1/4 1/2).",
               default=None, flags=("--budget",), minimum=0.001, maximum=1, many=True),
     Parameter("support", str, "Sparse support: lsh (the shipped one), local, block or topk (exact, a reference).",
               default="lsh"),
     Parameter("causal", bool, "Causal mask (synthetic q/k; a run uses its mixer's).", default=True,
               flags=("--causal/--bidirectional",)),
     Parameter("samples", int, "Synthetic draws, or test sequences of a run.", default=2, minimum=1, maximum=256),
     SEED),
    run)
