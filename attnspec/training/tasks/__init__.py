"""Training tasks: registered components (slot ``task``) with seeded generators and a metric.

A task is a strict pydantic model (its parameters, validated with located errors like a spec) that
produces batches: ``batch(split, step, size, seed)`` returns ``inputs`` (size, L) int64 and
``targets`` (size, L) int64, where ``IGNORE`` (-100) marks positions without an answer. A batch is
a pure function of (task, split, step, seed): the training split draws step ``s`` from the stream
seeded by (seed, "train", s), the test split from (seed, "test"), so the two never share a
generator seed, resuming at step ``s`` sees the same data, and data-parallel ranks slice one global
batch without overlap.

Synthetic tasks (Zoology's MQAR, GateLoop's Memory Horizon, selective copying, induction heads)
are generated; text tasks read the user's local files (a byte-level corpus, nanoGPT ``.bin`` token
files). Nothing is downloaded.

Modules: :mod:`.base` (the Task base class and the seeding), :mod:`.synthetic`, :mod:`.text`.
Plugins add tasks with ``@attnspec.spec.components.component("task")`` on a subclass of :class:`Task`.
"""

from __future__ import annotations

from attnspec.spec.components import declare
from attnspec.training.tasks.base import IGNORE, MAX_DATA_BYTES, Task, TaskError, generator
from attnspec.training.tasks.synthetic import InductionHeadsTask, MemoryHorizonTask, MqarTask, SelectiveCopyingTask
from attnspec.training.tasks.text import BytesTask, TokensTask

TaskUnion = declare("task", MqarTask, MemoryHorizonTask, SelectiveCopyingTask, InductionHeadsTask, BytesTask,
                    TokensTask, base=Task)

__all__ = ["IGNORE", "MAX_DATA_BYTES", "Task", "TaskError", "TaskUnion", "generator", "MqarTask", "MemoryHorizonTask",
           "SelectiveCopyingTask", "InductionHeadsTask", "BytesTask", "TokensTask"]
