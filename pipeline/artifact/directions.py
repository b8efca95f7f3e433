"""Which way each metric improves: what `pipe check`, the recipe's budgets, the reports and `train.monitor` judge.

The one table of directions: recipe/schema.py's `MONITORS` is derived from it, and the copy in
pipeline/train/ort_worker.py (which may import nothing of pipe) is held equal to that by
tests/train/test_ort_worker_copies.py.
"""

from __future__ import annotations

# Per metric name, whether a higher value is better; a metric not listed here is shown, never judged.
# box_agreement: a detection variant's boxes matched to its parent's (pipeline/verify/policies.py BoxAgreement).
# loss: the training objective on the test split (cross-entropy, or MSE on standardized targets).
# text_agreement, cer: a text recognizer's texts read exactly, and its character error rate (verify/metrics.py).
HIGHER_IS_BETTER = {"accuracy": True, "mae": False, "rmse": False, "r2": True, "box_agreement": True, "loss": False,
                    "text_agreement": True, "cer": False, "perplexity": False}  # fmt: skip
# Metrics in the target's own units (USD for a house-price model, not a fraction): a fixed absolute
# budget means nothing for them across models, so their default budgets and tolerances scale with the
# metric's reference value; accuracy, r2 and box agreement are unitless.
IN_TARGET_UNITS = frozenset({"mae", "rmse"})


def metric_drop(name: str, reference: float, candidate: float) -> float:
    """How much worse `candidate` is than `reference` (negative: better); for MAE and RMSE a rise is a drop."""
    return reference - candidate if HIGHER_IS_BETTER[name] else candidate - reference
