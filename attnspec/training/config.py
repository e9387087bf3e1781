"""The training configuration: a strict model (located errors, like specs) of what a run does.

A configuration comes from a YAML file (``attnspec train --config FILE``), from flags, or both:
flags override the file (``--task KIND``, ``--task-set key=value``, ``--steps``, ...). The run
directory records the fully resolved configuration (every default filled) beside the resolved
spec, so ``attnspec train SPEC --config RUN/config.yaml`` repeats a run exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal

from pydantic import Field, field_validator, model_validator

from attnspec.errors import Problem, SpecError
from attnspec.spec import limits
from attnspec.spec.compose import apply_override
from attnspec.spec.ir import Count, Node, Seed
from attnspec.spec.components import slot_field
from attnspec.spec.source import SourceMap
from attnspec.spec.validate import validate_model
from attnspec.training.tasks import TaskUnion

MAX_BATCH = 1 << 20
MAX_TEST_EXAMPLES = 1 << 20
COMPILE_AUTO_REASON = (
    "Training steps run eager on the CPU (train config `compile: auto`) and compiled on CUDA: on the 2-core CPU, "
    "compiled steps of the shipped linear specs measured 0.96-1.27x eager at L = 512, because matrix products, "
    "which compiling does not speed up, are 34-75% of a step, and compiling took 10-36 s (docs/benchmarks.md). "
    "`--compile` (config `compile: on`) compiles anyway.")
"""Why `compile: auto` trains eagerly on the CPU (``explain`` says so under its plan)."""


class GroupOverride(Node):
    """Override a component's optimiser facts for this run."""

    weight_decay: bool | None = None
    """Apply the run's weight decay to these parameters (None: the component's fact decides)."""
    lr_multiplier: Annotated[float, Field(gt=0, le=100)] | None = None
    """Scale of the learning rate of these parameters (None: the component's fact)."""


class Distill(Node):
    """Train against a teacher's outputs (knowledge distillation: the start of turning a pretrained
    transformer into a linear or hybrid model, after initialising the new mixers from the attention they
    replace, as LoLCATs and "Mamba in the Llama" do)."""

    teacher: Annotated[str, Field(min_length=1, max_length=4096)]
    """A build or training run directory (a run's latest checkpoint; an imported transformers model is a build:
    `attnspec import-hf`'s); it must read the same tokens (vocabulary) through an LM head, and take the task's
    length."""
    temperature: Annotated[float, Field(gt=0, le=100)] = 1.0
    """T: both distributions are softened by T and the KL term multiplied by T² (Hinton et al. 2015)."""
    weight: Annotated[float, Field(ge=0, le=1)] = 1.0
    """α: the loss is (1 - α) cross-entropy + α T² KL(teacher ‖ student), over the answer positions."""
    hidden: Annotated[float, Field(ge=0, le=1e4)] = 0.0
    """Weight of per-layer output matching: the mean squared difference of each block's output between
    student and teacher, summed over the blocks (same block count and width), added to the loss."""


class Transfer(Node):
    """Attention transfer (LoLCATs' first stage): each chosen block's mixer is trained to compute what the teacher's
    mixer of that block computes, on the teacher's own input to it (its norm of the block's input): every block at
    once and independently, from one teacher pass; the loss is the sum over the blocks of the mean squared
    difference of the two mixers' outputs. Freeze what else should not move (`freeze`: the objective trains the
    chosen mixers alone, but an unfrozen parameter elsewhere is still in the optimiser, its weight decay too)."""

    teacher: Annotated[str, Field(min_length=1, max_length=4096)]
    """A build or run directory (an imported transformers model is a build: `attnspec import-hf`'s); its blocks must
    line up with the student's (as many, as wide), and it must read the student's tokens."""
    blocks: Annotated[list[Annotated[int, Field(ge=0, le=limits.MAX_BLOCKS)]], Field(min_length=1,
                                                                                     max_length=limits.MAX_BLOCKS)] | None = None
    """The blocks to transfer, by index; unset: every block whose mixer differs from the teacher's."""


class Lora(Node):
    """Low-rank adapters (LoRA, Hu et al. 2021) on chosen linear maps: each adapted map W x becomes
    W x + (alpha / rank) B A dropout(x), W frozen, A (rank, in) drawn as a linear map's weight and B (out, rank) zero,
    so training starts from the model as it is. Everything but the adapters (and `train`) is frozen. A run's checkpoints hold the merged weights W + (alpha / rank) B A
    (a plain model of the spec: eval, export and `init_weights` read it as any run), with each adapted map's own
    W and its A and B beside them in `adapters.safetensors` to resume from."""

    targets: Annotated[list[Annotated[str, Field(min_length=1, max_length=400)]], Field(min_length=1, max_length=256)]
    """The linear maps to adapt, by name (a weight's name without `.weight`, as `explain` and a build's manifest
    name it: `blocks.3.mixer.q_proj`), each a glob (`blocks.*.mixer.*_proj`) that must name at least one."""
    rank: Count(4096) = 8
    """r, the adapters' inner width."""
    alpha: Annotated[float, Field(gt=0, le=1e4)] | None = None
    """The adapters' output is scaled by alpha / rank; unset: alpha = rank (a scale of 1)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on an adapter's input while training (the map's own path sees x as it is)."""
    train: Annotated[list[Annotated[str, Field(min_length=1, max_length=400)]], Field(max_length=256)] = []
    """Parameters trained in full beside the adapters, by glob (`blocks.3.mixer.*`: a swapped-in mixer; peft's
    `modules_to_save`). A LoRA stage trains its adapters and these alone: every other parameter is frozen (as
    peft freezes the base model), so the stage is low-rank unless this list says otherwise."""

    def scale_alpha(self) -> float:
        return self.alpha if self.alpha is not None else float(self.rank)


class Stage(Node):
    """One stage of a staged run (`stages`): its objective, steps, learning rate, frozen parameters and adapters.
    Each stage starts a fresh AdamW and its own warm-up and cosine decay; a stage with adapters ends with them
    merged into the weights, which the next stage starts from."""

    objective: Literal["lm", "distill", "transfer"]
    """`lm`: the task's cross-entropy; `distill`: the run's `distill` (which must be set); `transfer`: the run's
    `transfer` (which must be set)."""
    steps: Count(limits.MAX_STEPS)
    """Optimiser steps of this stage (the run's `steps` are the stages' sum)."""
    lr: Annotated[float, Field(gt=0, le=10)] | None = None
    """Peak learning rate of this stage; unset: the run's `lr`."""
    warmup_steps: Annotated[int, Field(ge=0, le=limits.MAX_STEPS)] | None = None
    """Linear warm-up steps of this stage; default 10% of its steps."""
    freeze: Annotated[list[Annotated[str, Field(min_length=1, max_length=400)]], Field(max_length=256)] | None = None
    """Parameters this stage does not train (as the run's `freeze`); unset: the run's `freeze`."""
    lora: Lora | None = None
    """Low-rank adapters of this stage (as the run's `lora`, which a staged run leaves unset); unset: none."""


class TrainConfig(Node):
    """What a training run does: the task, the optimiser and schedule, evaluation and checkpoints."""

    task: TaskUnion
    """The task and its parameters (`kind: mqar`, `seq_len: 64`, ...)."""
    steps: Count(limits.MAX_STEPS) = 1000
    """Optimiser steps."""
    batch_size: Count(MAX_BATCH) = 32
    """Global batch: examples per optimiser step, over all processes and accumulation steps."""
    accumulate: Count(1024) = 1
    """Micro-batches per step (gradient accumulation); must divide the per-process batch."""
    lr: Annotated[float, Field(gt=0, le=10)] = 1e-3
    """Peak learning rate."""
    warmup_steps: Annotated[int, Field(ge=0, le=limits.MAX_STEPS)] | None = None
    """Linear warm-up steps; default 10% of `steps`."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The cosine decay ends at min_lr_ratio * lr."""
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.1
    """AdamW weight decay of the parameters that take it (see `groups`)."""
    betas: Annotated[list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.9, 0.98])
    """AdamW (beta1, beta2); GateLoop and many linear-attention papers use (0.9, 0.98)."""
    grad_clip: Annotated[float, Field(ge=0, le=1e6)] = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    moe_aux_loss: Annotated[float, Field(ge=0, le=100)] = 0.0
    """Weight of the mixture-of-experts load-balancing loss in the training loss (Switch Transformer's,
    mean over the MoE layers; 0.001-0.01 is usual); a model with MoE MLPs logs it at any weight."""
    init_weights: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """Start from these weights: a safetensors file, or a build or run directory (a run's latest
    checkpoint). Tensors that fit the spec's model by name and shape are loaded, the rest keep the spec's
    `init` (an edited import: the swapped layer starts fresh, the rest pretrained); run.json lists them."""
    init_weights_map: dict[Annotated[str, Field(min_length=1, max_length=400)],
                           Annotated[str, Field(max_length=400)]] = Field(default_factory=dict, max_length=4096)
    """Renames of `init_weights`' tensors before they are fitted: a name prefix of the file's -> the
    model's (`{"blocks.3.mixer.o_proj.": "blocks.3.mixer.out_proj."}`), the longest matching prefix
    first; where a replaced layer's tensors and its replacement's differ in name."""
    distill: Distill | None = None
    """Distil a teacher model's logits (and, with `hidden`, its blocks' outputs) into this one; eager."""
    transfer: Transfer | None = None
    """Train the new mixers to compute the teacher's mixers' outputs on the teacher's inputs (`Transfer`), in place
    of the task's cross-entropy; not with `distill` (one objective a run)."""
    groups: dict[Annotated[str, Field(max_length=100)], GroupOverride] = Field(default_factory=dict)
    """Per-slot (`transition`) or per-kind (`transition.data`) overrides of the optimiser facts."""
    freeze: Annotated[list[Annotated[str, Field(min_length=1, max_length=400)]], Field(max_length=256)] = Field(
        default_factory=list)
    """Parameters this run does not train, by name as a build's manifest and a run's checkpoints name them
    (`blocks.3.mixer.q_proj.weight`), each pattern a glob (`*` any characters: `embed.*`, `blocks.*.mlp.*`). Each
    pattern must name at least one parameter, and one parameter at least must stay trained; the count trained is
    printed at the start and recorded in run.json. Empty: every parameter trains."""
    lora: Lora | None = None
    """Low-rank adapters on chosen linear maps (`Lora`), their maps frozen; unset: none."""
    stages: Annotated[list[Stage], Field(min_length=1, max_length=16)] | None = None
    """A run in stages, one after the other (`Stage`: objective, steps, lr, freeze, lora each): attention transfer
    then a low-rank fine-tune, say. `steps` becomes their sum; `distill` and `transfer` hold the settings of the
    stages with those objectives. Resumable at any step; run.json records each stage and its results."""
    eval_every: Annotated[int, Field(ge=0, le=limits.MAX_STEPS)] = 100
    """Evaluate on the test set every N steps (0: only at the end)."""
    test_examples: Count(MAX_TEST_EXAMPLES) = 512
    """Size of the fixed test set."""
    target: float | None = None
    """Stop early when the task's metric reaches this (accuracy >= target, perplexity <= target)."""
    checkpoint_every: Annotated[int, Field(ge=0, le=limits.MAX_STEPS)] = 0
    """Checkpoint every N steps (0: at each evaluation); always at the end."""
    seed: Seed = 0
    """Seed of the data streams (the model's initialisation is the spec's `seed`)."""
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    """`bfloat16`: autocast matmuls to bf16 (CUDA, or CPUs with bf16); `auto`: bf16 on CUDA when
    supported, else the spec's dtype."""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile the training step (fullgraph); `auto` compiles on CUDA and not on the CPU, where
    compiled steps of the shipped linear specs measured 0.96-1.27x eager at L = 512 (matrix products,
    which compiling does not speed up, are 34-75% of a step) and compiling took 10-36 s
    (benchmarks/train.py, table 3)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """How the processes of a distributed run (`--nproc`, `torchrun`) share the model. `ddp`: every
    process holds the whole model, its gradients and AdamW's moments (DistributedDataParallel). `fsdp`:
    each holds a 1/N shard of them (FSDP2's `fully_shard`, one group per block, all-gathered for its
    forward and backward and freed after; blocks that call a shared block, the shared blocks, the
    embeddings, the final norm and the head are the root's group, so tied weights are one tensor);
    with `precision: bfloat16` the gathered weights are bfloat16 (float32 in a block holding parameters
    its family keeps in float32) and the gradients are reduced in float32 onto float32 master weights;
    checkpoints are each process's shard. One process trains the same either way."""
    activation_checkpointing: Literal["none", "blocks"] | Count(limits.MAX_BLOCKS) = "none"
    """Recompute blocks' activations in the backward pass instead of keeping them: `blocks` every
    block, N every N-th (blocks 0, N, 2N, ...), `none` none. Memory for compute: the losses and
    gradients are the same."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto`: CUDA when available (the local rank's GPU under torchrun), else the CPU."""
    planning: Literal["model", "measured"] = "model"
    """How each `mode: auto` mixer's mode is chosen. `model`: by the cost model from the spec and the
    run's shapes alone, so the same run trains the same computation, bit for bit, on every machine;
    `measured`: by timing every mode on this machine first (faster where the cost model misranks,
    but a different mode changes float rounding, and so the numbers, from machine to machine). The
    modes chosen are recorded in run.json and result.json, and a resumed run keeps them."""
    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard (needs the `tensorboard` package)."""
    log_every: Count(limits.MAX_STEPS) = 1
    """Write the training loss to metrics.jsonl every N steps."""

    @field_validator("groups")
    @classmethod
    def _known_groups(cls, groups: dict) -> dict:
        """A group key names a component slot (``transition``) or slot and kind (``transition.data``)
        that models have: a misspelt key would silently change nothing."""
        from attnspec.errors import did_you_mean
        from attnspec.spec.components import SLOTS

        slots = {slot: kinds for slot, kinds in SLOTS.items() if slot != "task"}
        choices = [*slots, *(f"{slot}.{kind}" for slot, kinds in slots.items() for kind in kinds)]
        for key in groups:
            slot, _, kind = key.partition(".")
            if slot not in slots or (kind and kind not in slots[slot]):
                raise ValueError(f"unknown group {key!r}{did_you_mean(key, choices)}: a group is a component slot "
                                 f"({', '.join(slots)}) or slot.kind, such as transition.data")
        return groups

    @model_validator(mode="after")
    def _one_objective(self) -> "TrainConfig":
        if self.stages is None:
            if self.distill is not None and self.transfer is not None:
                raise ValueError("a run trains one objective: `distill` or `transfer`, not both (or give `stages`, "
                                 "each naming its objective)")
            return self
        for index, stage in enumerate(self.stages):
            if stage.objective in ("distill", "transfer") and getattr(self, stage.objective) is None:
                raise ValueError(f"stages[{index}] trains by {stage.objective}, and the run has no `{stage.objective}` "
                                 "settings: add them (its teacher)")
        if self.lora is not None:
            raise ValueError("a staged run's adapters are its stages' (`stages[i].lora`): move `lora` into the stage "
                             "that trains them")
        total = sum(stage.steps for stage in self.stages)
        if "steps" in self.model_fields_set and self.steps != total:
            raise ValueError(f"`steps` = {self.steps}, and the stages take {total}: a staged run's steps are its "
                             "stages' sum; leave `steps` out")
        if total > limits.MAX_STEPS:
            raise ValueError(f"the stages take {total:,} steps, more than {limits.MAX_STEPS:,} (attnspec's limit)")
        self.steps = total
        return self

    def stage_list(self) -> list["StagePlan"]:
        """The run's stages as planned (one, from the run's own fields, for a run without `stages`)."""
        given = self.stages or [Stage(objective="distill" if self.distill is not None else
                                      "transfer" if self.transfer is not None else "lm", steps=self.steps,
                                      lr=self.lr, warmup_steps=self.warmup(), freeze=self.freeze, lora=self.lora)]
        plans, start = [], 0
        for index, stage in enumerate(given):
            plans.append(StagePlan(index, stage.objective, start, start + stage.steps,
                                   stage.lr if stage.lr is not None else self.lr,
                                   stage.warmup_steps if stage.warmup_steps is not None else stage.steps // 10,
                                   stage.freeze if stage.freeze is not None else self.freeze, stage.lora))
            start += stage.steps
        return plans

    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else self.steps // 10


@dataclass(frozen=True)
class StagePlan:
    """A stage as the trainer runs it: steps [start, end) of the run, its objective, peak lr, warm-up, frozen
    patterns and adapters."""

    index: int
    objective: str
    start: int
    end: int
    lr: float
    warmup: int
    freeze: list[str]
    lora: Lora | None

    def to_json(self) -> dict:
        return {"index": self.index, "objective": self.objective, "start": self.start, "end": self.end, "lr": self.lr,
                "warmup": self.warmup, "freeze": list(self.freeze),
                "lora": None if self.lora is None else self.lora.model_dump()}


slot_field(TrainConfig, "task", "task")


def load_config(file: Path | str | dict | None = None, *, task: str | None = None, task_overrides: Iterable[str] = (),
                **flags: Any) -> TrainConfig:
    """The configuration from a YAML ``file`` (or data), then ``task`` (a kind), ``task_overrides``
    (``"key=value"``, as ``--task-set``) and ``flags`` (fields of :class:`TrainConfig`; None is unset).

    Raises:
        SpecError: located at the file's line and column, or at the flag that set the value.
    """
    from attnspec.spec.load import read_text_file
    from attnspec.spec.yaml_front import parse_yaml

    if file is None:
        data, smap = {}, SourceMap()
    elif isinstance(file, dict):
        data, smap = dict(file), SourceMap()
    else:
        data, smap = parse_yaml(read_text_file(Path(file)), str(file))
        if not isinstance(data, dict):
            raise SpecError(Problem("a training configuration must be a mapping", source=str(file)))
    if task is not None:
        current = data.get("task")
        current_kind = current.get("kind") if isinstance(current, dict) else current
        if current_kind != task:
            data = {**data, "task": {"kind": task}}
            smap.replace_subtree(("task",), SourceMap())
    for assignment in task_overrides:
        data = apply_override(data, smap, f"task.{assignment}", flag="--task-set")
    for name, value in flags.items():
        if value is not None:
            data = {**data, name: value}
    if "task" not in data:
        from attnspec.spec.components import SLOTS

        raise SpecError(Problem(f"no task: give --task KIND ({', '.join(SLOTS['task'])}) or `task:` in the "
                                "configuration file"))
    return validate_model(TrainConfig, data, smap, what="training configuration")
