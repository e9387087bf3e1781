"""Training: tasks, the training configuration, the loop, run directories and data parallelism.

``attnspec.training.train(spec, task="mqar", steps=..., output=RUN_DIR)`` (also ``attnspec.training(...)``)
returns a :class:`~attnspec.training.loop.Run`. Imported on first use: ``import attnspec`` stays light.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("train", "Run", "Trainer"):
        from attnspec.training import loop

        return getattr(loop, name)
    if name in ("TrainConfig", "load_config"):
        from attnspec.training import config

        return getattr(config, name)
    raise AttributeError(f"module 'attnspec.training' has no attribute {name!r}")
