"""What a diagnostic looks at: a spec (a model at initialisation) or a trained run (its spec, the
weights of its latest checkpoint and its task's test inputs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from torch import Tensor


@dataclass
class Subject:
    """A resolved spec, with trained weights and the task's test inputs when it is a run."""

    spec: Any
    weights: dict[str, Tensor] | None = None
    task: Any = None
    seed: int = 0

    @property
    def trained(self) -> bool:
        return self.weights is not None

    def task_inputs(self, samples: int) -> Tensor | None:
        """``samples`` test inputs of the run's task (None for a spec)."""
        if self.task is None:
            return None
        return self.task.batch("test", 0, samples, self.seed)[0]

    def inputs(self, samples: int, length: int | None = None, seed: int = 0) -> Tensor:
        """The task's test inputs for a run, else random inputs (see :func:`random_inputs`)."""
        found = self.task_inputs(samples)
        return found if found is not None else random_inputs(self.spec, samples, length, seed)

    def model(self, float64: bool = False) -> Any:
        """The model in eval mode, with the run's trained weights (checked tensor by tensor); in
        float64 (weights converted) when asked, for measurements below float32's resolution."""
        from attnspec.compiler.load import load_weights
        from attnspec.compiler.lower import as_spec
        from attnspec.nn.model import build_model_from_spec

        spec = as_spec(self.spec, ["dtype=float64"]) if float64 else self.spec
        model = build_model_from_spec(spec).eval()
        if self.weights is not None:
            weights = {name: tensor.double() if float64 and tensor.is_floating_point() else tensor
                       for name, tensor in self.weights.items()}
            load_weights(model, weights, fix="the run's checkpoint does not match its spec")
        return model


def random_inputs(spec: Any, samples: int, length: int | None = None, seed: int = 0) -> Tensor:
    """(samples, length) token ids uniform over the vocabulary, or (samples, length, dim) features
    N(0, 1) in float64; ``length`` defaults to ``max_len``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    length = length or spec.max_len
    if spec.input.kind == "tokens":
        return torch.randint(0, spec.input.vocab_size, (samples, length), generator=gen)
    return torch.randn(samples, length, spec.input.dim, generator=gen, dtype=torch.float64)


def load_subject(source: str | Path, overrides: Iterable[str] = ()) -> Subject:
    """A spec file, a run directory written by ``attnspec train`` or a build directory (an imported
    transformers model, say); for the directories ``overrides`` must be empty.

    Raises:
        SpecError: the spec is invalid. RunError: the run directory cannot be read.
    """
    from attnspec.compiler.lower import as_spec
    from attnspec.errors import AttnSpecError
    from attnspec.training import rundir

    path = Path(source)
    if not path.is_dir():
        return Subject(as_spec(path, tuple(overrides)))
    if tuple(overrides):
        raise AttnSpecError("--set changes a spec; a run or build directory is diagnosed as it is")
    if not (path / rundir.RUN_FILE).is_file():  # a build directory: its spec and weights, no task
        model = rundir.load_trained(path)
        return Subject(model.spec, {name: tensor.detach() for name, tensor in model.state_dict().items()})
    spec, config = rundir.recorded(path, rundir.read_run(path))
    _, weights, _, _ = rundir.load_checkpoint(path, max_step=config.steps)
    return Subject(spec, weights, config.task, config.seed)


def forward_with_hooks(model: Any, inputs: Tensor, handles: list) -> None:
    """Run ``model`` on ``inputs`` without gradients, then remove the hooks in ``handles`` (always)."""
    import torch

    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()


def load_subjects(sources: Iterable[str | Path]) -> list[tuple[str, Subject]]:
    """Labelled subjects: a runs directory of ``attnspec ablate`` gives each finished run labelled by
    its variant (and task point when the sweep has several); a run or build directory is labelled by
    its name, a spec file by its spec's name.

    Raises:
        RunError: a directory is neither a run nor a runs directory, or cannot be read.
        SpecError: a spec file is invalid.
    """
    from attnspec.ablation import runsdir  # reads a sweep's runs directory: allowed in tests/test_boundaries.py
    from attnspec.ablation.runsdir import params_text
    from attnspec.training import rundir

    found = []
    for source in sources:
        path = Path(source)
        if (path / runsdir.SWEEP_FILE).is_file():
            runs = runsdir.read(path)["runs"]
            points = {(run["task"], str(sorted(run["task_params"].items()))) for run in runs}
            for run in runs:
                if runsdir.state(path, run["key"]) != "done":
                    continue
                label = run["variant"]
                if len(points) > 1:
                    label += f" · {run['task']} {params_text(run['task_params'])}".rstrip()
                found.append((label, load_subject(runsdir.run_directory(path, run["key"]))))
        elif (path / rundir.RUN_FILE).is_file() or (path / "manifest.json").is_file():  # a run or a build
            found.append((path.name, load_subject(path)))
        elif path.is_file():
            subject = load_subject(path)
            found.append((subject.spec.name, subject))
        else:
            raise rundir.RunError(f"{path}: neither a spec file, a run directory (attnspec train), a runs "
                                  "directory (attnspec ablate) nor a build directory")
    if not found:
        raise rundir.RunError("no finished runs in " + ", ".join(str(s) for s in sources))
    return found


def block_inputs(model: Any, inputs: Tensor) -> list[Tensor]:
    """What every block receives on ``inputs`` (one forward pass without gradients): [(B, L, d)]."""
    found: list[Tensor] = []
    handles = [block.register_forward_pre_hook(lambda module, args: found.append(args[0].detach()))
               for block in model.blocks]
    forward_with_hooks(model, inputs, handles)
    return found


def mixer_inputs(model: Any, inputs: Tensor) -> list[Tensor]:
    """What every block's mixer receives: the block input, normalised first in a pre-norm block."""
    return [block.norm1(x) if block.pre else x for block, x in zip(model.blocks, block_inputs(model, inputs))]
