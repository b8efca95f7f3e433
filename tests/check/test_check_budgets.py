"""`budgets:` in a recipe: an absolute drop for every metric, or per metric an absolute and a relative drop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.check.baseline import VariantSummary
from pipeline.check.checks import check_metrics, check_variants
from pipeline.core.errors import RecipeError
from pipeline.recipe.budgets import BudgetSpec, MetricBudget
from pipeline.recipe.schema import parse_recipe
from tests.check.check_models import FAST, imported, invoke, linear, summary

RECIPE = {"name": "toy", "model": {"arch": "mlp"}, "data": {"source": "digits"}}


def budgets(**section: object) -> BudgetSpec:
    return parse_recipe({**RECIPE, "budgets": section}).budgets


def test_a_recipe_gives_each_metric_its_own_budgets_and_the_rest_keep_max_accuracy_drop() -> None:
    spec = budgets(max_accuracy_drop=0.01, metrics={"accuracy": {"max_drop": 0.02, "max_relative_drop": 0.03}})
    assert spec.for_metric("accuracy") == MetricBudget(max_drop=0.02, max_relative_drop=0.03)
    assert spec.for_metric("mae") == MetricBudget(max_drop=0.01)
    assert budgets(metrics={"mae": {"max_relative_drop": 0.05}}).for_metric("mae").max_drop is None
    assert BudgetSpec().max_latency_increase == 0.10  # the example; measured in docs/check.md


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"metrics": {"accuracy": {"max_dorp": 0.01}}}, "budgets.metrics.accuracy.max_dorp: unknown key"),
        ({"metrics": {"accuracy": {"max_relative_drop": -0.1}}}, "budgets.metrics.accuracy.max_relative_drop: "),
        ({"metrics": {"accuracy": {}}}, "give max_drop, max_relative_drop or both"),
        ({"max_latency_increase": -1}, "budgets.max_latency_increase: Input should be greater than or equal to 0"),
        ({"metric": {}}, "budgets.metric: unknown key"),
    ],
)
def test_unknown_keys_negative_and_empty_budgets_are_refused_by_their_path(section: dict, message: str) -> None:
    with pytest.raises(RecipeError, match="recipe <recipe> is invalid") as caught:
        budgets(**section)
    assert message in str(caught.value)


def test_a_metric_fails_on_whichever_budget_it_breaks_and_the_line_names_it_with_the_numbers() -> None:
    before, after = summary(metrics={"accuracy": 0.9}), summary(metrics={"accuracy": 0.88})  # drop 0.02, 2.22%

    (default,) = check_metrics(after, before, BudgetSpec())
    assert default.failed and default.detail == "accuracy 0.9 -> 0.88: drop +0.02 breaks max_accuracy_drop 0.005"

    (absolute_only,) = check_metrics(after, before, budgets(metrics={"accuracy": {"max_drop": 0.05}}))
    assert absolute_only.status == "passed" and "drop +0.02 within max_drop 0.05" in absolute_only.detail

    relative = budgets(metrics={"accuracy": {"max_drop": 0.05, "max_relative_drop": 0.02}})
    (result,) = check_metrics(after, before, relative)
    assert result.failed and result.detail == (
        "accuracy 0.9 -> 0.88: drop +0.02 within max_drop 0.05; "
        "relative drop +2.22% breaks max_relative_drop 0.02 (2.00%)"
    )
    assert result.figures["broken"] == ["max_relative_drop"]
    assert result.figures["relative_drop"] == pytest.approx(0.02 / 0.9)
    assert check_metrics(after, before, budgets(metrics={"accuracy": {"max_relative_drop": 0.025}}))[0].status == (
        "passed"
    )


def test_for_mae_a_rise_is_the_drop_and_relative_is_to_the_baseline_value() -> None:
    before, after = summary(task="regression", metrics={"mae": 0.5}), summary(task="regression", metrics={"mae": 0.52})
    (result,) = check_metrics(after, before, budgets(metrics={"mae": {"max_relative_drop": 0.03}}))
    assert result.failed and "relative drop +4.00% breaks max_relative_drop 0.03" in result.detail
    (better,) = check_metrics(before, after, budgets(metrics={"mae": {"max_relative_drop": 0.03}}))
    assert better.status == "passed" and "relative drop -3.85%" in better.detail


def test_variant_metrics_are_held_to_the_same_per_metric_budgets() -> None:
    def with_int8(accuracy: float) -> object:
        return summary(
            variants={"int8": VariantSummary(status="passed", precision="int8", metrics={"accuracy": accuracy})}
        )

    before, after = with_int8(0.9), with_int8(0.88)
    (loose,) = check_variants(after, before, budgets(metrics={"accuracy": {"max_drop": 0.05}}))
    assert loose.status == "passed"
    (tight,) = check_variants(after, before, budgets(metrics={"accuracy": {"max_relative_drop": 0.01}}))
    assert tight.failed and tight.detail == (
        "gate passed in both; accuracy 0.9 -> 0.88: relative drop +2.22% breaks max_relative_drop 0.01 (1.00%)"
    )
    assert tight.figures["metrics"]["accuracy"]["broken"] == ["max_relative_drop"]


def test_a_negative_budget_flag_is_one_line_and_exit_2(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    result = invoke("check", str(base), "--baseline", str(base), "--max-latency-increase", "-0.1", *FAST)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "--max-latency-increase budgets.max_latency_increase: Input should be greater than or equal to 0" in (
        result.output
    )


@pytest.mark.parametrize("value", ["nan", "-inf", "-1"])
def test_a_budget_flag_that_is_not_a_number_at_least_0_is_exit_2(tmp_path: Path, value: str) -> None:
    base = imported(tmp_path, linear(), "base")
    for flag in ("--max-accuracy-drop", "--max-latency-increase", "--max-size-increase"):
        result = invoke("check", str(base), "--baseline", str(base), flag, value, *FAST)
        assert result.exit_code == 2 and result.output.count("\n") == 1 and flag in result.output, result.output


def test_a_report_path_that_is_not_a_regular_file_is_refused_not_replaced(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    fifo, target = tmp_path / "fifo", tmp_path / "target.txt"
    os.mkfifo(fifo)
    target.write_text("keep me")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dir").mkdir()
    # each flag once and each kind of path once: the three reports and the baseline go through one writer
    # (pipeline/core/fsutil.py:write_user_file), and each refused call is a whole check (9 pairs took 23 s)
    for flag, path in (("--json", fifo), ("--markdown", tmp_path / "link"), ("--junit", tmp_path / "dir")):
        result = invoke("check", str(base), "--baseline", str(base), flag, str(path), *FAST)
        assert result.exit_code == 2 and "is not a regular file" in result.output, (flag, path, result.output)
    written = invoke("check", str(base), "--write-baseline", str(tmp_path / "link"))
    assert written.exit_code == 2 and "is not a regular file" in written.output, written.output
    assert fifo.is_fifo() and (tmp_path / "link").is_symlink() and target.read_text() == "keep me"
    assert (
        invoke("check", str(base), "--baseline", str(base), "--json", str(tmp_path / "new.json"), *FAST).exit_code == 0
    )
