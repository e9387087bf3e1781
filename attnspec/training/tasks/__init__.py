"""Training tasks: registered components (slot ``task``) with seeded generators and a metric.

A task is a strict pydantic model (its parameters, validated with located errors like a spec) that
produces batches: ``batch(split, step, size, seed)`` (which calls a task's ``sample``) returns ``inputs`` (size, L) int64 and
``targets`` (size, L) int64, where ``IGNORE`` (-100) marks positions without an answer. A batch is
a pure function of (task, split, step, seed): the training split draws step ``s`` from the stream
seeded by (seed, "train", s), the test split from (seed, "test"), so the two never share a
generator seed, resuming at step ``s`` sees the same data, and data-parallel ranks slice one global
batch without overlap.

Synthetic tasks are generated: Zoology's MQAR, GateLoop's Memory Horizon, selective copying and
induction heads (:mod:`.synthetic`), MAD-Lab's recall and memorisation tasks (:mod:`.mad`), LRA's
ListOps and the rank-collapse paper's sorting and convex hull (:mod:`.structured`). Text tasks (:mod:`.text`) read
local files: a corpus through a local tokenizer (:mod:`.corpus` caches its tokens; documents packed with
state resets or padded), the user's text as bytes, nanoGPT ``.bin`` token files, or the Python standard
library's sources. Nothing is downloaded. :mod:`.base` holds the Task base class and the seeding.
Plugins add tasks with ``@attnspec.spec.components.component("task")`` on a subclass of :class:`Task`.
"""

from __future__ import annotations

from attnspec.spec.components import declare
from attnspec.training.tasks.base import IGNORE, MAX_DATA_BYTES, Task, TaskError, generator
from attnspec.training.tasks.synthetic import InductionHeadsTask, MemoryHorizonTask, MqarTask, SelectiveCopyingTask
from attnspec.training.tasks.mad import (FuzzyInContextRecallTask, InContextRecallTask, MemorizationTask,
                                         NoisyInContextRecallTask)
from attnspec.training.tasks.structured import ConvexHullTask, ListOpsTask, SortTask
from attnspec.training.tasks.text import BytesTask, PythonSourceTask, TextTask, TokensTask

TaskUnion = declare("task", MqarTask, MemoryHorizonTask, SelectiveCopyingTask, InductionHeadsTask,
                    InContextRecallTask, NoisyInContextRecallTask, FuzzyInContextRecallTask, MemorizationTask,
                    ListOpsTask, SortTask, ConvexHullTask, BytesTask, PythonSourceTask, TokensTask, TextTask, base=Task)

__all__ = ["IGNORE", "MAX_DATA_BYTES", "Task", "TaskError", "TaskUnion", "generator", "MqarTask", "MemoryHorizonTask",
           "SelectiveCopyingTask", "InductionHeadsTask", "InContextRecallTask", "NoisyInContextRecallTask",
           "FuzzyInContextRecallTask", "MemorizationTask", "ListOpsTask", "SortTask", "ConvexHullTask", "BytesTask", "PythonSourceTask",
           "TokensTask", "TextTask"]
