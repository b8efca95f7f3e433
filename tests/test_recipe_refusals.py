"""Recipe input that used to pass silently: each is one line naming the key, exit 2, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main

BASE = """\
name: t
model: {arch: mlp, hidden: [8]}
data: {source: digits}
train:
  epochs: 1
"""


@pytest.mark.parametrize(("text", "expected"), [
    (BASE + "  lr: 0.1\n  lr: 0.2\n", "train.lr: key given twice (lines 6 and 7); keep one"),
    (BASE + "model: {arch: mlp}\n", "model: key given twice (lines 2 and 6); keep one"),
    (BASE + "  lr: .inf\n", "train.lr: Input should be a finite number (got inf)"),
    (BASE + "  weight_decay: .nan\n", "train.weight_decay: Input should be a finite number (got nan)"),
    (BASE.replace("hidden: [8]", "hidden: [8], dropout: .NaN"), "model.dropout: Input should be a finite number"),
    (BASE + "  grad_clip: -.inf\n", "train.grad_clip: Input should be a finite number (got -inf)"),
    (BASE + "budgets: {max_accuracy_drop: .nan}\n", "budgets.max_accuracy_drop: Input should be greater than or equal"),
    (BASE + "task: embedding\n", "task 'embedding' is not available yet in recipes"),
    (BASE.replace("source: digits", "source: digits, label_column: y"),
     "data.label_column applies to source 'csv' or 'text' only (source is 'digits'); remove it"),
    (BASE.replace("source: digits", "source: digits, image_size: [8, 8]"),
     "data.image_size applies to source 'images' only (source is 'digits'); remove it"),
    (BASE + "budgets: {metrics: {acuracy: {max_drop: 0.01}}}\n", "budgets.metrics: no task metric named 'acuracy'"),
    (BASE + "  loss: mse\n", "train.loss 'mse' does not train a classification model; valid choices: auto, "
     "cross_entropy"),
    (BASE + "  monitor: val_r2\n", "train.monitor 'val_r2' is not measured for a classification model"),
    (BASE + "task: regression\n", "task 'regression' needs numeric targets, and data.source 'digits' holds classes"),
    (BASE.replace("digits", "diabetes"), "data.source 'diabetes' holds numeric targets, not classes; set task: "
     "regression"),
])  # fmt: skip
def test_a_bad_recipe_is_one_line_exit_2_and_nothing_written(tmp_path: Path, text: str, expected: str) -> None:
    recipe = tmp_path / "t.yaml"
    recipe.write_text(text)
    out = tmp_path / "artifacts"
    result = CliRunner().invoke(main, ["train", str(recipe), "--out", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()


def test_merge_keys_override_without_counting_as_duplicates(tmp_path: Path) -> None:
    from pipeline.recipe.file import load_recipe

    recipe = tmp_path / "t.yaml"
    recipe.write_text(BASE + "  <<: {lr: 0.5, batch_size: 8}\n  lr: 0.25\n")
    loaded = load_recipe(recipe)
    assert (loaded.train.lr, loaded.train.batch_size) == (0.25, 8)


def test_an_infinite_budget_is_the_one_infinity_a_recipe_may_hold(tmp_path: Path) -> None:
    from pipeline.recipe.file import load_recipe

    recipe = tmp_path / "t.yaml"
    recipe.write_text(BASE + "budgets: {max_accuracy_drop: .inf, metrics: {accuracy: {max_drop: .inf}}}\n")
    budgets = load_recipe(recipe).budgets  # `pipe check --max-accuracy-drop inf`: the metric is not gated
    assert budgets.max_accuracy_drop == budgets.for_metric("accuracy").max_drop == float("inf")
