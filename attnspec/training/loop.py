"""``attnspec train``: a spec and a task become a trained model in a run directory.

One optimiser step, on every process:

1. the global batch of step ``s`` is generated from (seed, "train", s) (:mod:`attnspec.training.tasks`);
   process ``r`` of ``N`` takes its slice ``[r B/N, (r+1) B/N)``, cut into ``accumulate`` micro-batches;
2. each micro-batch's loss is its summed cross-entropy over answer positions divided by the number
   of answer positions in the *global* batch (times N, which DDP's gradient mean divides out), so
   the gradient is that of the global mean whatever N and ``accumulate`` are;
3. clip, AdamW with the components' optimiser groups, warm-up + cosine schedule.

A run is one stage, or several (``stages``), each with its objective (the task's cross-entropy, distillation,
attention transfer), frozen parameters, low-rank adapters, fresh AdamW and schedule; a stage's end is
evaluated, its adapters merged into the weights and checkpointed, and the next stage starts from them.

Only rank 0 writes the run directory. A run is a pure function of (spec, configuration): the
data of a step depend on the step alone and nothing draws from a global random state, so a run
resumed from a checkpoint repeats the uninterrupted run's losses bit for bit on the CPU.

A run whose loss or gradient norm is not finite stops at once, before the optimiser applies that
step: run.json records ``status: diverged`` with the step, no result is written, the last finite
checkpoint stays, and :class:`~attnspec.errors.TrainingDiverged` is raised (the CLI exits non-zero;
a sweep lists the run as diverged and never reports it as a result).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.errors import AttnSpecError, Problem, RunError, RunInterrupted, SpecError, TrainingDiverged, shorten
from attnspec.io import VERSION
from attnspec.nn.model import redraw_random_features
from attnspec.training import rundir
from attnspec.training.config import StagePlan, TrainConfig, load_config
from attnspec.training import lora
from attnspec.training.optim import (frozen_parameters, learning_rate, make_optimizer, parameter_groups,
                                     set_learning_rate)
from attnspec.training.recompute import blocks_to_recompute, recompute_blocks
from attnspec.training.tasks import IGNORE, Task
from attnspec.training.tasks.base import learned

ProgressCallback = Callable[[dict], None]
"""Receives ``{"event": "start" | "step" | "eval" | "end", ...}``; the CLI draws progress from it."""


@dataclass
class Run:
    """A finished (or stopped) run: its directory, the model, the last evaluation and the history."""

    directory: Path | None
    model: nn.Module
    config: TrainConfig
    step: int
    metrics: dict
    history: list[dict] = field(default_factory=list)

    @property
    def losses(self) -> list[float]:
        """Training loss of every step, in order."""
        return [record["loss"] for record in self.history if record.get("split") == "train"]


def train(spec: Any, config: TrainConfig | dict | str | Path | None = None, *, output: str | Path | None = None,
          overrides: Iterable[str] = (), task: str | None = None, task_overrides: Iterable[str] = (),
          resume: bool = False, on_progress: ProgressCallback | None = None, stop_after: int | None = None,
          **flags: Any) -> Run:
    """Train the model of ``spec`` on a task.

    Args:
        spec: a spec path, spec data or :class:`~attnspec.spec.ir.Spec` (ignored with ``resume``).
        config: a :class:`TrainConfig`, its data, or a YAML file; ``task``/``task_overrides``/``flags``
            (``steps=``, ``batch_size=``, ``lr=``, ``seed=``, ...) override it, as the CLI's flags do.
        output: the run directory (None: train in memory, write nothing).
        overrides: ``"path=value"`` changes to the spec, as ``--set``.
        resume: continue the run in ``output`` from its latest checkpoint (spec and configuration are
            the run's own). The command that started the run may be given again (``spec``, ``config``,
            ``task``, flags): each must be the run's own, except ``steps``, which may be raised to train a
            run further, finished or not (the learning rate then follows the new total's schedule).
        on_progress: called with each step's and evaluation's record.
        stop_after: stop (with a checkpoint) after this step, as if interrupted (tests, time limits).

    Returns:
        The :class:`Run`; ``run.model`` is the trained model in eval mode.

    Raises:
        SpecError: the spec, the configuration or their combination is invalid (nothing is written).
        RunError: the run directory cannot be created or resumed.
    """
    spec, config, directory = training_inputs(spec, config, output=output, overrides=overrides, task=task,
                                              task_overrides=task_overrides, resume=resume, **flags)
    return Trainer(spec, config, directory, resume, on_progress).run(stop_after)


def training_inputs(spec: Any, config: TrainConfig | dict | str | Path | None = None, *,
                    output: str | Path | None = None, overrides: Iterable[str] = (), task: str | None = None,
                    task_overrides: Iterable[str] = (), resume: bool = False, processes: int = 1,
                    **flags: Any) -> tuple[Any, TrainConfig, Path | None]:
    """:func:`train`'s spec, configuration and run directory, and everything about them checked that needs
    no model: the spec, the configuration and their fit (vocabulary, length, head), a resume's agreement
    with the run, a new run's directory (empty), and what ``processes`` processes can train. ``attnspec
    train --nproc N`` calls it before torchrun starts, so what a rank would refuse is one error line from
    the launching process. Raises SpecError or RunError (nothing is written)."""
    from attnspec.compiler.lower import as_spec

    directory = Path(output) if output is not None else None
    if resume:
        if directory is None:
            raise rundir.RunError("--resume needs the run directory (-o RUN_DIR)")
        recorded_spec, recorded_config = rundir.recorded(directory, rundir.read_run(directory))
        spec, config = recorded_spec, _resumed_config(directory, recorded_spec, recorded_config, spec, config,
                                                      tuple(overrides), task, tuple(task_overrides), flags)
    else:
        spec = as_spec(spec, tuple(overrides))
        if isinstance(config, TrainConfig):
            config = config.model_dump(by_alias=True)
        config = load_config(config, task=task, task_overrides=task_overrides, **flags)
        if directory is not None:
            rundir.check_new(directory)
    check_fit(spec, config.task)
    check_processes(config, processes)
    return spec, config, directory


def check_processes(config: TrainConfig, processes: int) -> None:
    """Refuse, before any work, what one process alone can train when ``processes`` would run it."""
    if processes <= 1:
        return
    stages = config.stage_list()
    if len(stages) > 1:
        raise SpecError(Problem("a staged run changes what trains between its stages, which the processes' "
                                "DistributedDataParallel or FSDP wrapping fixes: train it with one process",
                                path="stages", source="training configuration"))
    if any(stage.objective == "transfer" for stage in stages):
        raise SpecError(Problem("attention transfer runs each mixer outside the model's forward, which "
                                "DistributedDataParallel does not see: train it with one process",
                                path="transfer", source="training configuration"))


def _resumed_config(directory: Path, recorded_spec, recorded: TrainConfig, spec, config, overrides: tuple,
                    task, task_overrides: tuple, flags: dict) -> TrainConfig:
    """The configuration a resume continues with: the run's own, with ``steps`` raised where the command asks
    (``--steps``, or the same command with a larger ``steps``). What else the command gives must be the
    run's own: a spec or configuration that differs is a RunError naming the difference (a resume never
    trains another model or on other data than the checkpoint's)."""
    from attnspec.compiler.lower import as_spec
    from attnspec.spec.emit import spec_to_data

    given = {name: value for name, value in flags.items() if value is not None}
    fix = f"--resume continues the run's own; give `-o {directory}` alone (or with --steps to train further), " \
          "or train the new settings into another directory"
    if spec is not None or overrides:
        if spec is None:
            raise RunError(f"--set changes a spec, and the run's is its own; {fix}")
        ours, theirs = spec_to_data(as_spec(spec, overrides), minimal=False), spec_to_data(recorded_spec, minimal=False)
        ours.pop("name", None), theirs.pop("name", None)
        if ours != theirs:
            field = next(key for key in sorted({*ours, *theirs}) if ours.get(key) != theirs.get(key))
            raise RunError(f"the spec differs from the one {directory} trains (at `{field}`); {fix}")
    steps = given.pop("steps", None)
    if config is not None or task is not None or task_overrides or given:
        built = load_config(config, task=task, task_overrides=task_overrides, **given)
        ours, theirs = built.model_dump(by_alias=True), recorded.model_dump(by_alias=True)
        steps = built.steps if steps is None else steps
        differing = [key for key in sorted(ours) if key != "steps" and ours[key] != theirs.get(key)]
        if differing:
            raise RunError(f"the training configuration differs from the one {directory} records "
                           f"({', '.join(differing)}); {fix}")
    if steps is None or steps == recorded.steps:
        return recorded
    if steps < recorded.steps:
        raise RunError(f"--steps {steps}: {directory} trains {recorded.steps} steps; a resume may raise them (to train "
                       "further), never lower them")
    if recorded.stages is not None:
        raise RunError(f"{directory} trains in stages, whose steps are theirs: a stage's steps cannot be raised on "
                       "resume; train a new run that starts from this one (`init_weights`)")
    return load_config({**recorded.model_dump(by_alias=True, exclude_none=True), "steps": steps})


def check_fit(spec, task: Task, smap=None) -> None:
    """Refuse a task the model cannot take (vocabulary, length, head), located at the task
    (at its line and column when ``smap``, the configuration's source map, is given)."""
    from attnspec.spec.ir import LmHead

    vocab = getattr(spec.input, "vocab_size", None) if spec.input.kind == "tokens" else None
    problems = []
    for path, message in task.problems(vocab_size=vocab, max_len=spec.max_len):
        where = smap.value_at(("task", *path)) if smap is not None else None
        problems.append(Problem(message, path="task" + "".join(f".{part}" for part in path),
                                source=where.source if where else "training configuration",
                                line=where.line if where else None, column=where.column if where else None))
    if not isinstance(spec.head, LmHead):
        problems.append(Problem(f"tasks predict a token at each position; the spec's head is {spec.head.kind}, use "
                                "`head: lm`", path="head", source="spec"))
    if spec.dtype == "float16":  # float16's range needs loss scaling (GradScaler), which the trainer does not do
        problems.append(Problem("training a model whose parameters are float16 is not supported (its gradients "
                                "underflow without loss scaling); train it at `dtype: bfloat16` (`--set "
                                "dtype=bfloat16`) and cast the build, or at float32", path="dtype", source="spec"))
    if problems:
        raise SpecError(problems)


class Trainer:
    """One run: set up model, optimiser, data and the run directory, then loop (see the module doc)."""

    def __init__(self, spec, config: TrainConfig, directory: Path | None, resume: bool,
                 on_progress: ProgressCallback | None):
        from attnspec.compiler.plan import plan_spec
        from attnspec.nn.model import build_model_from_spec
        from attnspec.training import distributed

        self.spec, self.config, self.directory = spec, config, directory
        self.on_progress = on_progress or (lambda record: None)
        self.dist = distributed.setup(config.device, config.parallel)
        self.device = self.dist.device
        world = self.dist.world_size
        if config.batch_size % (world * config.accumulate):
            raise SpecError(Problem(f"batch_size = {config.batch_size} must divide into {world} process(es) x "
                                    f"accumulate = {config.accumulate} micro-batches", path="batch_size"))
        self.micro = config.batch_size // (world * config.accumulate)
        self.compiled = config.compile == "on" or (config.compile == "auto" and self.device.type == "cuda")
        bfloat16 = _uses_bfloat16_autocast(config.precision, self.device, spec.dtype)
        if spec.dtype == "bfloat16" and config.precision == "float32":
            raise SpecError(Problem("the spec's parameters are bfloat16, so its products are; `precision: float32` "
                                    "contradicts it: leave `precision` at auto, or train at `dtype: float32`",
                                    path="precision", source="training configuration"))
        recorded = rundir.recorded_modes(rundir.read_run(directory)) if resume else None
        self.plan = plan_spec(spec, config.task.seq_len, batch=self.micro, training=True,
                              calibration=self._calibration(spec, config, world, resumed=recorded is not None),
                              device=self.device.type,
                              dtype="bfloat16" if bfloat16 else None, recorded=recorded,
                              packed=config.task.packs_documents)
        # A bfloat16 spec trains float32 master weights (the optimiser's, the checkpoints') and computes in
        # bfloat16 (autocast; FSDP gathers bfloat16 copies): AdamW's small updates vanish in bfloat16 weights.
        self.model = build_model_from_spec(spec.model_copy(update={"dtype": "float32"}) if spec.dtype == "bfloat16"
                                           else spec)
        self.weights_fit = None if resume else _load_init_weights(self.model, config.init_weights,
                                                                   config.init_weights_map)
        self.model = self.model.to(self.device)
        self.model.set_modes(self.plan.full_modes)
        self.stages = config.stage_list()
        check_processes(config, self.dist.world_size)
        self.autocast = _autocast(bfloat16, self.device)
        self.bfloat16, self.wrapped, self.teachers = bfloat16, None, {}
        self.recomputed = blocks_to_recompute(config.activation_checkpointing, len(self.model.blocks))
        if self.compiled and self.dist.sharded:  # FSDP gathers around each block: compile the blocks, not the step
            for block in self.model.blocks:
                block.forward = torch.compile(block.forward, fullgraph=True, dynamic=False)
        self.stage_metrics: dict[int, dict] = {}  # a stage's index -> the evaluation at its end
        self._check_stages()  # every stage's names and teachers, before anything is written
        resume_point = self._resume_point() if resume else None  # (the step, its checkpoint)
        self._enter_stage(self.stages[0] if resume_point is None else
                          next((plan for plan in self.stages if resume_point[0] < plan.end), self.stages[-1]))
        self.start = 0
        self.history: list[dict] = []
        self.writes = directory is not None and self.dist.rank == 0
        writer = _event_writer_class() if config.tensorboard and self.writes else None  # fail before writing
        # The task's data are made before the run directory: a data error (an empty token file, an
        # unreadable corpus) leaves nothing behind, so the same command can run again once it is fixed.
        config.task.prepare(lambda done, total: self.on_progress({"event": "prepare", "done": done, "total": total}))
        self.data_identity = config.task.data_identity()
        self.test_inputs, self.test_targets = config.task.batch("test", 0, config.test_examples, config.seed)
        self.chance = config.task.chance(config.seed, config.test_examples)  # of this test set; None: perplexity
        config.task.batch("train", 0, config.batch_size, config.seed)
        self.fresh = not resume  # a new directory that holds no checkpoint yet
        self.step = self.checkpointed = 0  # the steps taken, and the latest checkpoint's (for an interrupt)
        if resume_point is not None:
            self._resume(*resume_point)
        elif self.writes:
            rundir.create(directory)
            tokenizer = config.task.text_tokenizer()
            if tokenizer is not None:  # the run directory is whole without the task's files
                from attnspec.tokenizer import save_tokenizer

                save_tokenizer(tokenizer, directory)
            self._write_run_files("running")
        if writer is not None:
            from attnspec.io import ensure_directory

            self.tensorboard = writer(str(ensure_directory(directory / "tensorboard")))
        else:
            self.tensorboard = None
        self.dist.barrier()

    # ------------------------------------------------------------------ the loop
    def run(self, stop_after: int | None = None) -> Run:
        """Train to ``config.steps`` (or ``stop_after``); see the module doc. A user error before the first
        checkpoint of a new run removes the run directory it made (nothing of it could be resumed)."""
        try:
            return self._loop(stop_after)
        except AttnSpecError as error:
            if self.fresh and self.writes and not isinstance(error, TrainingDiverged):
                if self.tensorboard is not None:
                    self.tensorboard.close()
                rundir.discard_unstarted(self.directory)
            raise
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI raises it as one)
            raise self._interrupted() from None

    def _interrupted(self) -> RunInterrupted:
        """Leave the run directory resumable or gone: before the first checkpoint it holds nothing to
        resume, so attnspec's own files are removed (the same command starts again); after it, run.json is
        marked `interrupted` at the latest checkpoint's step (``--resume`` continues from there)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        where = f"at step {self.step}" if self.step > self.start else "before its first step"
        if not self.writes:
            return RunInterrupted(f"training interrupted {where}")
        if self.fresh and rundir.discard_unstarted(self.directory):
            return RunInterrupted(f"training interrupted {where}, before its first checkpoint: the run directory "
                                  f"{self.directory} was removed; the same command starts it again")
        self._write_run_files("interrupted", self.checkpointed)
        if self.fresh:
            return RunInterrupted(f"training interrupted {where}, before its first checkpoint; {self.directory} "
                                  "holds files attnspec did not write, so it was left as it is (marked interrupted): "
                                  "remove it, or train into a new directory")
        return RunInterrupted(f"training interrupted {where}; {self.directory} keeps its checkpoint of step "
                              f"{self.checkpointed} (run.json: interrupted): add --resume to the same command to "
                              "continue from there")

    def _loop(self, stop_after: int | None) -> Run:
        config, task = self.config, self.config.task
        self.on_progress({"event": "start", "step": self.start, "steps": config.steps, "plan": self.plan.full_modes,
                          "planning": config.planning,
                          "parameters": sum(p.numel() for p in self.model.parameters()),
                          "trained": self._reached_by_objective(), "staged": config.stages is not None,
                          "device": str(self.device),
                          "compiled": self.compiled, "world_size": self.dist.world_size,
                          "parallel": self.config.parallel if self.dist.active else None,
                          "recomputed": len(self.recomputed), "adapted": len(self.adapted),
                          "init_weights": self.weights_fit.to_json() if self.weights_fit is not None else None})
        self.model.train()
        metrics: dict = {}
        step = self.start
        reached = False
        self._announce_stage()
        for step in range(self.start, config.steps):
            if step == self.stage.end:  # the stage before ended (evaluated, merged, checkpointed): the next begins
                self._enter_stage(self.stages[self.stage.index + 1])
                self._announce_stage()
            started = time.perf_counter()
            stage = self.stage  # each stage its own warm-up and cosine decay
            lr = learning_rate(step - stage.start, lr=stage.lr, warmup=stage.warmup, steps=stage.end - stage.start,
                               min_ratio=config.min_lr_ratio)
            set_learning_rate(self.optimizer, lr)
            loss, grad_norm, extra = self._step(step)
            self.step = step + 1
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                self._diverge(step + 1, {"loss": loss, "grad_norm": grad_norm}, lr)
            seconds = time.perf_counter() - started
            record = {"step": step + 1, "split": "train", "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": config.batch_size * task.seq_len / max(seconds, 1e-9),
                      **({"stage": stage.index} if config.stages is not None else {})}
            record.update(extra)
            self.history.append(record)
            if self.writes and (step + 1) % config.log_every == 0:
                rundir.append_metrics(self.directory, record)
                self._scalars("train", record)
            self.on_progress({"event": "step", **record, "steps": config.steps})
            done = step + 1 == config.steps
            if config.eval_every and (step + 1) % config.eval_every == 0 and not done:
                metrics = self._evaluate(step + 1)
                reached = self._reached(metrics)
                if config.checkpoint_every == 0 or reached:
                    self._checkpoint(step + 1)
            if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0 and not done:
                self._checkpoint(step + 1)
            if step + 1 == stage.end and not done and not reached:
                if not (config.eval_every and (step + 1) % config.eval_every == 0):
                    metrics = self._evaluate(step + 1)
                self._leave_stage(step + 1, metrics)
            if reached or (stop_after is not None and step + 1 >= stop_after and not done):
                if not reached:
                    self._checkpoint(step + 1)
                    self._finish("stopped", step + 1, metrics)
                    return Run(self.directory, self._final_model(), config, step + 1, metrics, self.history)
                break
        final = step + 1 if config.steps > self.start else self.start
        if not reached:  # a run stopped at its target was just evaluated and checkpointed
            metrics = self._evaluate(final)
            self._checkpoint(final)
        self._finish("done", final, metrics)
        self.on_progress({"event": "end", "step": final, **metrics})
        return Run(self.directory, self._final_model(), config, final, metrics, self.history)

    # ------------------------------------------------------------------ stages
    def _enter_stage(self, stage: StagePlan) -> None:
        """Set the model, the optimiser and the objective up for ``stage``: its adapters attached, its parameters
        frozen, a fresh AdamW over the rest, its objective (and teacher) in ``loss_fn``."""
        config = self.config
        staged = config.stages is not None
        where = f"stages[{stage.index}]." if staged else ""
        self.stage = stage
        self.adapted = self._adapt(stage.lora, f"{where}lora")
        # frozen before the wrapping: DDP's reducer and FSDP's shards take requires_grad as they find it
        fixed = lora.frozen_by_adapters(self.model, stage.lora, where=f"{where}lora.train") | \
            lora.frozen_bases(self.model)  # a LoRA stage trains its adapters (and lora.train) alone
        self.frozen = frozen_parameters(self.model, stage.freeze, fixed=fixed, where=f"{where}freeze")
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad_(name not in self.frozen)
        self.model.zero_grad(set_to_none=True)  # a gradient the stage before left on what this one freezes
        if self.wrapped is None:
            recompute_blocks(self.model, self.recomputed)
            self.wrapped = self.dist.wrap(self.model, self.bfloat16)  # before the optimiser: FSDP replaces them
        self.groups = parameter_groups(self.model, {k: v.model_dump(exclude_none=True) for k, v in config.groups.items()},
                                       self.frozen)
        self.names = [name for group in self.groups for name in group.names]
        self.optimizer = make_optimizer(self.model, self.groups, lr=stage.lr, weight_decay=config.weight_decay,
                                        betas=tuple(config.betas))
        self.loss_fn, self.teacher, self.term_prefix, self.transferred = _micro_loss, None, "", []
        if stage.objective == "distill":
            self.loss_fn = self._distill_objective(config)
            self.term_prefix = "distill_"
        elif stage.objective == "transfer":
            self.loss_fn = self._transfer_objective(config)
        if self.compiled and not self.dist.sharded:  # one graph for the whole objective (the teacher's too)
            self.loss_fn = torch.compile(self.loss_fn, fullgraph=True, dynamic=False)

    def _check_stages(self) -> None:
        """Every stage's adapters' targets and frozen patterns checked against the model (with the adapters it
        would add), and its teacher loaded (transfer's blocks chosen): a stage that cannot be is refused before
        the run starts, not when it is reached."""
        staged = self.config.stages is not None
        for stage in self.stages:
            where = f"stages[{stage.index}]." if staged else ""
            maps = {} if stage.lora is None else lora.matched_maps(self.model, stage.lora.targets, f"{where}lora.targets")
            added, bases = lora.adapter_names(maps)
            bases |= lora.frozen_by_adapters(self.model, stage.lora, added, f"{where}lora.train")
            frozen_parameters(self.model, stage.freeze, fixed=bases, where=f"{where}freeze", added=added)
            if stage.objective == "transfer":
                self._transfer_objective(self.config)
            elif stage.objective == "distill":
                self._distill_objective(self.config)

    def _announce_stage(self) -> None:
        """The stage's start, to the progress display (a staged run's)."""
        if self.config.stages is not None:
            self.on_progress({"event": "stage", **self.stage.to_json(), "count": len(self.stages),
                              "parameters": sum(p.numel() for p in self.model.parameters()),
                              "trained": self._reached_by_objective(), "adapted": len(self.adapted),
                              "transferred": self.transferred})

    def _reached_by_objective(self) -> int:
        """How many parameters the stage trains: those it does not freeze that its objective gives gradients (a
        transfer's reach the transferred mixers alone; AdamW leaves a parameter without a gradient as it is)."""
        trained = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        if self.stage.objective == "transfer":
            prefixes = tuple(f"blocks.{index}.mixer." for index in self.transferred)
            trained = [(name, p) for name, p in trained if name.startswith(prefixes)]
        return sum(p.numel() for _, p in trained)

    def _leave_stage(self, step: int, metrics: dict) -> None:
        """The end of a stage before another: its evaluation kept, its adapters merged into the weights, and a
        checkpoint of the merged model (which the next stage, and a resume there, start from)."""
        self.stage_metrics[self.stage.index] = metrics
        if self.adapted:
            lora.merge_adapters(self.model)
            self.adapted = []
        later = {plan.objective for plan in self.stages[self.stage.index + 1:]}
        self.teachers = {objective: teacher for objective, teacher in self.teachers.items() if objective in later}
        self._checkpoint(step)

    def _adapt(self, settings, where: str) -> list[str]:
        """The stage's low-rank adapters attached (:mod:`attnspec.training.lora`); the maps adapted."""
        if settings is None:
            return []
        if self.dist.sharded:
            raise SpecError(Problem("low-rank adapters are not written for `parallel: fsdp` (a checkpoint's merged "
                                    "weights need whole tensors): train them with ddp", path=where,
                                    source="training configuration"))
        return lora.attach_adapters(self.model, settings.targets, settings.rank, settings.scale_alpha(),
                                    settings.dropout, seed=self.spec.seed, where=f"{where}.targets")

    def _final_model(self) -> nn.Module:
        """The trained model in eval mode, its adapters merged into the weights (what the checkpoints hold)."""
        if self.adapted:
            lora.merge_adapters(self.model)
            self.adapted = []
        return self.model.eval()

    def _distill_objective(self, config: TrainConfig):
        """The config's distillation (:mod:`attnspec.training.distill`): its teacher loaded; the objective of a
        micro-batch."""
        from attnspec.training.distill import distill_loss, load_teacher

        if "distill" not in self.teachers:
            self.teachers["distill"] = load_teacher(config.distill, self.spec, config.task.seq_len, self.device)
        self.teacher = teacher = self.teachers["distill"]
        return lambda model, x, y, documents: distill_loss(model, teacher, x, y, config.distill, documents)

    def _transfer_objective(self, config: TrainConfig):
        """The config's attention transfer (:mod:`attnspec.training.transfer`): its teacher loaded, its blocks
        chosen; the objective of a micro-batch."""
        from attnspec.training.distill import teacher_model
        from attnspec.training.transfer import transfer_loss, transferred_blocks

        if "transfer" not in self.teachers:
            refuse = lambda message: SpecError(Problem(message, path="transfer.teacher",  # noqa: E731
                                                       source="training configuration"))
            self.teachers["transfer"] = teacher_model(config.transfer.teacher, self.spec, config.task.seq_len,
                                                      self.device, refuse)
        self.teacher = self.teachers["transfer"]
        self.transferred = transferred_blocks(self.model, self.teacher, config.transfer.blocks)
        teacher, blocks = self.teacher, self.transferred
        return lambda model, x, y, documents: transfer_loss(model, teacher, blocks, x, y, documents)

    def _dropout_draws(self, step: int, micro: int):
        """The adapters' dropout masks drawn from a generator seeded by the run's seed, the step, the micro-batch
        and the process, so that a resumed run draws what the uninterrupted one did (the global random state is
        not checkpointed); nothing where no adapter drops out."""
        if self.stage.lora is None or self.stage.lora.dropout == 0:
            return contextlib.nullcontext()
        return _seeded(((self.config.seed * 1_000_003 + step) * 1_009 + micro) * 65_537 + self.dist.rank, self.device)

    def _step(self, step: int) -> tuple[float, float, dict[str, float]]:
        """One optimiser step; returns the global mean loss, the gradient norm before clipping and the
        extra terms to log: the mean load-balancing loss of the MoE MLPs over the micro-batches
        (``moe_aux_loss``, where there are experts) and the distillation terms per answer position
        (``distill_ce``, ``distill_kl``, ``distill_hidden``)."""
        config = self.config
        inputs, targets = config.task.batch("train", step, config.batch_size, config.seed)
        answers = int((targets != IGNORE).sum())  # every process sees the global batch: no all-reduce needed
        rank = self.dist.rank
        inputs = inputs[rank * self.micro * config.accumulate:(rank + 1) * self.micro * config.accumulate]
        targets = targets[rank * self.micro * config.accumulate:(rank + 1) * self.micro * config.accumulate]
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        balance, distilled = [], {}
        self.optimizer.zero_grad(set_to_none=True)
        for index in range(config.accumulate):
            part = slice(index * self.micro, (index + 1) * self.micro)
            x, y = inputs[part].to(self.device), targets[part].to(self.device)
            documents = config.task.documents(x)  # packed documents, each computed as if alone
            with self.dist.no_sync(self.wrapped, last=index == config.accumulate - 1), self.autocast(), \
                    self._dropout_draws(step, index):
                summed = self.loss_fn(self.wrapped, x, y, documents)
                if self.teacher is not None:  # (objective, its terms)
                    summed, terms = summed
                    for name, term in terms.items():
                        distilled[name] = distilled.get(name, 0.0) + float(term)
                loss = summed * (self.dist.world_size / max(answers, 1))
                regularizer = _whole(self.model.regularization_loss())
                loss = loss + regularizer / config.accumulate
                aux = self.model.moe_aux_loss()
                if aux is not None:
                    balance.append(float(aux.detach()))
                    if config.moe_aux_loss:
                        loss = loss + config.moe_aux_loss * aux / config.accumulate
            loss.backward()
            total += summed.detach().double()
        total = self.dist.all_reduce_sum(total)
        grad_norm = _clip(self.model, config.grad_clip, self.dist.sharded)
        loss = float(total) / max(answers, 1)
        extra = {"moe_aux_loss": sum(balance) / len(balance)} if balance else {}
        # each process sums its own micro-batches: the global mean is their all-reduced sum over the answers
        extra.update({f"{self.term_prefix}{name}": float(self.dist.all_reduce_sum(torch.tensor(value, dtype=torch.float64,
                                                                                      device=self.device)))
                      / max(answers, 1) for name, value in distilled.items()})
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return loss, grad_norm, extra  # not applied: the weights stay those of the last finite step
        self.optimizer.step()
        redraw_random_features(self.model, step + 1)  # Performer `redraw: interval`, reproducibly from the step
        return loss, grad_norm, extra

    @torch.no_grad()
    def _evaluate(self, step: int) -> dict:
        """Loss, accuracy on answer positions and perplexity on the fixed test set; distilling, also the
        objective trained (:func:`~attnspec.training.distill.distill_loss` per answer position), the teacher's
        perplexity and accuracy, the KL from teacher to student at temperature 1 and how often their top
        tokens agree, all on the same held-out answers."""
        self.model.eval()
        loss_sum, correct, count = 0.0, 0, 0
        held_out = {"objective": 0.0, "teacher_loss": 0.0, "teacher_correct": 0, "kl": 0.0, "agree": 0}
        size = max(self.micro, 1)
        for start in range(0, len(self.test_inputs), size):
            x = self.test_inputs[start:start + size].to(self.device)
            y = self.test_targets[start:start + size].to(self.device)
            documents = self.config.task.documents(x)
            with self.autocast():
                logits = self.model(x, documents=documents)
            mask = y != IGNORE
            loss_sum += float(F.cross_entropy(logits[mask].float(), y[mask], reduction="sum"))
            correct += int((logits.argmax(-1)[mask] == y[mask]).sum())
            count += int(mask.sum())
            if self.teacher is not None:
                with self.autocast():
                    objective = float(self.loss_fn(self.model, x, y, documents)[0])
                    theirs = self.teacher(x, documents=documents)
                ours, theirs = logits[mask].float(), theirs[mask].float()
                held_out["objective"] += objective
                held_out["teacher_loss"] += float(F.cross_entropy(theirs, y[mask], reduction="sum"))
                held_out["teacher_correct"] += int((theirs.argmax(-1) == y[mask]).sum())
                held_out["kl"] += float(F.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True,
                                                 reduction="sum"))
                held_out["agree"] += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        self.model.train()
        loss = loss_sum / max(count, 1)
        if not math.isfinite(loss):
            self._diverge(step, {"test loss": loss}, None)
        metrics = {"loss": loss, "accuracy": correct / max(count, 1), "perplexity": math.exp(min(loss, 700))}
        if self.teacher is not None:
            n = max(count, 1)
            metrics.update(objective=held_out["objective"] / n,
                           teacher_perplexity=math.exp(min(held_out["teacher_loss"] / n, 700)),
                           teacher_accuracy=held_out["teacher_correct"] / n, kl_to_teacher=held_out["kl"] / n,
                           top1_agreement=held_out["agree"] / n)
        if self.chance is not None:  # beside the accuracy, so 0.126 at 8 pairs does not read as progress
            metrics.update(chance=self.chance, learned=learned(metrics["accuracy"], self.chance))
        record = {"step": step, "split": "test", **metrics}
        self.history.append(record)
        if self.writes:
            rundir.append_metrics(self.directory, record)
            self._scalars("test", record)
        self.on_progress({"event": "eval", **record})
        return metrics

    def _scalars(self, split: str, record: dict) -> None:
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, float):
                    self.tensorboard.add_scalar(f"{split}/{key}", value, record["step"])
            self.tensorboard.flush()

    def _calibration(self, spec, config: TrainConfig, world: int, resumed: bool):
        """What the plan chooses modes by: the cost model alone (``planning: model``, the default: the
        same modes on every machine), or this machine's measurements (``planning: measured``). A resumed
        run keeps its recorded modes, so it measures nothing."""
        from attnspec.compiler.calibration import Calibration
        from attnspec.compiler.device import device_calibration

        if config.planning == "model" or resumed:
            return Calibration.empty()
        calibration = device_calibration(self.device)  # a GPU plans by the cost model (CPU measurements do not apply)
        # The calibration measures eager CPU steps; ranks of a distributed run plan from the cache
        # alone, so that they do not measure at once on shared cores and plan alike.
        if self.device.type == "cpu" and not self.compiled and world == 1:
            from attnspec.compiler.calibrate import calibrate_spec

            calibration = calibrate_spec(spec, regime="training", batch=self.micro, length=config.task.seq_len)
        return calibration

    def _reached(self, metrics: dict) -> bool:
        target = self.config.target
        if target is None:
            return False
        value = metrics[self.config.task.metric]
        return value >= target if self.config.task.metric == "accuracy" else value <= target

    # ------------------------------------------------------------------ the run directory
    def _write_run_files(self, status: str, step: int = 0, metrics: dict | None = None,
                         diverged: dict | None = None) -> None:
        from attnspec.spec import spec_to_data, to_yaml

        config_data = self.config.model_dump(by_alias=True)
        record = {"format": rundir.FORMAT, "attnspec_version": VERSION, "torch_version": torch.__version__,
                  "status": status, "step": step, "world_size": self.dist.world_size, "device": str(self.device),
                  "compiled": self.compiled, "spec": spec_to_data(self.spec, minimal=False), "config": config_data,
                  "plan": self.plan.to_json(), "groups": [group.to_json() for group in self.groups],
                  "frozen": sorted(self.frozen)}
        if self.adapted:
            record["lora"] = {"adapted": self.adapted, "parameters": lora.adapter_parameters(self.model)}
        if self.transferred:
            record["transfer"] = {"blocks": self.transferred}
        if self.config.stages is not None:
            record["stage"] = self.stage.index
            record["stages"] = [{**plan.to_json(), "metrics": self.stage_metrics.get(plan.index)}
                                for plan in self.stages]
        if self.data_identity is not None:
            record["data"] = self.data_identity
        if self.weights_fit is not None:
            record["init_weights"] = self.weights_fit.to_json()
        if metrics:
            record["metrics"] = metrics
        if diverged:
            record["diverged"] = diverged
        rundir.write_atomic(self.directory / rundir.RUN_FILE, json.dumps(record, indent=2) + "\n")
        if status == "running" and step == 0:
            rundir.write_atomic(self.directory / "spec.yaml", to_yaml(self.spec, minimal=False,
                                                                      header=f"resolved spec of run {self.directory.name}"))
            import yaml

            rundir.write_atomic(self.directory / "config.yaml", yaml.safe_dump(config_data, sort_keys=False))

    def _checkpoint(self, step: int) -> None:
        if self.dist.sharded and self.directory is not None:  # every process writes its shard: nothing is gathered
            from attnspec.training import distributed

            failure = None
            if self.writes:
                try:
                    rundir.checkpoint_scratch(self.directory, step)
                except RunError as error:
                    failure = error
            if not self.dist.all_agree(failure is None):
                raise failure or RunError(f"{self.directory}: the checkpoint of step {step} could not be started "
                                          "(rank 0 says why)")
            distributed.save_shards(rundir.scratch_folder(self.directory, step), self.model, self.optimizer)
            if self.writes:
                rundir.publish_checkpoint(self.directory, step, rundir.scratch_folder(self.directory, step),
                                          {"shards": self.dist.world_size})
        elif self.writes:  # adapted: the merged model, and each adapted map's own weight and adapter beside it
            state, adapters = lora.split_state(self.model) if self.adapted else (self.model.state_dict(), None)
            whole = lambda tensors: {name: t.detach().cpu().contiguous() for name, t in tensors.items()}  # noqa: E731
            rundir.save_checkpoint(self.directory, step, whole(state), rundir.optimizer_tensors(self.optimizer, self.names),
                                   {}, adapters=None if adapters is None else whole(adapters))
        self.fresh, self.checkpointed = False, step
        self.dist.barrier()

    def _diverge(self, step: int, values: dict[str, float], lr: float | None) -> None:
        """Record the run as diverged at ``step`` (``values``: the non-finite quantities) and raise."""
        shown = ", ".join(f"{name} {value:.4g}" for name, value in values.items())
        reason = f"{shown}" + (f" at learning rate {lr:.3g}" if lr is not None else "")
        record = {"step": step, "split": "train", "diverged": True,
                  **{name.replace(" ", "_"): value if math.isfinite(value) else str(value) for name, value in values.items()}}
        self.history.append(record)
        self.on_progress({"event": "diverged", "step": step, "steps": self.config.steps, "reason": reason})
        if self.writes:
            rundir.append_metrics(self.directory, record)
        self._finish("diverged", step, {}, diverged={"step": step, "reason": reason})
        where = f"; recorded in {self.directory}/run.json (status diverged)" if self.writes else ""
        raise TrainingDiverged(f"training diverged at step {step}: {reason}{where}. The weights were not updated "
                               "with it; lower the learning rate or the weight decay, or clip gradients harder (a "
                               "smaller grad_clip)", step)

    def _finish(self, status: str, step: int, metrics: dict, diverged: dict | None = None) -> None:
        if status == "done":
            self.stage_metrics[self.stage.index] = metrics
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.writes:
            self._write_run_files(status, step, metrics, diverged)
            if status == "done":
                trained = {"planning": self.config.planning, "modes": self.plan.full_modes,
                           "backends": self.plan.backends}
                rundir.write_atomic(self.directory / "result.json",
                                    json.dumps({"step": step, **metrics, "plan": trained}, indent=2))

    def _resume_point(self) -> tuple[int, Path]:
        """The step a resumed run continues from and its checkpoint's folder, checked: a run that did not diverge
        and holds a checkpoint; the stages' results so far."""
        from attnspec.io import latest_checkpoint

        record = rundir.read_run(self.directory)
        if record["status"] == "diverged":
            raise rundir.RunError(f"{self.directory}: this run diverged (see run.json); resuming would diverge again. "
                                  "Start a new run with a lower learning rate")
        if not rundir.has_checkpoint(self.directory):
            raise rundir.RunError(f"{self.directory}: holds no checkpoint to resume from (the run was stopped before "
                                  "its first, e.g. killed); remove the directory and run the same command without "
                                  "--resume to start again")
        self.stage_metrics = {entry["index"]: entry["metrics"] for entry in record.get("stages") or []
                              if isinstance(entry, dict) and entry.get("metrics") and isinstance(entry.get("index"), int)}
        step, where, _ = latest_checkpoint(self.directory, self.config.steps)
        return step, where

    def _resume(self, step: int, where: Path) -> None:
        """Continue at ``step`` from the checkpoint in ``where``, the stage holding it set up already: its weights
        (mid-stage with adapters, the adapted maps' own and the adapters from their file; at a stage's first step,
        the merged weights the stage before left, the fresh adapters kept) and, mid-stage, AdamW's moments."""
        from attnspec.compiler.load import load_weights
        from attnspec.io import checkpoint_tensors

        recorded = rundir.read_run(self.directory).get("data")
        if recorded != self.data_identity:
            raise rundir.RunError(f"{self.directory}: this run trained on other data than the task gives now (run.json "
                                  f"records {shorten(recorded, 200)}, the task gives {shorten(self.data_identity, 200)}: "
                                  "another tokenizer or a changed corpus); resume with the data it trained on, or "
                                  "start a new run")
        if self.dist.sharded:
            self._resume_sharded(step, where)
        else:
            within = step > self.stage.start
            weights = checkpoint_tensors(where, "model")
            if self.adapted and within:  # the adapted maps' own weights and adapters, beside the merged model
                if not (where / rundir.ADAPTERS_FILE).is_file():
                    raise rundir.RunError(f"{where}: holds no {rundir.ADAPTERS_FILE}, so it was not trained with these "
                                          "adapters (`lora`); resume with the run's own configuration")
                adapters = lora.checked_adapters(self.model, weights, checkpoint_tensors(where, "adapters"),
                                                 where / rundir.ADAPTERS_FILE)
                weights = lora.joined_state(weights, adapters)
            elif self.adapted:  # the stage's first step: its fresh adapters on the merged weights
                weights = lora.joined_state(weights, {name: t for name, t in self.model.state_dict().items()
                                                      if f".{lora.ADAPTER}." in name})
            load_weights(self.model, weights)  # checked against the spec's model
            if within:
                rundir.restore_optimizer(self.optimizer, self.names, checkpoint_tensors(where, "optimizer"))
        self.start = self.step = self.checkpointed = step
        if self.writes:
            rundir.truncate_metrics(self.directory, step)
            self._write_run_files("running", step)

    def _resume_sharded(self, step: int, where: Path) -> None:
        """Processes sharing the model (FSDP) resume at ``step``: each reads its own shard's pieces, or whole
        tensors checked in an unsharded twin, each keeping its shard."""
        from attnspec.compiler.load import load_weights
        from attnspec.io import checkpoint_tensors
        from attnspec.nn.model import build_model_from_spec
        from attnspec.training import distributed

        if rundir.is_sharded(where):
            distributed.load_shards(where, self.model, self.optimizer)
            return
        twin = build_model_from_spec(self.model.spec, empty=True)
        load_weights(twin, checkpoint_tensors(where, "model"))
        moments = rundir.checked_moments(checkpoint_tensors(where, "optimizer"),
                                         {name: tuple(p.shape) for name, p in self.model.named_parameters()})
        distributed.load_full_state(self.model, self.optimizer, twin.state_dict(), moments)



@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
    """Draw from torch's generators (the CPU's, and ``device``'s where it is CUDA) seeded with ``seed``, restoring
    their states after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed % (1 << 63))
        yield


def _event_writer_class():
    """TensorBoard's SummaryWriter (the `tensorboard` extra), or an error saying how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise AttnSpecError("--tensorboard needs the tensorboard package: pip install 'attnspec[tensorboard]'") from None
    return SummaryWriter


def _load_init_weights(model: nn.Module, source: str | None, renames: dict[str, str]):
    """The train config's ``init_weights`` loaded into ``model`` where they fit (name and shape, after
    ``renames``), as a :class:`~attnspec.compiler.load.WeightsFit`; None without them.

    Raises:
        SpecError: located at ``init_weights``: no such file or directory, or not weights.
    """
    if source is None:
        return None
    from attnspec.compiler.load import load_weights
    from attnspec.io import checkpoint_tensors, latest_checkpoint

    path = Path(source)
    try:
        if path.is_dir() and (path / rundir.RUN_FILE).is_file():
            weights = checkpoint_tensors(latest_checkpoint(path)[1], "model")  # one file or each process's shard
        else:
            weights = path / "model.safetensors" if path.is_dir() else path
            if not weights.is_file():
                raise FileNotFoundError(str(weights))
        return load_weights(model, weights, "give a safetensors file or a build or run directory", strict=False,
                            renames=renames)
    except (AttnSpecError, OSError) as error:
        raise SpecError(Problem(f"{source}: not weights to start from ({error})", path="init_weights",
                                source="training configuration")) from None


def _micro_loss(model: nn.Module, inputs: Tensor, targets: Tensor, documents=None) -> Tensor:
    """Summed cross-entropy over the answer positions of one micro-batch (a scalar); ``documents``: the
    packed documents of ``inputs`` (None: one sequence per row)."""
    logits = model(inputs) if documents is None else model(inputs, documents=documents)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum")


def _clip(model: nn.Module, max_norm: float, sharded: bool = False) -> float:
    """Clip the gradients' global norm to ``max_norm`` (0: no clipping); returns the norm before clipping
    (of the whole gradients where they are sharded: torch's norms of DTensors reduce over the shards)."""
    parameters = [p for p in model.parameters() if p.grad is not None and p.requires_grad]
    if not parameters:
        return 0.0
    if max_norm > 0:
        return float(_whole(torch.nn.utils.clip_grad_norm_(parameters, max_norm)))
    if sharded:
        return float(_whole(torch.nn.utils.get_total_norm([p.grad for p in parameters])))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters])))


def _whole(value: Tensor) -> Tensor:
    """A DTensor (a sharded model's norm or regulariser) as the whole tensor it stands for; a tensor as it is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _uses_bfloat16_autocast(precision: str, device: torch.device, dtype: str) -> bool:
    """bf16 autocast when asked, for a bfloat16 spec, or for ``auto`` on a CUDA device with bf16 and a
    float32 model."""
    return precision == "bfloat16" or dtype == "bfloat16" or (
        precision == "auto" and device.type == "cuda" and dtype == "float32" and torch.cuda.is_bf16_supported())


def _autocast(bfloat16: bool, device: torch.device):
    """A context factory: bf16 autocast on ``device`` when ``bfloat16``, else nothing."""
    import contextlib

    if not bfloat16:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
