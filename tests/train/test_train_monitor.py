"""Which epoch's weights `pipe train` keeps: `train.monitor`, ties to the lower loss, early stopping on the same."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner
from sklearn.datasets import load_wine

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.train.objective import improves, kept_reason


def wine_csv(folder: Path) -> Path:
    """sklearn's wine (178 samples, 13 features) as a CSV whose label column holds the class names."""
    bunch = load_wine()
    header = ",".join([*(n.replace("/", "_") for n in bunch.feature_names), "cultivar"])
    rows = [
        ",".join([*(f"{v:g}" for v in x), str(bunch.target_names[t])])
        for x, t in zip(bunch.data, bunch.target, strict=True)
    ]
    path = folder / "wine.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def train_wine(folder: Path, **train: object) -> dict:
    wine_csv(folder)
    recipe = {"name": "wine", "model": {"arch": "mlp", "hidden": [32]},
              "data": {"source": "csv", "path": "wine.csv", "label_column": "cultivar"},
              "train": {"epochs": 30, "batch_size": 16, "lr": 0.003, **train}}  # fmt: skip
    (folder / "wine.yaml").write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(main, ["train", str(folder / "wine.yaml"), "--out", str(folder / "a")])
    assert result.exit_code == 0, result.output
    root = sorted((folder / "a" / "wine").iterdir(), key=lambda p: int(p.name))[-1]
    summary = json.loads((root / "reports" / "train.json").read_text())
    return {"summary": summary, "output": result.output, "artifact": Artifact.load(root)}


@pytest.fixture(scope="module")
def by_accuracy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return train_wine(tmp_path_factory.mktemp("acc"), monitor="val_accuracy")


def test_the_default_monitor_keeps_the_lowest_validation_loss(tmp_path: Path) -> None:
    run = train_wine(tmp_path)
    summary, history = run["summary"], run["summary"]["history"]
    kept = history[summary["best_epoch"] - 1]
    assert summary["monitor"] == "val_loss" and kept["loss"] == min(r["loss"] for r in history)
    assert kept["loss"] <= history[-1]["loss"]  # never an early epoch whose loss is far above the final one
    assert summary["best_epoch"] > 10, history  # the loss still falls for most of the 30 epochs
    reason = f"kept epoch {summary['best_epoch']}: lowest val_loss {kept['loss']:.4g} (ran all 30 epochs)"
    assert reason in run["output"] and reason == summary["kept"]
    assert run["artifact"].manifest.stages.train.kept == summary["kept"]
    assert run["artifact"].manifest.labels == ["class_0", "class_1", "class_2"]


def test_accuracy_ties_go_to_the_lower_loss(by_accuracy: dict) -> None:
    summary = by_accuracy["summary"]
    history = summary["history"]
    top = max(r["accuracy"] for r in history)
    first_top = next(r["epoch"] for r in history if r["accuracy"] == top)
    kept = history[summary["best_epoch"] - 1]
    assert kept["accuracy"] == top == summary["best_val_accuracy"]
    assert kept["loss"] == min(r["loss"] for r in history if r["accuracy"] == top)
    # the wine validation split reaches its best accuracy within a few epochs while the loss still falls:
    # the kept epoch is a later one at that accuracy, with a loss several times lower than the first's
    assert summary["best_epoch"] > first_top and kept["loss"] * 3 < history[first_top - 1]["loss"], history
    assert kept["loss"] <= history[-1]["loss"]
    assert f"highest val_accuracy {top:.4g}, val_loss {kept['loss']:.4g}" in summary["kept"]


def test_early_stopping_counts_epochs_without_a_better_monitored_figure(tmp_path: Path) -> None:
    run = train_wine(tmp_path, monitor="val_loss", early_stopping=2, lr=0.05, epochs=60)
    summary, history = run["summary"], run["summary"]["history"]
    assert summary["stopped_early"] and summary["epochs_run"] == summary["best_epoch"] + 2
    best = history[summary["best_epoch"] - 1]["loss"]
    assert all(r["loss"] >= best for r in history[summary["best_epoch"] :])
    assert "(early stop after epoch" in summary["kept"] and "2 epochs without improvement" in summary["kept"]


def progress(**fields: float) -> SimpleNamespace:
    base = {"best_epoch": 3, "best_metric": 0.9, "best_loss": 0.2, "epoch": 30, "stopped_early": False}
    return SimpleNamespace(**base | fields)


@pytest.mark.parametrize(("monitor", "record", "better"), [
    ("val_accuracy", {"accuracy": 0.95, "loss": 0.5}, True),   # higher accuracy, even at a higher loss
    ("val_accuracy", {"accuracy": 0.9, "loss": 0.1}, True),    # a tie: the lower loss wins
    ("val_accuracy", {"accuracy": 0.9, "loss": 0.2}, False),   # a full tie keeps the earlier epoch
    ("val_accuracy", {"accuracy": 0.85, "loss": 0.01}, False),
    ("val_mae", {"mae": 0.89, "loss": 9.0}, True),             # lower is better
    ("val_r2", {"r2": math.nan, "loss": 0.0}, False),          # NaN never improves
])  # fmt: skip
def test_improves_follows_the_monitors_direction_and_breaks_ties_by_loss(monitor: str, record: dict, better: bool):
    assert improves(monitor, record, progress()) is better
    assert improves(monitor, record | {"loss": 5.0}, progress(best_epoch=-1)) is not math.isnan(record.get("r2", 0))


def test_the_reason_names_the_epoch_the_figure_and_how_the_run_ended() -> None:
    early = progress(best_metric=0.0123, best_loss=0.0123, best_epoch=23, epoch=29, stopped_early=True)
    assert kept_reason("val_loss", early, 30, 6) == (
        "kept epoch 23: lowest val_loss 0.0123 (early stop after epoch 29: 6 epochs without improvement)"
    )
