"""`pipe run`: the whole chain on bundled data, and nothing redone when nothing changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact, versions
from pipeline.cli import main

TINY = {
    "name": "run-tiny",
    "model": {"arch": "mlp", "hidden": [32]},
    "data": {"source": "digits"},
    "train": {"epochs": 3, "batch_size": 64, "lr": 0.01},
    "edge": {"enabled": False},  # TFLite conversion has its own tests (tests/edge); it costs seconds a run
    "benchmark": {"seconds": 0.2},
}


def first_run(tmp_path: Path) -> tuple[Path, Path, str]:
    """`pipe run` on the tiny recipe in a fresh repository: (recipe, repository, output)."""
    recipe = tmp_path / "run-tiny.yaml"
    recipe.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "artifacts"
    first = CliRunner().invoke(main, ["run", str(recipe), "--out", str(out)])
    assert first.exit_code == 0, first.output
    return recipe, out, first.output


@pytest.mark.slow
def test_run_trains_exports_then_skips_what_is_up_to_date(tmp_path: Path) -> None:
    recipe, out, output = first_run(tmp_path)
    runner = CliRunner()
    assert "[train] done" in output and "[export] done" in output
    artifact = Artifact.load(out / "run-tiny" / "1")
    assert "model.onnx" in artifact.manifest.files and artifact.manifest.stages.export is not None
    assert artifact.manifest.variants["fp32"].passed and artifact.manifest.variants["fp32"].stage == "export"
    assert artifact.manifest.metrics["accuracy"] > 0.8

    again = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "[train] up to date" in again.output and "[export] up to date" in again.output
    assert versions(out / "run-tiny") == [1]

    forced = runner.invoke(main, ["run", str(recipe), "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "[edge] skipped: edge.enabled: false" in forced.output  # the recipe's off switch holds under --force
    assert versions(out / "run-tiny") == [1, 2]

    recipe.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "epochs": 2}}))
    changed = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert changed.exit_code == 0, changed.output
    assert "[train] done" in changed.output
    assert versions(out / "run-tiny") == [1, 2, 3]


@pytest.mark.slow
def test_editing_only_the_export_section_re_exports_without_training(tmp_path: Path) -> None:
    recipe, out, _ = first_run(tmp_path)
    runner = CliRunner()
    weights = (out / "run-tiny" / "1" / "checkpoint" / "model.safetensors").read_bytes()

    recipe.write_text(yaml.safe_dump({**TINY, "export": {"atol": 2e-4}}))
    second = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert second.exit_code == 0, second.output
    assert "[train] up to date" in second.output and "[export] done" in second.output
    assert versions(out / "run-tiny") == [1]  # no new version
    assert (out / "run-tiny" / "1" / "checkpoint" / "model.safetensors").read_bytes() == weights  # no training
    manifest = Artifact.load(out / "run-tiny" / "1").manifest
    assert manifest.stages.export.settings["atol"] == 2e-4  # read from the recipe as it is now
    assert manifest.variants["fp32"].passed

    third = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert "[train] up to date" in third.output and "[export] up to date" in third.output


def test_a_version_trained_with_an_epochs_override_is_not_up_to_date(tmp_path: Path) -> None:
    from pipeline.recipe.file import load_recipe
    from pipeline.train.stage import up_to_date_version

    recipe = tmp_path / "run-tiny.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "epochs": 2}}))
    out = tmp_path / "artifacts"
    short = CliRunner().invoke(main, ["train", str(recipe), "--out", str(out), "--epochs", "1", "--quiet"])
    assert short.exit_code == 0, short.output
    assert up_to_date_version(load_recipe(recipe), out) is None  # same file digest, but 1 epoch of 2
    full = CliRunner().invoke(main, ["train", str(recipe), "--out", str(out), "--quiet"])
    assert full.exit_code == 0, full.output
    assert up_to_date_version(load_recipe(recipe), out) == out / "run-tiny" / "2"


def test_run_on_a_bad_recipe_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "model": {"arch": "mlp", "widths": [3]}}))
    result = CliRunner().invoke(main, ["run", str(recipe), "--out", str(tmp_path / "artifacts")])
    assert result.exit_code == 2
    assert "model.widths: unknown key" in result.output
    assert not (tmp_path / "artifacts").exists()


def test_a_damaged_older_version_is_not_up_to_date_and_does_not_stop_the_run(tmp_path: Path) -> None:
    from pipeline.recipe.file import load_recipe
    from pipeline.train.stage import up_to_date_version

    recipe = tmp_path / "run-tiny.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "epochs": 1}}))
    out = tmp_path / "artifacts"
    assert CliRunner().invoke(main, ["train", str(recipe), "--out", str(out), "--quiet"]).exit_code == 0
    (out / "run-tiny" / "1" / "manifest.json").write_text('{"name": ')  # broken by hand
    assert up_to_date_version(load_recipe(recipe), out) is None
    assert CliRunner().invoke(main, ["train", str(recipe), "--out", str(out), "--quiet"]).exit_code == 0
    assert up_to_date_version(load_recipe(recipe), out) == out / "run-tiny" / "2"


@pytest.mark.slow
def test_run_gates_on_the_committed_baseline_and_fails_a_regressed_model_after_the_other_stages(
    tmp_path: Path,
) -> None:
    recipe, out, output = first_run(tmp_path)
    runner = CliRunner()
    baseline = tmp_path / "run-tiny.baseline.json"  # where a repository commits it: beside the recipe
    assert f"[check] skipped: no baseline committed at {baseline}" in output
    assert "[benchmark] done" in output and "[report] done" in output
    assert "pipe run: run-tiny v1" in output and "reports/model-card.md" in output  # the summary at the end

    written = runner.invoke(main, ["check", str(out / "run-tiny" / "1"), "--write-baseline", str(baseline)])
    assert written.exit_code == 0, written.output
    gated = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert gated.exit_code == 0, gated.output
    assert "[check] done" in gated.output and "[benchmark] up to date" in gated.output
    record = Artifact.load(out / "run-tiny" / "1").manifest.stages.check
    assert record is not None and record.passed and not record.failures
    again = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert again.exit_code == 0, again.output
    for stage in ("train", "export", "optimize", "check", "benchmark", "report"):
        assert f"[{stage}] up to date" in again.output, again.output

    # One epoch at a tenth of the learning rate: a worse model, a new version, the gate fails the run.
    recipe.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "epochs": 1, "lr": 0.001}}))
    regressed = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert regressed.exit_code == 1, regressed.output
    assert "[check] failed" in regressed.output and "metric.accuracy" in regressed.output
    assert "[benchmark] done" in regressed.output and "[report] done" in regressed.output  # ran after it
    assert "check failed for" in regressed.output
    worse = Artifact.load(out / "run-tiny" / "2")
    assert "metric.accuracy" in worse.manifest.stages.check.failures
    assert "metric.accuracy" in (worse.root / "reports" / "check.md").read_text()
    again = runner.invoke(main, ["run", str(recipe), "--out", str(out)])
    assert again.exit_code == 1 and "[check] failed" in again.output  # a failed verdict is never up to date
