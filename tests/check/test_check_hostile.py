"""`pipe check` on hostile and unusual input: a verdict, exit 0/1/2 and reports CI tools can read, never a traceback."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.check.baseline import VariantSummary
from pipeline.check.checks import CheckResult, check_variants
from pipeline.check.reports import to_json, to_junit, to_markdown
from pipeline.check.verdict import CheckRun
from pipeline.recipe.budgets import BudgetSpec
from tests.check.check_models import FAST, B, W, imported, invoke, linear, summary


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _fixed_batch(tmp_path: Path, batch: int) -> Path:
    """The linear classifier with its batch axis fixed at `batch`, imported with `batch` evaluation samples."""
    model = linear()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    name = f"fixed{batch}"
    onnx.save(model, tmp_path / f"{name}.onnx")
    x = np.random.default_rng(0).standard_normal((batch, 4)).astype(np.float32)
    np.savez(tmp_path / f"{name}.npz", x=x, target=(x @ W + B).argmax(1))
    result = invoke(
        "import", str(tmp_path / f"{name}.onnx"), "--name", name, "--eval-data", str(tmp_path / f"{name}.npz"),
        "--labels", "a,b,c", "--repository", str(tmp_path / "artifacts"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp_path / "artifacts" / name / "1"


def test_a_fixed_batch_that_changed_size_is_a_regression_not_bad_input(tmp_path: Path) -> None:
    one, eight = _fixed_batch(tmp_path, 1), _fixed_batch(tmp_path, 8)
    result = invoke("check", str(eight), "--baseline", str(one), "--json", str(tmp_path / "c.json"), *FAST)
    assert result.exit_code == 1, result.output
    checks = {c["name"]: c for c in json.loads((tmp_path / "c.json").read_text())["checks"]}
    assert "axis 0 changed size 1 -> 8" in checks["signature.inputs"]["detail"]
    assert checks["latency"]["status"] == "skipped", checks["latency"]
    assert "cannot be timed on the same inputs" in checks["latency"]["detail"]


def _run(results: list[CheckResult], budgets: BudgetSpec | None = None) -> CheckRun:
    return CheckRun(summary(), summary(), budgets or BudgetSpec(), results, [])


def test_junit_stays_well_formed_xml_when_a_name_or_detail_holds_control_characters() -> None:
    run = _run([
        CheckResult("metric.f1\x07", "skipped", "f1\x07: no known direction"),
        CheckResult("signature.inputs", "failed", "input 'x' dtype changed float32\x1b[0m -> float16\x00"),
        CheckResult("size", "passed", "ok\x0b"),
    ])  # fmt: skip
    suite = ET.fromstring(to_junit(run).encode())
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["metric.f1\\x07", "signature.inputs", "size"]
    assert cases[1].find("failure").get("message") == "input 'x' dtype changed float32\\x1b[0m -> float16\\x00"
    assert cases[2].find("system-out").text == "ok\\x0b"


def test_markdown_table_keeps_its_columns_when_a_check_name_holds_a_pipe_or_a_backtick() -> None:
    run = _run([CheckResult("metric.f1|macro", "skipped", "why"), CheckResult("variant.a`b", "passed", "fine")])
    rows = [line for line in to_markdown(run).splitlines() if line.startswith("| ")][2:]
    for row in rows:  # four unescaped pipes: three columns
        assert row.replace("\\|", "").count("|") == 4, row
    assert "metric.f1\\|macro" in rows[0] and "``variant.a`b``" in rows[1]


def test_the_json_report_is_strict_json_with_an_infinite_budget_or_an_overflowed_drop() -> None:
    from pipeline.check.checks import check_metrics

    budgets = BudgetSpec(max_accuracy_drop=math.inf)  # `--max-accuracy-drop inf`: do not gate the metric
    before, after = (
        summary(task="regression", metrics={"mae": -1e308}),
        summary(task="regression", metrics={"mae": 1e308}),
    )
    run = CheckRun(after, before, budgets, check_metrics(after, before, budgets), [])
    data = _strict_json(to_json(run))
    assert data["budgets"]["max_accuracy_drop"] is None and data["checks"][0]["figures"]["drop"] is None


def test_a_variant_that_lost_a_metric_the_baseline_judged_it_by_fails() -> None:
    before = summary(variants={"int8": VariantSummary(status="passed", precision="int8", metrics={"accuracy": 0.9})})
    now = summary(variants={"int8": VariantSummary(status="passed", precision="int8", metrics={})})
    (result,) = check_variants(now, before, BudgetSpec())
    assert result.failed and "accuracy is 0.9 in the baseline; the candidate's variant has none" in result.detail


@pytest.fixture
def base(tmp_path: Path) -> tuple[Path, dict]:
    artifact = imported(tmp_path, linear(), "base")
    saved = tmp_path / "b.json"
    assert invoke("check", str(artifact), "--write-baseline", str(saved)).exit_code == 0
    return artifact, json.loads(saved.read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metrics": {"accuracy": 1.0, "f1\x1b[32m": 0.5}}, "metrics: key 'f1\\x1b[32m' holds a control character"),
        ({"labels": ["a", "b\ud800", "c"]}, "labels[1]: 'b\\ud800' holds a lone surrogate"),
        ({"name": "base\nfake heading"}, "name: 'base\\nfake heading' holds a control character"),
        ({"model_size": -1}, "model_size: expected a positive number of bytes, got -1"),
    ],
)
def test_a_hand_edited_baseline_with_unprintable_text_or_a_negative_size_is_exit_2(
    tmp_path: Path, base: tuple[Path, dict], change: dict, message: str
) -> None:
    artifact, data = base
    (tmp_path / "b.json").write_text(json.dumps({**data, **change}))
    result = invoke("check", str(artifact), "--baseline", str(tmp_path / "b.json"), *FAST)
    assert result.exit_code == 2, (result.output, result.exception)
    assert message in result.output and result.output.count("\n") == 1, result.output


def test_a_report_or_baseline_path_that_cannot_be_written_is_exit_2_naming_the_flag(
    tmp_path: Path, base: tuple[Path, dict]
) -> None:
    artifact, _ = base
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    cases = (
        ("--junit", tmp_path / "folder", "it exists and is not a regular file"),
        ("--markdown", tmp_path / "file" / "c.md", "cannot write it"),
    )
    for flag, path, why in cases:
        result = invoke("check", str(artifact), "--baseline", str(artifact), flag, str(path), *FAST)
        assert result.exit_code == 2, (result.output, result.exception)
        assert f"error: {flag} {path}: {why}" in result.output, result.output
    result = invoke("check", str(artifact), "--write-baseline", str(tmp_path / "folder"))
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"error: --write-baseline {tmp_path / 'folder'}: it exists and is not" in result.output, result.output


def test_a_latency_window_of_zero_seconds_is_bad_input_not_a_skipped_latency_check(
    tmp_path: Path, base: tuple[Path, dict]
) -> None:
    artifact, _ = base
    result = invoke("check", str(artifact), "--baseline", str(artifact), "--latency-seconds", "0")
    assert result.exit_code == 2, result.output
    assert "--latency-seconds" in result.output and "latency  " not in result.output, result.output


def test_html_in_a_label_is_text_in_the_markdown_report() -> None:
    from pipeline.check.checks import check_signature
    from pipeline.check.reports import to_markdown
    from pipeline.check.verdict import CheckRun
    from pipeline.recipe.budgets import BudgetSpec

    before = summary()
    after = summary(labels=["a", "b", "<img src=x onerror=alert(1)>"])
    run = CheckRun(after, before, BudgetSpec(), check_signature(after, before), [])
    markdown = to_markdown(run)
    assert "<img" not in markdown and "&lt;img src=x onerror=alert(1)>" in markdown, markdown
