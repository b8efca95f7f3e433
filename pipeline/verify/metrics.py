"""The task metric a gate measures over an evaluation split: accuracy for classifiers, MAE for regression.

Embeddings have no task metric here (no targets to score against); they are judged on their
outputs (cosine similarity to the reference).
"""

from __future__ import annotations

import numpy as np

HIGHER_IS_BETTER = {"accuracy": True, "mae": False}  # which way a drop goes, per metric name
# Budgets compare float differences of ratios of counts: 1.0 - 0.99 is 0.010000000000000009, which
# must meet a 0.01 budget (4 of 400 samples is exactly 1 point). Bounds are met within this slack.
SLACK = 1e-9


def task_metric(task: str, outputs: np.ndarray, target: np.ndarray) -> tuple[str, float] | None:
    """(name, value) of the task's metric on `outputs` (the model's first output), or None for no metric."""
    if task == "classification":
        return "accuracy", float((outputs.argmax(axis=-1) == target.reshape(-1)).mean())
    if task == "regression":
        return "mae", float(np.abs(outputs.reshape(len(target), -1) - target.reshape(len(target), -1)).mean())
    return None


def metric_drop(name: str, reference: float, candidate: float) -> float:
    """How much worse `candidate` is than `reference` (negative: better); for MAE a rise is a drop."""
    return reference - candidate if HIGHER_IS_BETTER[name] else candidate - reference
