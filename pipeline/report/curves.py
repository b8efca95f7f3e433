"""reports/training-curves.png: what training did, epoch by epoch, from the files `pipe train` left.

`reports/train.json` holds one validation record per epoch (`history`: epoch, loss and the task
metric), the epoch whose weights were kept (`best_epoch`) and whether training stopped early;
`reports/metrics.jsonl` holds the training loss of every optimizer step, averaged here per epoch.
The plot has two panels: the training and validation loss, and the validation metric, with the
kept epoch and the early stop marked on both. matplotlib draws it with its Agg canvas (no
display, no pyplot state), imported only when a plot is made.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact

TRAIN_JSON = "reports/train.json"
METRICS_JSONL = "reports/metrics.jsonl"
CURVES_PNG = "reports/training-curves.png"


@dataclass
class Curves:
    """One training run per epoch (epochs count from 1)."""

    epochs: list[int]
    val_loss: list[float]
    metric: str  # the validation metric's name, e.g. accuracy
    val_metric: list[float]
    train_loss: dict[int, float]  # epoch -> mean training loss over its steps; empty without metrics.jsonl
    best_epoch: int  # the epoch whose weights were kept
    stopped_early: bool
    patience: int | None  # train.early_stopping: epochs without improvement before stopping


def read_curves(artifact: Artifact) -> tuple[Curves | None, str]:
    """The run's curves, or None and why there are none (an imported model, a train.json without history)."""
    path = artifact.root / TRAIN_JSON
    if artifact.manifest.stages.train is None:
        return None, "imported model: it was not trained here, so there are no training curves"
    if TRAIN_JSON not in artifact.manifest.files or not path.is_file():
        return None, f"{TRAIN_JSON} is not in the artifact, so there are no training curves"
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        return None, f"{TRAIN_JSON} cannot be read ({exc}), so there are no training curves"
    history = summary.get("history") if isinstance(summary, dict) else None
    records = [r for r in history or [] if isinstance(r, dict) and _finite(r.get("epoch")) and _finite(r.get("loss"))]
    if not records:
        return None, f"{TRAIN_JSON} holds no per-epoch history, so there are no training curves"
    # the figure train.monitor chose the kept epoch by (val_accuracy, val_r2, ...), else the first besides loss
    monitored = str(summary.get("monitor", "")).removeprefix("val_")
    metric = monitored if monitored in records[0] and monitored != "loss" else ""
    metric = metric or next((k for k in records[0] if k not in ("epoch", "loss")), "")
    record = artifact.manifest.stages.train
    patience = record.settings.get("train", {}).get("early_stopping")
    curves = Curves(
        epochs=[int(r["epoch"]) for r in records],
        val_loss=[float(r["loss"]) for r in records],
        metric=metric,
        val_metric=[float(r[metric]) if _finite(r.get(metric)) else math.nan for r in records],
        train_loss=_train_loss(artifact),
        # the report's own figures where they read as such; else the train record's (typed, verified)
        best_epoch=int(best) if _finite(best := summary.get("best_epoch")) else record.best_epoch,
        stopped_early=stop if isinstance(stop := summary.get("stopped_early"), bool) else record.stopped_early,
        patience=patience if isinstance(patience, int) else None,
    )
    return curves, ""


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _train_loss(artifact: Artifact) -> dict[int, float]:
    """Mean training loss per epoch from metrics.jsonl (one record per optimizer step); {} when absent."""
    path = artifact.root / METRICS_JSONL
    if METRICS_JSONL not in artifact.manifest.files or not path.is_file():
        return {}
    sums: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        usable = isinstance(record, dict) and _finite(record.get("epoch")) and _finite(record.get("loss"))
        if usable and record.get("kind") == "train":
            sums.setdefault(int(record["epoch"]), []).append(float(record["loss"]))
    return {epoch: sum(values) / len(values) for epoch, values in sorted(sums.items())}


def plot_curves(curves: Curves, title: str, path: Path) -> None:
    """Draw the two panels into a PNG at `path` (1200 x 480 pixels)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    figure = Figure(figsize=(10, 4), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, metric_axes = figure.subplots(1, 2)
    figure.suptitle(title)

    if curves.train_loss:
        epochs = list(curves.train_loss)
        loss_axes.plot(epochs, list(curves.train_loss.values()), "o-", ms=3, color="tab:blue", label="train loss")
    loss_axes.plot(curves.epochs, curves.val_loss, "s-", ms=3, color="tab:orange", label="validation loss")
    loss_axes.set_xlabel("epoch")
    loss_axes.set_ylabel("loss (log scale)")
    loss_axes.set_yscale("log")  # the late epochs, where train and validation part ways, stay visible
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 0.01 and 0.5, not 10^-2 and 5x10^-1
    losses = [*curves.val_loss, *curves.train_loss.values()]
    loss_axes.yaxis.set_major_formatter(plain)
    if max(losses) < 10 * min(losses):  # less than a decade: label the minor ticks too, or only one may show
        loss_axes.yaxis.set_minor_formatter(plain)
    loss_axes.set_title("loss per epoch")

    metric_axes.plot(
        curves.epochs, curves.val_metric, "s-", ms=3, color="tab:green", label=f"validation {curves.metric}"
    )
    metric_axes.set_xlabel("epoch")
    metric_axes.set_ylabel(f"validation {curves.metric}")
    metric_axes.set_title(f"validation {curves.metric} per epoch")

    best = curves.best_epoch
    for axes in (loss_axes, metric_axes):
        axes.axvline(best, color="tab:red", ls="--", lw=1.5, label=f"kept: epoch {best}")
        if curves.stopped_early:
            why = f" ({curves.patience} epochs without improvement)" if curves.patience else ""
            axes.axvline(
                curves.epochs[-1], color="0.4", ls=":", lw=1.5, label=f"early stop: epoch {curves.epochs[-1]}{why}"
            )
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    if best in curves.epochs:
        value = curves.val_metric[curves.epochs.index(best)]
        metric_axes.plot([best], [value], "o", ms=8, mfc="none", mec="tab:red")
        metric_axes.annotate(
            f"{value:.4g}", (best, value), textcoords="offset points", xytext=(6, -14), color="tab:red"
        )
    figure.savefig(path, format="png")
