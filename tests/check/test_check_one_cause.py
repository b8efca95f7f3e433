"""A check report a reviewer can trust: one cause reported once, each side named, the loss judged."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.check.baseline import VariantSummary
from pipeline.check.checks import check_metrics, check_variants
from pipeline.recipe.budgets import BudgetSpec
from tests.check.check_models import FAST, imported, invoke, linear, summary


def variants(fp32: float, int8: float) -> dict[str, VariantSummary]:
    return {"fp32": VariantSummary(status="passed", precision="fp32", metrics={"accuracy": fp32}),
            "int8": VariantSummary(status="passed", precision="int8", metrics={"accuracy": int8})}  # fmt: skip


def test_a_model_drop_is_reported_once_not_again_on_every_variant_that_follows_it() -> None:
    base = summary(metrics={"accuracy": 0.9}, variants=variants(0.9, 0.89))
    worse = summary(metrics={"accuracy": 0.8}, variants=variants(0.8, 0.79))  # int8 still costs 0.01
    (metric,) = check_metrics(worse, base, BudgetSpec())
    assert metric.failed and metric.detail.startswith("accuracy 0.9 -> 0.8: drop +0.1 breaks max_accuracy_drop")
    rows = {r.name: r for r in check_variants(worse, base, BudgetSpec())}
    assert [r.status for r in rows.values()] == ["passed", "passed"], rows
    assert rows["variant.int8"].detail == (
        "gate passed in both; accuracy 0.89 -> 0.79 follows the model's own drop (reported once, by "
        "metric.accuracy); against its model.onnx it loses +0.01 (+0.01 in the baseline)"
    )


def test_a_variant_that_loses_more_against_its_own_model_still_fails() -> None:
    base = summary(metrics={"accuracy": 0.9}, variants=variants(0.9, 0.89))
    worse = summary(metrics={"accuracy": 0.8}, variants=variants(0.8, 0.70))  # int8 now costs 0.1
    rows = {r.name: r for r in check_variants(worse, base, BudgetSpec())}
    assert rows["variant.fp32"].status == "passed" and rows["variant.int8"].failed
    assert "loses +0.1 (+0.01 in the baseline, more than the 0.005 allowed)" in rows["variant.int8"].detail


def test_the_loss_is_judged_lower_is_better_by_a_relative_default() -> None:
    base = summary(metrics={"loss": 0.30})
    (held,) = check_metrics(summary(metrics={"loss": 0.31}), base, BudgetSpec())  # +3.3%
    (broke,) = check_metrics(summary(metrics={"loss": 0.33}), base, BudgetSpec())  # +10%
    (better,) = check_metrics(summary(metrics={"loss": 0.20}), base, BudgetSpec())
    assert held.status == "passed" and better.status == "passed" and broke.failed, (held, broke)
    assert "breaks the default relative budget for loss (the objective's scale) 0.05" in broke.detail


def test_the_report_names_each_side_by_path_and_version(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    result = invoke("check", str(base), "--baseline", str(base), "--markdown", str(tmp_path / "c.md"), "--json",
                    str(tmp_path / "c.json"), *FAST)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"candidate  {base} (base v1, an artifact)" in result.output
    assert f"baseline   {base} (base v1, an artifact)" in result.output
    markdown = (tmp_path / "c.md").read_text()
    assert f"- candidate: {base} (base v1, an artifact)" in markdown
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["candidate"]["path"] == str(base) and written["baseline"]["path"] == str(base)
    invoke("check", str(base), "--write-baseline", str(tmp_path / "b.json"))
    result = invoke("check", str(base), "--baseline", str(tmp_path / "b.json"), *FAST)
    assert f"baseline   {tmp_path / 'b.json'} (base v1, a baseline file)" in result.output
