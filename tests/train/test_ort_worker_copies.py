"""The ORT worker's copies of pipe's rules equal the originals.

pipeline/train/ort_worker.py runs as a script in `.venv-ort` and may import nothing of pipe (the
`ort-worker-alone` import-linter contract), so it copies the table of monitors, the learning-rate
schedule, the kept-epoch rule and the evaluation figures. These tests hold each copy to its
original: the tables compared whole, the functions on a grid of inputs, so a change to one side
without the other fails here, not in a slow training run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict
from typing import get_args

import numpy as np
import pytest
import torch

from pipeline.artifact.directions import HIGHER_IS_BETTER
from pipeline.recipe.schema import MONITORS, TASK_MONITORS, TrainSpec
from pipeline.train import objective, ort_worker
from pipeline.train.loop import Progress, lr_at


def test_the_monitors_are_one_table() -> None:
    assert ort_worker.MONITORS == MONITORS
    assert MONITORS == {name: HIGHER_IS_BETTER[name.removeprefix("val_")] for name in MONITORS}
    assert get_args(TrainSpec.model_fields["monitor"].annotation) == tuple(MONITORS)
    assert {m for task in TASK_MONITORS.values() for m in task} == set(MONITORS)
    assert ort_worker.EVAL_BATCH == objective.EVAL_BATCH
    assert ort_worker.new_progress() == asdict(Progress())


def test_lr_at_is_the_loops() -> None:
    for lr, warmup, floor, total in itertools.product((1e-3, 0.3), (0, 1, 7), (0.0, 0.1, 1.0), (1, 5, 40)):
        spec = TrainSpec(lr=lr, warmup_steps=warmup, min_lr_ratio=floor)
        for step in range(total + 3):  # past the end too: the decay holds at its floor
            assert ort_worker.lr_at(step, spec.model_dump(), total) == lr_at(step, spec, total), (spec, step, total)


def test_improves_is_the_objectives() -> None:
    values = (math.nan, -math.inf, -1.0, 0.0, 0.5, 1.0, math.inf)
    bests = [Progress()] + [
        Progress(best_metric=metric, best_loss=loss, best_epoch=3)
        for metric, loss in itertools.product((0.0, 0.5, 1.0), (0.2, 0.5))
    ]
    for monitor, value, loss, best in itertools.product(MONITORS, values, (0.1, 0.5, 0.9), bests):
        record = {monitor.removeprefix("val_"): value, "loss": loss if monitor != "val_loss" else value}
        want = objective.improves(monitor, record, best)
        assert ort_worker.improves(monitor, record, asdict(best)) == want, (monitor, record, best)


class _WorkerModule:
    """What the worker's `evaluate` calls (an onnxruntime.training Module in eval mode), answered by a torch
    model and pipe's objective: `module(x, y)` -> (the batch's mean loss, the outputs)."""

    def __init__(self, model: torch.nn.Module, loss: objective.Objective) -> None:
        self.model, self.loss = model, loss

    def eval(self) -> None:
        pass

    def train(self) -> None:
        pass

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            out = self.model(torch.from_numpy(x))
            return self.loss(out, torch.from_numpy(y)).numpy(), out.numpy()


@pytest.mark.parametrize("regression", [False, True])
def test_evaluate_figures_are_the_objectives(regression: bool) -> None:
    rng = np.random.default_rng(0)
    rows = 2 * ort_worker.EVAL_BATCH + 77  # three batches, the last one short
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1 if regression else 3)
    if regression:
        y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) * 10 + 50).astype(np.float32)  # [N] in target units
        loss = objective.Objective("mse", target_mean=float(y.mean()), target_std=float(y.std()))
    else:
        y = rng.integers(0, 3, size=rows).astype(np.int64)
        loss = objective.Objective("cross_entropy")
    want = objective.evaluate(model, {"x": torch.from_numpy(x)}, torch.from_numpy(y), loss)
    targets = ort_worker._targets(y, regression)  # [N] classes or [N, 1]
    got, outputs = ort_worker.evaluate(_WorkerModule(model, loss), x, targets, regression)
    assert got.keys() == want.keys()
    assert got == pytest.approx(want, rel=1e-6)
    assert outputs.shape == (rows, 1 if regression else 3)
