"""What a run costs before it runs: parameters, state size, training FLOPs and an estimated time.

Parameters and state size are exact (counted on the built model). FLOPs and time come from the
compiler's cost model (:mod:`attnspec.compiler.plan`): the dense part is 2 FLOPs per weight per
token forward and 3x that for forward + backward; each mixer adds its planned mode's multiply-adds.
The time is the cost model's, not a measurement: it orders runs and sizes a sweep, nothing more.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass
class RunEstimate:
    """The estimated cost of one training run."""

    parameters: int
    state_size: int
    """Numbers a sequence carries from its past at the task's length (see ``Model.state_size``)."""
    flops: float
    """Training and evaluation FLOPs of the whole run."""
    seconds: float
    """Cost-model time of the whole run on this kind of machine (one process)."""
    modes: list[str] | None = None
    """The full mode of every block the run trains with (``planning: model``: the cost model's, the same on
    every machine); None where the run measures its modes when it starts (``planning: measured``)."""

    def to_json(self) -> dict:
        return asdict(self)


class Estimator:
    """Estimates runs, building each distinct model once."""

    def __init__(self) -> None:
        self._models: dict[str, tuple[int, int, object]] = {}

    def __call__(self, spec, config) -> RunEstimate:
        """The estimate for a resolved ``spec`` trained with the :class:`TrainConfig` ``config``."""
        from attnspec.compiler.calibration import Calibration
        from attnspec.compiler.plan import plan_spec
        from attnspec.spec.family import MAC_RATE

        L = config.task.seq_len
        parameters, dense, model = self._model(spec)
        micro = max(1, config.batch_size // config.accumulate)
        modes = None
        if config.planning == "model":
            modes = plan_spec(spec, L, batch=micro, training=True, calibration=Calibration.empty()).full_modes
        # this machine's measured times of those modes where it has them, else estimates
        training_plan = plan_spec(spec, L, batch=micro, training=True, recorded=modes)
        inference_plan = plan_spec(spec, L, batch=1)
        mixer_macs = sum(layer.cost.macs for layer in inference_plan.layers)  # one sequence, forward
        forward = 2 * (dense * L + mixer_macs)  # FLOPs of one sequence, forward
        evaluations = (config.steps // config.eval_every if config.eval_every else 0) + 1
        flops = config.steps * config.batch_size * 3 * forward + evaluations * config.test_examples * forward
        step_seconds = (sum(layer.seconds for layer in training_plan.layers) * config.accumulate
                        + 3 * dense * L * config.batch_size / MAC_RATE)
        eval_seconds = config.test_examples * forward / 2 / MAC_RATE
        return RunEstimate(parameters, model.state_size(L), flops,
                           config.steps * step_seconds + evaluations * eval_seconds, modes)

    def _model(self, spec) -> tuple[int, int, object]:
        """(parameters, multiply-adds per token of the dense layers, the model), cached by spec."""
        from attnspec.nn.model import build_model_from_spec
        from attnspec.spec import spec_to_data

        key = json.dumps(spec_to_data(spec, minimal=False), sort_keys=True)
        if key not in self._models:
            model = build_model_from_spec(spec)
            parameters = sum(p.numel() for p in model.parameters())
            lookups = sum(p.numel() for name, p in model.named_parameters()
                          if name.startswith("position.") or (name == "embed.weight" and model.token_input))
            tied_head = model.embed.weight.numel() if model.token_input and model.head is None \
                and model.head_kind == "lm" else 0
            self._models[key] = (parameters, parameters - lookups + tied_head, model)
        return self._models[key]


def format_flops(flops: float) -> str:
    """``3.2e12`` -> ``"3.2 TFLOP"``."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP"


def format_seconds(seconds: float) -> str:
    """``95`` -> ``"1m35s"``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
