"""What training minimizes and how it judges an epoch: the loss, the validation figures, the kept epoch.

- `Objective`: the recipe's `train.loss` for its task. Classifiers: cross-entropy on logits
  `[B, classes]`. Regression: MSE or Huber (delta 1) on *standardized* values: the model predicts
  `[B, 1]` in target units (its last layer, `zoo.TargetScale`, un-standardizes), and the loss maps
  prediction and target back through the train split's target mean and std, so its size does not
  depend on the units.
- `evaluate`: one pass over a split in fp32: `loss` and the task's figures (`accuracy`; or `mae`,
  `rmse`, `r2` in target units; a causal LM: the loss per scored token and `perplexity`).
- `improves` / `kept_reason`: `train.monitor` (`val_loss`, `val_accuracy`, `val_mae`, ...) picks
  the epoch whose weights are kept and drives early stopping; a tie on the monitored figure goes
  to the lower validation loss (an accuracy of 1.0 reached early stays 1.0 while the loss still falls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.data import DataInfo
from pipeline.recipe.schema import MONITORS, Recipe
from pipeline.verify.metrics import regression_metrics

EVAL_BATCH = 512
LM_EVAL_BATCH = 16  # rows per call for a causal LM: its logits are [rows, T, vocab]
HUBER_DELTA = 1.0  # in standardized target units: errors past one target std count linearly


@dataclass(frozen=True)
class Objective:
    """The training loss of one recipe: `objective(outputs, target)` -> a scalar tensor."""

    loss: str  # cross_entropy | mse | huber | causal_lm (resolved from `auto`)
    target_mean: float = 0.0  # regression: the train split's target statistics
    target_std: float = 1.0

    @property
    def regression(self) -> bool:
        return self.loss in ("mse", "huber")

    def __call__(self, outputs: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if self.loss == "causal_lm":  # logits [B, T, vocab] vs next-token labels [B, T] (-100: not scored)
            from pipeline.train.causal_lm import lm_loss

            return lm_loss(outputs, target, reduction=reduction)
        if not self.regression:
            return F.cross_entropy(outputs, target, reduction=reduction)  # [B, classes] vs [B] class indices
        predicted = (outputs.reshape(-1) - self.target_mean) / self.target_std  # [B, 1] -> [B], standardized
        wanted = (target.reshape(-1) - self.target_mean) / self.target_std
        if self.loss == "huber":
            return F.huber_loss(predicted, wanted, reduction=reduction, delta=HUBER_DELTA)
        return F.mse_loss(predicted, wanted, reduction=reduction)


def objective_for(recipe: Recipe, info: DataInfo) -> Objective:
    """The recipe's `train.loss` (`auto`: cross-entropy for classifiers, MSE for regression, the next-token loss
    for a text-generation model)."""
    if recipe.task == "text-generation":
        return Objective("causal_lm")
    if recipe.task != "regression":
        return Objective("cross_entropy")
    loss = "mse" if recipe.train.loss == "auto" else recipe.train.loss
    return Objective(loss, info.target_mean or 0.0, info.target_std or 1.0)


@torch.no_grad()
def evaluate(model: nn.Module, x: dict[str, torch.Tensor], y: torch.Tensor, objective: Objective) -> dict[str, float]:
    """Mean loss and the task's figures over a whole split, in fp32 (every rank sees all of it).

    `x`: each model input [N, ...] by name, in the order forward takes them. Leaves the model in the
    mode it found it: the caller may be mid-training or finishing up.
    """
    if objective.loss == "causal_lm":
        return _language_figures(model, x, y, objective)
    was_training = model.training
    model.eval()
    chunks = [slice(start, start + EVAL_BATCH) for start in range(0, len(y), EVAL_BATCH)]
    outputs = torch.cat([model(*(t[rows] for t in x.values())).float() for rows in chunks])
    model.train(was_training)
    figures = {"loss": objective(outputs, y, reduction="sum").item() / len(y)}
    if objective.regression:  # [N, 1] predictions in target units
        return figures | regression_metrics(outputs.cpu().numpy(), y.cpu().numpy())
    return figures | {"accuracy": int((outputs.argmax(dim=1) == y).sum().item()) / len(y)}  # exact ratio of counts


def _language_figures(
    model: nn.Module, x: dict[str, torch.Tensor], y: torch.Tensor, objective: Objective
) -> dict[str, float]:
    """A causal LM's mean loss per scored token over the split, and its exponential, the perplexity.

    A few rows per call: the logits of a chunk are [rows, T, vocab], far larger than a classifier's."""
    was_training = model.training
    model.eval()
    total, counted = 0.0, 0
    for start in range(0, len(y), LM_EVAL_BATCH):
        rows = slice(start, start + LM_EVAL_BATCH)
        logits = model(*(t[rows] for t in x.values())).float()  # [rows, T, vocab]
        total += objective(logits, y[rows], reduction="sum").item()
        counted += int((y[rows, 1:] >= 0).sum().item())  # the next tokens scored (-100 is not)
    model.train(was_training)
    loss = total / max(counted, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}  # capped: exp(50) already says "untrained"


def improves(monitor: str, record: dict[str, float], best: Any) -> bool:
    """Whether this epoch's validation `record` beats the kept epoch's (`best`: Progress).

    Better on the monitored figure, or equal on it with a lower validation loss. The first
    evaluated epoch always counts; a NaN figure never does.
    """
    value, loss = record[monitor.removeprefix("val_")], record["loss"]
    if not math.isfinite(value):
        return False
    if best.best_epoch < 0:
        return True
    higher = MONITORS[monitor]
    if value != best.best_metric:
        return value > best.best_metric if higher else value < best.best_metric
    return loss < best.best_loss


def kept_reason(monitor: str, progress: Any, epochs: int, patience: int | None) -> str:
    """One line: which epoch's weights are kept and why, e.g.
    "kept epoch 23: lowest val_loss 0.0123 (early stop: 6 epochs without improvement)"."""
    if progress.best_epoch < 0:
        return "no epoch was evaluated: no weights kept"
    word = "highest" if MONITORS[monitor] else "lowest"
    tie = ""
    if monitor != "val_loss":
        tie = f", val_loss {progress.best_loss:.4g}"
    if progress.stopped_early:
        end = f"early stop after epoch {progress.epoch}: {patience} epochs without improvement"
    else:
        end = f"ran all {epochs} epochs" if progress.epoch >= epochs else f"ran {progress.epoch} of {epochs} epochs"
    return f"kept epoch {progress.best_epoch}: {word} {monitor} {progress.best_metric:.4g}{tie} ({end})"
