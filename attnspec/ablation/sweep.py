"""A sweep file: what an ablation compares, validated and expanded into runs before anything runs.

A sweep names a base spec, the variants (named override sets and grid axes over spec paths), the
tasks (each with a grid over its own parameters), seeds, a learning-rate grid and the training
budget. :func:`load_sweep` validates the file (strict, ``file:line:col`` errors like specs);
:func:`expand` turns it into :class:`PlannedRun` s, one per (variant, task point, seed, learning
rate), each with its resolved spec and training configuration validated exactly as ``attnspec
train`` would, so a sweep that expands has no run that fails validation.

A run's key is a hash of its resolved spec and resolved training configuration (task, budget, seed
and learning rate included), not of the names in the sweep: renaming a variant or adding one reuses
every finished run, and two variants that resolve to the same model are one run.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import json
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

from pydantic import Field, create_model

from attnspec.errors import Problem, SpecError, shorten
from attnspec.spec.compose import set_path
from attnspec.spec.ir import Count, Node, Seed
from attnspec.spec.source import Position, SourceMap, format_path
from attnspec.spec.validate import validate_data, validate_model
from attnspec.training.config import TrainConfig
from attnspec.training.tasks import TaskUnion

KEY_FORMAT = 2
"""Version of :func:`run_key`'s input. 2: values at their defaults left out (1 hashed every field, so
each release that added a spec or training field with a default gave every existing run a new key)."""
MAX_RUNS = 10_000
"""A sweep expanding to more runs than this is refused (raise ``max_runs`` up to this)."""
_Name = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.+\-]+$")]
_PathText = Annotated[str, Field(min_length=1, max_length=500)]
_Values = Annotated[list[Any], Field(min_length=1, max_length=1000)]

_BUDGET_EXCLUDED = ("task", "seed", "lr")
TrainBudget = create_model(
    "TrainBudget", __base__=Node, __doc__="The training configuration of every run (`attnspec train`'s fields, but "
                                          "the task, seed and learning rate, which the sweep sets).",
    **{name: (info.annotation, info) for name, info in TrainConfig.model_fields.items() if name not in _BUDGET_EXCLUDED})


class TaskSweep(Node):
    """One task of the sweep and the grid over its parameters."""

    task: TaskUnion
    """The task's fixed parameters (`{kind: mqar, vocab_size: 64}`)."""
    grid: dict[_PathText, _Values] = Field(default_factory=dict)
    """Task parameter -> values; every combination is a task point (`{seq_len: [64, 128], num_kv_pairs: [4, 8]}`)."""
    name: _Name | None = None
    """The task's name in reports (default: its kind)."""
    difficulty: _PathText | None = None
    """The grid parameter plotted on the x axis (default: the first grid parameter)."""


class Sweep(Node):
    """An ablation: variants x tasks x seeds x learning rates, each an `attnspec train` run."""

    version: Literal[1] = 1
    name: _Name
    description: str = ""
    base: Annotated[str, Field(min_length=1, max_length=4096)] | dict[str, Any]
    """The base spec: a file (relative to the sweep file) or the spec itself as a mapping."""
    set: dict[_PathText, Any] = Field(default_factory=dict)
    """Changes to the base for every variant (`path: value`, the paths of `--set`)."""
    variants: dict[_Name, dict[_PathText, Any]] = Field(default_factory=lambda: {"base": {}})
    """Named override sets (`path: value`); `{}` is the base itself."""
    grid: dict[_PathText, _Values] = Field(default_factory=dict)
    """Spec path -> values, crossed with every variant (`{"blocks[*].mixer.heads": [2, 4]}`)."""
    tasks: Annotated[list[TaskSweep], Field(min_length=1, max_length=100)]
    seeds: Annotated[list[Seed], Field(min_length=1, max_length=100)] = Field(default_factory=lambda: [0])
    """Each seed sets the data stream and the model's initialisation (the spec's `seed`)."""
    lr: Annotated[list[Annotated[float, Field(gt=0, le=10)]], Field(min_length=1, max_length=100)] = Field(
        default_factory=lambda: [1e-3])
    """Learning rates; reports show each variant and task at its best (Zoology's protocol)."""
    train: TrainBudget = Field(default_factory=TrainBudget)  # type: ignore[valid-type]
    """The training budget and schedule of every run (steps, batch_size, eval_every, ...)."""
    metric: Literal["accuracy", "perplexity", "loss"] | None = None
    """The metric reports compare (default: the tasks' own: accuracy, or perplexity for text)."""
    max_runs: Count(MAX_RUNS) = 1000
    """Refuse to expand to more runs than this (a guard against a grid written too wide)."""


@dataclass
class PlannedRun:
    """One (variant, task point, seed, learning rate) of a sweep, resolved and validated."""

    key: str
    variant: str
    variant_params: dict[str, Any]
    task: str
    task_params: dict[str, Any]
    seed: int
    lr: float
    spec: Any = field(repr=False)
    """The resolved :class:`~attnspec.spec.ir.Spec`."""
    spec_data: dict = field(repr=False)
    config_data: dict = field(repr=False)

    @property
    def label(self) -> str:
        task = self.task + "".join(f" {k}={v}" for k, v in self.task_params.items())
        return f"{self.variant} | {task} | seed {self.seed} | lr {self.lr:g}"

    def to_json(self) -> dict:
        """What the runs directory records of this run (the sweep's names for it)."""
        return {"key": self.key, "variant": self.variant, "variant_params": self.variant_params, "task": self.task,
                "task_params": self.task_params, "seed": self.seed, "lr": self.lr}


@dataclass
class Variant:
    """A resolved variant: its name, grid values, spec data and the paths where it differs from the base."""

    name: str
    params: dict[str, Any]
    data: dict
    smap: SourceMap = field(repr=False)
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    """(path, base value, variant value); a missing value is :data:`MISSING`."""


MISSING = "<absent>"


@dataclass
class LoadedSweep:
    """A validated sweep with its file (base paths resolve against it) and source map."""

    sweep: Sweep
    file: FsPath | None
    smap: SourceMap = field(repr=False)
    text: str = ""


def load_sweep(source: str | FsPath | dict) -> LoadedSweep:
    """Read and validate a sweep file (or sweep data).

    Raises:
        SpecError: located at the file's line and column.
    """
    from attnspec.spec.load import read_text_file
    from attnspec.spec.yaml_front import parse_yaml

    if isinstance(source, dict):
        data, smap, file, text = source, SourceMap(), None, ""
    else:
        file = FsPath(source)
        text = read_text_file(file)
        data, smap = parse_yaml(text, str(file))
    sweep = validate_model(Sweep, data, smap, what="sweep")
    return LoadedSweep(sweep, file, smap, text)


def base_data(loaded: LoadedSweep) -> tuple[dict, SourceMap]:
    """The base spec's data (its `extends` and `set` applied, then the sweep's `set`)."""
    from attnspec.spec.load import load_data

    sweep, smap = loaded.sweep, loaded.smap
    if isinstance(sweep.base, dict):
        data, data_map = dict(sweep.base), smap.subtree(("base",))
    else:
        where = smap.value_at(("base",))
        target = FsPath(sweep.base)
        if not target.is_absolute():
            target = (loaded.file.parent if loaded.file is not None else FsPath.cwd()) / target
        try:
            data, data_map = load_data(target)
        except SpecError as error:
            if any(problem.source == str(target) and problem.line is None for problem in error.problems):
                raise SpecError([Problem(f"base spec {shorten(sweep.base)}: {problem.message}", path="base",
                                         source=getattr(where, "source", None), line=getattr(where, "line", None),
                                         column=getattr(where, "column", None)) for problem in error.problems]) from None
            raise
    for path_text, value in sweep.set.items():
        data = _patch(data, data_map, smap, ("set", path_text), value)
    return data, data_map


def resolve_variants(loaded: LoadedSweep) -> list[Variant]:
    """Every variant (named set x grid point), its spec validated and compared with the base.

    Raises:
        SpecError: every problem of every variant, located in the sweep file (or the base spec).
    """
    check_run_count(loaded)  # before any grid point is resolved: a grid written too wide is refused at once
    sweep, smap = loaded.sweep, loaded.smap
    base, base_map = base_data(loaded)
    base_flat, base_set = _resolved_data(base, base_map)
    axes = list(sweep.grid.items())
    variants, problems = [], []
    for name, overrides in sweep.variants.items():
        for point in itertools.product(*(values for _, values in axes)) if axes else [()]:
            params = {path: value for (path, _), value in zip(axes, point)}
            label = name + (f"[{','.join(f'{_short(p)}={v}' for p, v in params.items())}]" if params else "")
            data, data_map = base, _copy_map(base_map)
            try:
                for path_text, value in overrides.items():
                    data = _patch(data, data_map, smap, ("variants", name, path_text), value)
                for (path_text, values), value in zip(axes, point):
                    data = _patch(data, data_map, smap, ("grid", path_text, values.index(value)), value,
                                  path_text=path_text)
                flat, variant_set = _resolved_data(data, data_map)
            except SpecError as error:
                problems.extend(_prefixed(error, f"variant {label}"))
                continue
            differences = [(path, base_flat.get(path, MISSING), flat.get(path, MISSING))
                           for path in sorted(set(base_flat) | set(flat), key=_path_order(flat, base_flat))
                           if not _same(base_flat.get(path, MISSING), flat.get(path, MISSING))
                           and not _default_beside_absent(path, base_flat, base_set, flat, variant_set)]
            variants.append(Variant(label, params, data, data_map, differences))
    if problems:
        raise SpecError(problems)
    return variants


def expand(loaded: LoadedSweep, variants: list[Variant] | None = None) -> list[PlannedRun]:
    """Every run of the sweep, validated: variants x task points x seeds x learning rates.

    Raises:
        SpecError: a variant or task point is invalid, a task does not fit a variant's model, or the
            sweep expands to more than ``max_runs`` runs; located in the sweep file.
    """
    from attnspec.spec import spec_to_data
    from attnspec.training.loop import check_fit

    sweep, smap = loaded.sweep, loaded.smap
    check_run_count(loaded)
    variants = resolve_variants(loaded) if variants is None else variants
    points = task_points(loaded)
    budget = sweep.train.model_dump(by_alias=True, exclude_unset=True)
    runs, problems = [], []
    for variant in variants:
        for task_index, task_name, task_params, task_data in points:
            for seed in sweep.seeds:
                spec_data = {**variant.data, "seed": seed}
                try:
                    spec = validate_data(spec_data, variant.smap)
                    config_map = _config_map(smap, task_index)
                    config = validate_model(TrainConfig, {**budget, "task": task_data, "seed": seed, "lr": sweep.lr[0]},
                                            config_map, what="training configuration")
                    check_fit(spec, config.task, config_map)
                except SpecError as error:
                    problems.extend(_prefixed(error, f"variant {variant.name}, task {task_name} {task_params}"))
                    break
                # the run is named after its variant (its run.json, a build of it, an eval say "gla", not the
                # base spec's name); the key hashes the computation, which a name does not change
                resolved_spec = {**spec_to_data(spec, minimal=False), "name": variant.name}
                # the version always: a new version is a new default, which minimal data would drop
                spec_identity = {**spec_to_data(spec, minimal=True), "version": spec.version}  # the base's name
                for lr in sweep.lr:
                    config_data = {**config.model_dump(by_alias=True), "lr": lr}
                    config_identity = {**config.model_dump(by_alias=True, exclude_defaults=True), "lr": lr}
                    runs.append(PlannedRun(run_key(spec_identity, config_identity), variant.name, variant.params,
                                           task_name, task_params, seed, lr, spec, resolved_spec, config_data))
    if problems:
        raise SpecError(problems)
    return runs


def count_runs(sweep: Sweep) -> int:
    """How many runs ``sweep`` expands to (variants x grid points x task points x seeds x learning
    rates), counted from the grids' sizes alone, without building any of them."""
    variants = len(sweep.variants) * math.prod(len(values) for values in sweep.grid.values())
    points = sum(math.prod(len(values) for values in entry.grid.values()) for entry in sweep.tasks)
    return variants * points * len(sweep.seeds) * len(sweep.lr)


def check_run_count(loaded: LoadedSweep) -> None:
    """Refuse a sweep that expands to more than its ``max_runs``, located at ``max_runs``."""
    total = count_runs(loaded.sweep)
    if total > loaded.sweep.max_runs:
        raise SpecError(_at(loaded.smap, ("max_runs",), f"the sweep expands to {total:,} runs, over max_runs = "
                                                        f"{loaded.sweep.max_runs:,}; raise max_runs (at most "
                                                        f"{MAX_RUNS:,}) or narrow the grids"))


def run_key(spec_data: dict, config_data: dict) -> str:
    """The run's identity: a hash of its resolved spec and training configuration, each as data with the
    values at their defaults left out (16 hex digits). Equal keys are the same computation; a release
    that adds a field whose default keeps the old behaviour leaves every key, and so every finished
    run of a sweep directory, as it was. (A default that changes behaviour comes with a new spec
    `version`, which the resolved spec then records.)"""
    text = json.dumps({"format": KEY_FORMAT, "spec": spec_data, "config": config_data}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def difficulty_axis(task: TaskSweep) -> str | None:
    """The task parameter reports plot against (the sweep's `difficulty`, else the first grid key)."""
    return task.difficulty or next(iter(task.grid), None)


# --------------------------------------------------------------------------- helpers


def task_points(loaded: LoadedSweep) -> list[tuple[int, str, dict, dict]]:
    """(task index, name, grid values, task data) for every point of every task's grid."""
    points = []
    problems = []
    names: dict[str, int] = {}
    for index, entry in enumerate(loaded.sweep.tasks):
        name = entry.name or entry.task.kind
        if name in names:
            problems.append(_at(loaded.smap, ("tasks", index), f"two tasks are named {name!r} (tasks[{names[name]}] "
                                                               "and this one); give them different `name`s"))
        names[name] = index
        fixed = entry.task.model_dump(by_alias=True, exclude_unset=True)
        fields = {info.alias or field_name for field_name, info in type(entry.task).model_fields.items()}
        for where, parameter in [(("tasks", index, "difficulty"), entry.difficulty),
                                 *((("tasks", index, "grid", key), key) for key in entry.grid)]:
            if parameter is not None and parameter not in fields:
                problems.append(_at(loaded.smap, where, f"{parameter!r} is not a parameter of the {entry.task.kind} "
                                                        f"task; it has {', '.join(sorted(fields - {'kind'}))}",
                                    key=len(where) == 4))
        if entry.difficulty is not None and entry.difficulty in fields and entry.difficulty not in entry.grid:
            problems.append(_at(loaded.smap, ("tasks", index, "difficulty"),
                                f"the difficulty axis {entry.difficulty!r} must be one of this task's grid parameters "
                                f"({', '.join(entry.grid) or 'it has no grid'})"))
        keys = list(entry.grid)
        for values in itertools.product(*entry.grid.values()) if keys else [()]:
            params = dict(zip(keys, values))
            points.append((index, name, params, {**fixed, **params}))
    if problems:
        raise SpecError(problems)
    return points


def _patch(data: dict, data_map: SourceMap, smap: SourceMap, where_path: tuple, value: Any,
           path_text: str | None = None) -> dict:
    """``data`` with one sweep override applied, errors located at the sweep's key ``where_path``."""
    where = smap.key_at(where_path) or Position("sweep")
    text = path_text if path_text is not None else where_path[-1]
    value_map = smap.subtree(where_path)
    if not value_map.values:
        value_map.values[()] = smap.value_at(where_path) or where
    return set_path(data, data_map, text, value, where, value_map)


def _resolved_data(data: dict, data_map: SourceMap) -> tuple[dict[str, Any], set[str]]:
    """The resolved spec's leaves (path text -> value, :func:`_flatten`), and the paths of those set away from
    their defaults."""
    from attnspec.spec import spec_to_data

    spec = validate_data(data, data_map)
    return _flatten(spec_to_data(spec, minimal=False)), set(_flatten(spec.model_dump(mode="json",
                                                                                      exclude_defaults=True)))


def _default_beside_absent(path: str, base: dict, base_set: set, variant: dict, variant_set: set) -> bool:
    """A field one side's component lacks (another kind of mixer) and the other holds at its default
    (``sinks: false`` of softmax attention beside a linear mixer): no difference a reader asked for. A
    component's ``kind`` is always shown (what the other side's mixer is made of)."""
    if path.endswith("kind"):
        return False
    if path not in base:
        return path not in variant_set
    if path not in variant:
        return path not in base_set
    return False


def _same(base: Any, variant: Any) -> bool:
    """Whether two resolved values mean the same: equal, or one null where the other is absent (a field
    whose null is its default, written out on one side only)."""
    return base == variant or {repr(base), repr(variant)} == {repr(None), repr(MISSING)}


def _flatten(value: Any, prefix: tuple = ()) -> dict[str, Any]:
    """Leaf path text -> value of resolved spec data (lists of numbers stay whole)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, prefix + (key,)))
        return out
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, prefix + (index,)))
        return out
    return {format_path(prefix): value}


def _path_order(*tables: dict):
    order = {path: i for table in tables for i, path in enumerate(table)}
    return lambda path: order.get(path, 0)


def _short(path_text: str) -> str:
    return path_text.rsplit(".", 1)[-1]


def _copy_map(smap: SourceMap) -> SourceMap:
    return SourceMap(dict(smap.values), dict(smap.keys), smap.root)


def _config_map(smap: SourceMap, task_index: int) -> SourceMap:
    """Positions of a run's training configuration: the sweep's `train`, its task and its grid."""
    out = SourceMap(root=smap.root)
    out.replace_subtree((), smap.subtree(("train",)))
    out.replace_subtree(("task",), smap.subtree(("tasks", task_index, "task")))
    for (path, position) in smap.subtree(("tasks", task_index, "grid")).keys.items():
        if len(path) == 1:
            out.keys[("task", path[0])] = out.values[("task", path[0])] = position
    return out


def _at(smap: SourceMap, path: tuple, message: str, key: bool = False) -> Problem:
    where = smap.key_at(path) if key else smap.value_at(path)
    return Problem(message, path=format_path(path), source=getattr(where, "source", None),
                   line=getattr(where, "line", None), column=getattr(where, "column", None))


def _prefixed(error: SpecError, what: str) -> list[Problem]:
    from dataclasses import replace

    return [replace(problem, message=f"{what}: {problem.message}") for problem in error.problems]


def sweep_json_schema() -> dict:
    """The sweep file's JSON Schema (draft-07, for editors)."""
    from attnspec.spec.schema import DRAFT_07, widen_component_unions

    schema = Sweep.model_json_schema(ref_template="#/definitions/{model}", mode="validation")
    schema["definitions"] = schema.pop("$defs", {})
    widen_component_unions(schema)
    return {"$schema": DRAFT_07, "$id": "https://attnspec.dev/schema/sweep.schema.json", **schema}


def sweep_json_schema_text() -> str:
    """The schema as committed at ``schema/sweep.schema.json``."""
    return json.dumps(sweep_json_schema(), indent=2) + "\n"


__all__ = ["Sweep", "TaskSweep", "PlannedRun", "Variant", "LoadedSweep", "load_sweep", "resolve_variants", "expand",
           "run_key", "difficulty_axis", "sweep_json_schema", "sweep_json_schema_text", "MAX_RUNS"]
