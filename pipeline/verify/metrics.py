"""The task metric a gate measures over an evaluation split: accuracy for classifiers, MAE for regression,
text agreement for text recognizers (with the character error rate beside it: `text_metrics`).

Embeddings have no task metric here (no targets to score against); they are judged on their
outputs (cosine similarity to the reference). `regression_metrics` gives the figures training
reports for a regression model (MAE, RMSE, R^2); the gate judges MAE, in the target's units.
"""

from __future__ import annotations

import numpy as np

# Budgets compare float differences of ratios of counts: 1.0 - 0.99 is 0.010000000000000009, which
# must meet a 0.01 budget (4 of 400 samples is exactly 1 point). Bounds are met within this slack.
SLACK = 1e-9
# the tasks with a task metric; the others are judged on outputs
METRIC_TASKS = ("classification", "regression", "text-recognition")


def task_metric(task: str, outputs: np.ndarray, target: np.ndarray) -> tuple[str, float] | None:
    """(name, value) of the task's metric on `outputs` (the model's first output), or None for no metric."""
    if task == "classification":
        return "accuracy", float((outputs.argmax(axis=-1) == target.reshape(-1)).mean())
    if task == "regression":
        return "mae", float(np.abs(outputs.reshape(len(target), -1) - target.reshape(len(target), -1)).mean())
    if task == "text-recognition":
        return "text_agreement", text_metrics(outputs, target)["text_agreement"]
    return None


def regression_metrics(predicted: np.ndarray, target: np.ndarray) -> dict[str, float]:
    """MAE, RMSE and R^2 of predictions against targets (both [n] or [n, k]; float64 sums).

    R^2 = 1 - SS_res / SS_tot over every value: 1 is perfect, 0 is predicting the targets' mean,
    negative is worse than that. With constant targets SS_tot is 0: R^2 is 1 for a perfect fit, else 0.
    """
    got = predicted.astype(np.float64).reshape(len(target), -1)
    want = target.astype(np.float64).reshape(len(target), -1)
    error = got - want
    ss_res = float((error**2).sum())
    ss_tot = float(((want - want.mean(axis=0)) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return {"mae": float(np.abs(error).mean()), "rmse": float(np.sqrt((error**2).mean())), "r2": r2}


def text_metrics(outputs: np.ndarray, target: np.ndarray) -> dict[str, float]:
    """A CTC recognizer's texts (greedy decoding of its [n, positions, classes] output, blank 0) against
    target class sequences ([n, length], padded with -1; pipeline/runtime/ctc.py `encode`): `text_agreement`,
    the share of texts read exactly, and `cer`, the character error rate (edits over target characters)."""
    from pipeline.runtime.ctc import greedy, sequences, text_figures

    figures = text_figures([r.classes for r in greedy(outputs)], sequences(target))
    return {"text_agreement": figures.agreement, "cer": figures.cer}
