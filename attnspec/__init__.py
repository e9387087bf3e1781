"""attnspec: a declarative model-composition DSL and compiler for sequence mixers.

Nothing heavy is imported here: the spec layer (pydantic, PyYAML, lark) and the model-building
API (torch) load on first use, so ``attnspec check`` never imports torch and ``import attnspec.ops``
never imports the spec front-ends.
"""

from __future__ import annotations

from typing import Any

from attnspec.errors import AttnSpecError, BuildError, ShapeError, SpecError
from attnspec.io import VERSION as __version__

__all__ = ["AttnSpecError", "SpecError", "ShapeError", "BuildError", "load_spec", "loads_spec",
           "build", "load", "save", "train", "ablate", "report", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("load_spec", "loads_spec"):
        from attnspec.spec import load

        return getattr(load, name)
    raise AttributeError(f"module 'attnspec' has no attribute {name!r}")


def build(spec_or_path: Any, *overrides: str, **kwargs: Any) -> Any:
    """Build an eager ``nn.Module`` from a spec (path, dict or Spec), returned in **eval mode** (call
    ``model.train()`` before training it yourself; :func:`attnspec.train` does); see
    :func:`attnspec.compiler.build_model`."""
    from attnspec.compiler.lower import build_model

    return build_model(spec_or_path, *overrides, **kwargs)


def load(directory: Any, device: Any = None, weights: Any = None, strict: bool = True) -> Any:
    """Load a build directory written by ``attnspec build`` onto ``device`` (default the CPU), with
    ``weights`` (a safetensors file) over its own, all of them fitting or, ``strict=False``, what fits;
    see :func:`attnspec.compiler.load.load_model`. A training run directory loads its latest checkpoint's
    model (:func:`attnspec.training.rundir.load_trained`; ``weights`` are a build's option)."""
    from pathlib import Path

    from attnspec.compiler.load import load_model
    from attnspec.io import RUN_FILE

    if (Path(directory) / RUN_FILE).is_file() and not (Path(directory) / "manifest.json").exists():
        from attnspec.compiler.device import resolve_device
        from attnspec.errors import AttnSpecError
        from attnspec.training.rundir import load_trained

        if weights is not None:
            raise AttnSpecError(f"{directory} is a training run: its own latest checkpoint is what loads; build it "
                                f"(`attnspec build {directory} -o DIR`) to load other weights over it")
        return load_trained(directory).to(resolve_device(device))
    return load_model(directory, device=device, weights=weights, strict=strict)


def save(model: Any, directory: Any, **kwargs: Any) -> Any:
    """Write a (trained) model as a build directory; see :func:`attnspec.compiler.build.save_model`."""
    from attnspec.compiler.build import save_model

    return save_model(model, directory, **kwargs)


def train(spec: Any, config: Any = None, **kwargs: Any) -> Any:
    """Train the model of a spec on a task; see :func:`attnspec.training.loop.train`."""
    from attnspec.training.loop import train as train_model

    return train_model(spec, config, **kwargs)


def ablate(sweep: Any, output: Any, **kwargs: Any) -> Any:
    """Run every run of a sweep file into a runs directory, then report; see
    :func:`attnspec.ablation.ablate.ablate`."""
    from attnspec.ablation.ablate import ablate as run_sweep

    return run_sweep(sweep, output, **kwargs)


def report(runs_directory: Any) -> Any:
    """Write the report of a runs directory (tables, CSV, plots, HTML); see
    :func:`attnspec.ablation.report.write_report`."""
    from attnspec.ablation.report import write_report

    return write_report(runs_directory)
