"""A training run's evaluation as one line of text (the training log, the end of `attnspec train`, a
sweep's finished runs). Its own module so that :mod:`.sweeps` shows it without importing :mod:`.display`
(which imports :mod:`.sweeps`)."""

from __future__ import annotations


def metrics_text(metrics: dict) -> str:
    """A run's evaluation in one line: each number, the accuracy with its chance level beside it and
    "not learned" where it is within noise of it (``learned`` False)."""
    parts = []
    for key, value in metrics.items():
        if key in ("step", "chance", "learned") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        text = f"{key} {value:.4g}"
        if key == "accuracy" and metrics.get("chance") is not None:
            text += f" (chance {metrics['chance']:.3g}{', not learned' if metrics.get('learned') is False else ''})"
        parts.append(text)
    return ", ".join(parts)
