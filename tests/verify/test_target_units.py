"""Budgets and tolerances of a regression model in the right units: a house price's MAE is in USD.

Fixed absolute defaults (`budgets` 0.005, `edge.max_accuracy_drop` 0.015, the export gate's metric
tolerance 0.001) meant "the MAE may not move by half a cent" for a house-price model, while
optimize's default was 1% relative. Each default now scales with the metric (or is relative), and
a line that prints two figures says where each was measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from pipeline.check.checks import judge_metric
from pipeline.cli import main
from pipeline.optimize.judge import failure_detail
from pipeline.recipe.budgets import BudgetSpec, MetricBudget
from pipeline.recipe.schema import EdgeSpec
from pipeline.verify.budgets import MetricDrop, RelativeError
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.policies import Exact
from pipeline.verify.report import GateReport, Row


def write_houses(root: Path, rows: int = 300) -> Path:
    """Prices in USD (about 160,000 to 980,000) from size, bedrooms, age and a neighborhood."""
    rng = np.random.default_rng(0)
    sqft, beds, age = rng.uniform(600, 4000, rows), rng.integers(1, 6, rows), rng.uniform(0, 80, rows)
    hood = rng.choice(["downtown", "suburb", "rural"], rows)
    extra = {"downtown": 120_000, "suburb": 60_000, "rural": 0}
    price = 80_000 + 180 * sqft + 9_000 * beds - 900 * age + [extra[h] for h in hood] + rng.normal(0, 25_000, rows)
    lines = ["sqft,bedrooms,age,neighborhood,price"]
    lines += [f"{s:.0f},{b},{a:.1f},{h},{p:.0f}" for s, b, a, h, p in zip(sqft, beds, age, hood, price, strict=True)]
    (root / "houses.csv").write_text("\n".join(lines) + "\n")
    recipe = {
        "name": "house", "task": "regression", "model": {"arch": "mlp", "hidden": [32]},
        "data": {"source": "csv", "path": "houses.csv", "label_column": "price"},
        "train": {"epochs": 15, "batch_size": 32, "lr": 0.003, "loss": "mse"},
    }  # fmt: skip
    (root / "house.yaml").write_text(json.dumps(recipe))
    return root / "house.yaml"


def test_a_house_price_model_passes_its_own_export_gate(tmp_path: Path) -> None:
    """torch and onnxruntime agree to float32 rounding; on prices near 5e5 that moved the MAE by ~0.002 USD,
    past the fixed 0.001 tolerance, and a sound export failed."""
    recipe, out = write_houses(tmp_path), tmp_path / "artifacts"
    for args in (["train", str(recipe), "--out", str(out), "--quiet"], ["export", str(out / "house" / "1")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output


def test_the_lossless_metric_tolerance_scales_with_a_metric_in_target_units() -> None:
    exact = Exact()  # export's defaults: metric 0.001, rtol 0.001
    assert exact.judge_metric("mae", 21396.5039, 21396.5020).passed  # float32 rounding of a USD MAE
    assert not exact.judge_metric("mae", 21396.5, 21420.0).passed  # 23.5 USD is more than rounding
    assert not exact.judge_metric("accuracy", 0.95, 0.9489).passed  # unitless: the tolerance stays 0.001


def test_check_defaults_are_relative_for_metrics_in_target_units() -> None:
    spec = BudgetSpec()
    assert spec.for_metric("mae") == MetricBudget(max_relative_drop=0.01)
    assert spec.for_metric("rmse") == MetricBudget(max_relative_drop=0.01)
    assert spec.for_metric("accuracy") == MetricBudget(max_drop=0.005)
    held, detail, _ = judge_metric("mae", 21396.5, 21500.0, spec)  # +103 USD: 0.48% of the MAE
    assert held, detail
    held, detail, _ = judge_metric("mae", 21396.5, 21700.0, spec)  # +1.4%
    assert not held and "breaks the default relative budget for mae (target units)" in detail
    assert BudgetSpec(max_accuracy_drop=150).for_metric("mae") == MetricBudget(max_drop=150)  # given: as given


def test_edge_defaults_follow_the_task() -> None:
    settings, given = GateSettings.read(EdgeSpec().model_dump()), GateSettings(max_accuracy_drop=3.0)
    assert hop_policy("edge", "int8", "regression", True, settings) == RelativeError()  # optimize's default, 1%
    assert hop_policy("edge", "int8", "classification", True, settings) == MetricDrop(0.015)
    assert hop_policy("edge", "int8", "regression", True, given) == MetricDrop(3.0)
    assert hop_policy("edge", "fp16", "regression", True, settings).judge_metric("mae", 21396.5, 21398.0).passed


def test_a_failure_and_the_split_figure_each_say_where_they_were_measured() -> None:
    report = GateReport([Row("batch 1", "predictions", False, "relative error 0.02744 (L2), budget <= 0.01")])
    line = failure_detail(report, "relative error 0.005675 (budget <= 0.01)", 120)
    assert line == (
        "failed on batch 1 predictions: relative error 0.02744 (L2), budget <= 0.01; "
        "over the evaluation split (120 samples): relative error 0.005675 (budget <= 0.01)"
    )
