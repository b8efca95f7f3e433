"""`pipe check` on models `pipe train` made: a candidate trained for one epoch fails against the longer-trained one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.check.check_models import FAST, invoke, regressions, reports

TINY = {
    "name": "check-tiny",
    "model": {"arch": "mlp", "hidden": [32]},
    "data": {"source": "digits"},
    "train": {"epochs": 4, "batch_size": 64, "lr": 0.01},
    # the recipe's budgets reach pipe check: accuracy may lose 2% of its baseline value, no more
    "budgets": {"metrics": {"accuracy": {"max_relative_drop": 0.02}}},
}


def trained(recipe: Path, out: Path, *train: str) -> Path:
    """`pipe train` then `pipe export` of the recipe: the new version's directory."""
    result = invoke("train", str(recipe), "--out", str(out), "--quiet", *train)
    assert result.exit_code == 0, result.output
    root = Path(result.output.strip().removeprefix("trained "))
    exported = invoke("export", str(root))
    assert exported.exit_code == 0, exported.output
    return root


@pytest.mark.slow
def test_a_candidate_trained_for_one_epoch_fails_on_accuracy_against_the_recipe_budget(tmp_path: Path) -> None:
    recipe, out = tmp_path / "check-tiny.yaml", tmp_path / "artifacts"
    recipe.write_text(yaml.safe_dump(TINY))
    baseline = trained(recipe, out)
    candidate = trained(recipe, out, "--epochs", "1")

    same = invoke("check", str(baseline), "--baseline", str(baseline), *FAST)
    assert same.exit_code == 0, same.output

    result = invoke("check", str(candidate), "--baseline", str(baseline), *reports(tmp_path), *FAST)
    assert result.exit_code == 1, result.output
    failed = regressions(result.output, tmp_path)
    assert "metric.accuracy" in failed and set(failed) <= {"metric.accuracy", "metric.loss"}, failed  # once each
    assert f"candidate  {candidate} (check-tiny v2, an artifact)" in result.output
    assert "recipe     train.epochs 4 -> 1  (baseline -> candidate)" in result.output
    accuracy = next(
        c for c in json.loads((tmp_path / "c.json").read_text())["checks"] if c["name"] == "metric.accuracy"
    )
    figures = accuracy["figures"]
    assert figures["broken"] == ["max_relative_drop"] and figures["relative_budget"] == 0.02
    assert figures["relative_drop"] > 0.02 and figures["candidate"] < figures["baseline"]
    assert "breaks max_relative_drop 0.02 (2.00%)" in failed["metric.accuracy"]
