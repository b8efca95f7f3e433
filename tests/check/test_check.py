"""`pipe check`: a candidate artifact against a baseline, every check run, exit 0 / 1 / 2 and the reports."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from pipeline.artifact.tensors import TensorSpec
from pipeline.check.baseline import VariantSummary
from pipeline.check.checks import check_signature, check_size, check_variants
from pipeline.recipe.budgets import BudgetSpec
from tests.check.check_models import FAST, W, imported, invoke, linear, regressions, reports, summary


def test_the_same_model_against_itself_passes_every_check(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    result = invoke("check", str(base), "--baseline", str(base), "--json", str(tmp_path / "c.json"), *FAST)
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads((tmp_path / "c.json").read_text())["checks"]}
    assert {"metric.accuracy", "variant.fp32", "signature.inputs", "signature.outputs", "signature.labels", "size",
            "latency"} <= set(checks)  # fmt: skip
    assert all(c["status"] == "passed" for c in checks.values()), checks
    assert checks["metric.accuracy"]["figures"]["drop"] == 0.0


def test_perturbed_weights_that_lose_accuracy_fail_on_the_metric_with_its_numbers(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    worse = imported(tmp_path, linear(W + np.random.default_rng(1).normal(0, 2.0, W.shape).astype(np.float32)), "worse")
    result = invoke("check", str(worse), "--baseline", str(base), *reports(tmp_path), *FAST)
    assert result.exit_code == 1, result.output
    failed = regressions(result.output, tmp_path)
    assert set(failed) == {"metric.accuracy"}, failed  # variant.fp32 follows it: one cause, reported once
    assert failed["metric.accuracy"].startswith("accuracy 1 -> 0.7333: drop +0.2667 breaks max_accuracy_drop 0.005")
    assert "note: the candidate is 'worse', the baseline 'base'" in result.output
    # the budget flag overrides the default: a drop this size is allowed under --max-accuracy-drop 1
    assert invoke("check", str(worse), "--baseline", str(base), "--max-accuracy-drop", "1", *FAST).exit_code == 0


def test_a_renamed_input_is_a_breaking_change(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    renamed = imported(tmp_path, linear(name="features"), "renamed", input_name="features")
    result = invoke("check", str(renamed), "--baseline", str(base), *reports(tmp_path), *FAST)
    assert result.exit_code == 1, result.output
    failed = regressions(result.output, tmp_path)
    assert set(failed) == {"signature.inputs"}, failed
    assert failed["signature.inputs"] == (
        "input 'x' was renamed or removed (the candidate has ['features']); input 'features' is new and required"
    )
    assert re.search(r"^  latency +skipped +the two models cannot be timed on the same inputs", result.output, re.M)


def test_a_changed_input_dtype_is_a_breaking_change(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    doubled = imported(tmp_path, linear(dtype="double"), "doubled", dtype=np.float64)
    result = invoke("check", str(doubled), "--baseline", str(base), *FAST)
    assert result.exit_code == 1, result.output
    assert "input 'x' dtype changed float32 -> float64" in result.output


def test_a_baseline_json_round_trips_and_skips_latency_with_why(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    written = invoke("check", str(base), "--write-baseline", str(tmp_path / "models" / "base.baseline.json"))
    assert written.exit_code == 0, written.output
    saved = json.loads((tmp_path / "models" / "base.baseline.json").read_text())
    assert saved["format"] == "pipe-baseline/1" and saved["variants"]["fp32"]["status"] == "passed"
    assert saved["inputs"][0]["shape"] == ["N", 4] and saved["model_size"] > 0

    result = invoke("check", str(base), "--baseline", str(tmp_path / "models" / "base.baseline.json"),
                    "--json", str(tmp_path / "c.json"))  # fmt: skip
    assert result.exit_code == 0, result.output
    latency = next(c for c in json.loads((tmp_path / "c.json").read_text())["checks"] if c["name"] == "latency")
    assert latency["status"] == "skipped" and "JSON summary" in latency["detail"]


def test_junit_xml_has_one_testcase_per_check_and_names_each_failure(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    renamed = imported(tmp_path, linear(name="features"), "renamed", input_name="features")
    result = invoke("check", str(renamed), "--baseline", str(base), "--junit", str(tmp_path / "junit.xml"),
                    "--json", str(tmp_path / "c.json"), *FAST)  # fmt: skip
    assert result.exit_code == 1, result.output
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    checks = json.loads((tmp_path / "c.json").read_text())["checks"]
    cases = suite.findall("testcase")
    assert suite.tag == "testsuite" and suite.get("name") == "pipe check"
    assert [c.get("name") for c in cases] == [c["name"] for c in checks] and suite.get("tests") == str(len(checks))
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert "signature.inputs" in failed and suite.get("failures") == str(len(failed))
    assert "'x' was renamed or removed" in cases[[c.get("name") for c in cases].index("signature.inputs")].find(
        "failure"
    ).get("message")


def test_bad_baselines_are_one_line_and_exit_2(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "pipe-baseline/1", "name": "x"}))
    cases = {
        str(tmp_path / "missing"): "does not exist",
        str(tmp_path / "missing.json"): "write one with `pipe check ARTIFACT --write-baseline",
        str(tmp_path / "broken.json"): "is not valid JSON",
        str(tmp_path / "other.json"): "missing",
    }
    for baseline, message in cases.items():
        result = invoke("check", str(base), "--baseline", baseline, *FAST)
        assert result.exit_code == 2, (baseline, result.output)
        assert message in result.output and result.output.count("\n") == 1, result.output
    assert invoke("check", str(base), *FAST).exit_code == 2  # neither --baseline nor --write-baseline


def test_a_different_task_is_bad_input(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    saved = tmp_path / "base.json"
    assert invoke("check", str(base), "--write-baseline", str(saved)).exit_code == 0
    data = json.loads(saved.read_text())
    saved.write_text(json.dumps({**data, "task": "regression"}))
    result = invoke("check", str(base), "--baseline", str(saved), *FAST)
    assert result.exit_code == 2 and "is a classification model, the baseline" in result.output, result.output


def test_a_dynamic_axis_made_fixed_a_changed_rank_and_a_changed_label_set_are_breaking() -> None:
    fixed = summary(inputs=[TensorSpec("x", "float32", [1, 4])], outputs=[TensorSpec("y", "float32", ["batch", 3, 1])])
    results = {r.name: r for r in check_signature(fixed, summary())}
    assert results["signature.inputs"].failed and "axis 0 was dynamic ('batch') and is fixed at 1" in (
        results["signature.inputs"].detail
    )
    assert results["signature.outputs"].failed and "rank changed 2 -> 3" in results["signature.outputs"].detail
    relabelled = {r.name: r for r in check_signature(summary(labels=["a", "b", "d"]), summary())}
    assert (
        relabelled["signature.labels"].failed and "removed ['c'], added ['d']" in relabelled["signature.labels"].detail
    )
    relaxed = summary(inputs=[TensorSpec("x", "float32", ["batch", "features"])])  # fixed -> dynamic is compatible
    assert not any(r.failed for r in check_signature(relaxed, summary()))


def test_a_variant_that_passed_in_the_baseline_and_is_failed_stale_or_missing_now_is_a_regression() -> None:
    before = summary(
        variants={n: VariantSummary(status="passed", precision=n) for n in ("fp32", "int8", "fp16", "opt")}
    )
    now = summary(
        variants={
            "fp32": VariantSummary(status="passed", precision="fp32"),
            "int8": VariantSummary(status="failed", precision="int8"),
            "fp16": VariantSummary(status="stale", precision="fp16"),
        }
    )
    results = {r.name: r for r in check_variants(now, before, BudgetSpec())}
    assert [n for n, r in results.items() if r.failed] == ["variant.fp16", "variant.int8", "variant.opt"]
    assert results["variant.int8"].detail == "passed in the baseline, failed now"
    assert results["variant.fp16"].detail == "passed in the baseline, stale now"
    assert results["variant.opt"].detail == "passed in the baseline, missing now"
    # a variant that had already failed in the baseline is no regression
    was_failed = summary(variants={"int8": VariantSummary(status="failed", precision="int8")})
    assert [r.status for r in check_variants(summary(variants={}), was_failed, BudgetSpec())] == ["skipped"]


def test_size_grows_past_its_budget() -> None:
    assert check_size(summary(model_size=1100), summary(), BudgetSpec()).status == "passed"  # x1.100: on the line
    grown = check_size(summary(model_size=1200), summary(), BudgetSpec())
    assert grown.failed and "1000 -> 1200 bytes: x1.200 (budget x1.100)" in grown.detail
