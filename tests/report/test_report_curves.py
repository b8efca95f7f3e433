"""reports/training-curves.png is a plot of the run's own history: read back, decoded and compared."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.artifact.directory import Artifact
from pipeline.report.curves import CURVES_PNG, METRICS_JSONL, TRAIN_JSON, Curves, plot_curves, read_curves
from tests.report.conftest import invoke

RED = (214, 39, 40)  # matplotlib's tab:red: the kept epoch's line and label
SERIES = {"train loss": (31, 119, 180), "validation loss": (255, 127, 14), "validation metric": (44, 160, 44)}


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB")).astype(int)


def near(rgb: np.ndarray, color: tuple[int, int, int], tolerance: int = 12) -> np.ndarray:
    """Where the image holds `color` (within `tolerance` per channel): a boolean mask."""
    return (np.abs(rgb - np.array(color)) <= tolerance).all(axis=-1)


@pytest.mark.slow
def test_the_curves_are_read_from_the_run_history(trained: Path) -> None:
    curves, note = read_curves(Artifact.load(trained))
    assert curves is not None and note == ""
    summary = json.loads((trained / TRAIN_JSON).read_text())
    assert curves.epochs == [h["epoch"] for h in summary["history"]]
    assert curves.val_loss == [h["loss"] for h in summary["history"]]
    assert curves.metric == "accuracy" and curves.val_metric == [h["accuracy"] for h in summary["history"]]
    assert (curves.best_epoch, curves.stopped_early, curves.patience) == (summary["best_epoch"], True, 1)
    steps: dict[int, list[float]] = {}
    for line in (trained / METRICS_JSONL).read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            steps.setdefault(record["epoch"], []).append(record["loss"])
    assert curves.train_loss == pytest.approx({epoch: np.mean(losses) for epoch, losses in steps.items()})
    assert list(curves.train_loss) == curves.epochs  # one training loss per epoch the validation saw


@pytest.mark.slow
def test_the_png_is_a_real_plot_that_changes_with_the_data(trained: Path, tmp_path: Path) -> None:
    assert invoke("report", trained).exit_code == 0
    image = pixels(trained / CURVES_PNG)
    assert image.shape == (480, 1200, 3)
    assert (image < 250).any(axis=-1).mean() > 0.03  # not blank: axes, text and lines cover part of it
    for name, color in {**SERIES, "kept epoch": RED}.items():
        assert near(image, color).sum() > 100, f"no {name} drawn"

    curves, _ = read_curves(Artifact.load(trained))
    assert curves is not None
    plot_curves(curves, "run", tmp_path / "a.png")
    plot_curves(curves, "run", tmp_path / "b.png")
    assert np.array_equal(pixels(tmp_path / "a.png"), pixels(tmp_path / "b.png"))  # the same data, the same picture

    worse = replace(curves, val_loss=[v * 3 for v in curves.val_loss], val_metric=[v / 2 for v in curves.val_metric])
    plot_curves(worse, "run", tmp_path / "c.png")
    changed = (pixels(tmp_path / "a.png") != pixels(tmp_path / "c.png")).any(axis=-1).sum()
    assert changed > 2000, changed

    # the kept epoch's marker sits where the data puts it: further right for a later epoch
    first, last = curves.epochs[0], curves.epochs[-1]
    plot_curves(replace(curves, best_epoch=first), "run", tmp_path / "first.png")
    plot_curves(replace(curves, best_epoch=last), "run", tmp_path / "last.png")
    x_first = np.nonzero(near(pixels(tmp_path / "first.png"), RED))[1].mean()
    x_last = np.nonzero(near(pixels(tmp_path / "last.png"), RED))[1].mean()
    assert x_last > x_first + 100, (x_first, x_last)


def test_a_run_without_metrics_jsonl_still_plots_validation_and_says_nothing_of_training_loss(tmp_path: Path) -> None:
    curves = Curves(
        epochs=[1, 2, 3], val_loss=[1.0, 0.5, 0.6], metric="accuracy", val_metric=[0.7, 0.9, 0.85],
        train_loss={}, best_epoch=2, stopped_early=False, patience=None,
    )  # fmt: skip
    plot_curves(curves, "validation only", tmp_path / "v.png")
    image = pixels(tmp_path / "v.png")
    assert near(image, SERIES["validation loss"]).sum() > 100 and near(image, RED).sum() > 100
    assert near(image, SERIES["train loss"]).sum() == 0  # no training-loss series drawn


# metrics.jsonl lines a hand or another tool may leave: no epoch, a text epoch, an infinite one, not an object
STEPS = [{"kind": "train", "loss": 0.5}, {"kind": "train", "epoch": "x", "loss": 1}, {"kind": "train", "epoch": 1e400},
         [1], {"kind": "train", "epoch": 1, "loss": 2}]  # fmt: skip


@pytest.mark.slow
def test_reports_with_wrong_types_give_curves_from_what_reads_and_the_record_for_the_rest(trained: Path) -> None:
    """train.json and metrics.jsonl written by hand (or by another pipe) and listed again: no traceback."""
    artifact = Artifact.load(trained)
    summary = json.loads((trained / TRAIN_JSON).read_text())
    record = artifact.manifest.stages.train
    steps = "".join(json.dumps(step) + "\n" for step in STEPS).encode()
    for best_epoch in ("x", None, 1e400, True):
        hostile = {**summary, "best_epoch": best_epoch, "stopped_early": "no"}
        artifact.write_file(TRAIN_JSON, json.dumps(hostile).encode())
        artifact.write_file(METRICS_JSONL, steps)
        artifact.save()
        curves, note = read_curves(Artifact.load(trained))
        assert curves is not None and note == ""
        assert (curves.best_epoch, curves.stopped_early) == (record.best_epoch, record.stopped_early), best_epoch
        assert curves.train_loss == {1: 2.0}  # the one step record with a usable epoch
    result = invoke("report", trained)
    assert result.exit_code == 0, result.output
