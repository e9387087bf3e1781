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


def load_subject(source: str | Path, overrides: Iterable[str] = ()) -> Subject:
    """A spec file, or a run directory written by ``attnspec train`` (then ``overrides`` must be empty).

    Raises:
        SpecError: the spec is invalid. RunError: the run directory cannot be read.
    """
    from safetensors.torch import load_file

    from attnspec.compiler.lower import as_spec
    from attnspec.errors import AttnSpecError
    from attnspec.spec.validate import validate_data
    from attnspec.training import rundir
    from attnspec.training.config import load_config

    path = Path(source)
    if not (path.is_dir() and (path / rundir.RUN_FILE).is_file()):
        return Subject(as_spec(path, tuple(overrides)))
    if tuple(overrides):
        raise AttnSpecError("--set changes a spec; a run is diagnosed as it was trained")
    record = rundir.read_run(path)
    config = load_config(record["config"])
    _, weights_file, _, _ = rundir.load_checkpoint(path)
    try:
        weights = load_file(str(weights_file))
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a bad file
        raise rundir.RunError(f"{weights_file}: not a valid safetensors file ({error})") from None
    return Subject(validate_data(record["spec"]), weights, config.task, config.seed)
