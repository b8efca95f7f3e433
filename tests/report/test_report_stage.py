"""`pipe report`: the card and curves written into the artifact, listed and verified; remade only when stale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifact.directory import Artifact
from pipeline.check.baseline import write_baseline
from pipeline.check.stage import check_stage
from pipeline.report.card import CARD_MD
from pipeline.report.curves import CURVES_PNG
from pipeline.report.markdown import number
from pipeline.report.stage import report_artifact, report_fresh
from tests.report.conftest import invoke


@pytest.mark.slow
def test_the_card_of_a_trained_artifact_names_what_the_artifact_holds(trained: Path) -> None:
    result = invoke("report", trained)
    assert result.exit_code == 0, result.output
    assert f"card: {trained / CARD_MD}" in result.output and f"curves: {trained / CURVES_PNG}" in result.output

    artifact = Artifact.load(trained)  # verifies every listed file, the card and the curves among them
    m = artifact.manifest
    assert {CARD_MD, CURVES_PNG} <= set(m.files)
    assert m.stages.report is not None and (m.stages.report.card, m.stages.report.curves) == (CARD_MD, CURVES_PNG)
    card = (trained / CARD_MD).read_text()
    train = m.stages.train
    assert "# rep-tiny v1: model card" in card
    assert "a tiny MLP \\| for the report tests" in card  # the recipe's description, its pipe escaped
    assert f"| accuracy | {number(m.metrics['accuracy'])} |" in card  # the test metric as recorded
    assert f"Kept the weights of epoch {train.best_epoch} " in card and f"of {train.epochs_run} run" in card
    assert f"train {train.splits['train']}, val {train.splits['val']}, test {train.splits['test']}" in card
    assert f"| `{m.lineage.dataset_fingerprint}` |" in card
    assert "| input | `input` | float32 | [batch, 64] | NC |" in card
    assert "| `fp32` | `model.onnx` | fp32 | onnx | passed |" in card
    assert "![training curves](training-curves.png)" in card
    # the request examples carry the real input name, shape and datatype, and one real sample
    request = json.loads(card.split("-d '", 1)[1].split("'", 1)[0])
    assert [(i["name"], i["shape"], i["datatype"]) for i in request["inputs"]] == [("input", [1, 64], "FP32")]
    assert len(request["inputs"][0]["data"]) == 64
    assert f"pipe serve {trained.resolve()}" in card and "/v1/models/rep-tiny/versions/1:predict" in card
    # the check budgets are the recipe's, as the file says now
    assert (
        "| metric `accuracy` | drops by more than 0.02 |" in card and "| size | more than x1.3 the baseline's |" in card
    )
    assert "No edge models" in card and "No benchmark recorded" in card


@pytest.mark.slow
def test_the_card_is_remade_only_when_what_it_shows_changed(trained: Path) -> None:
    assert report_fresh(trained) is None  # never made
    first = report_artifact(trained, progress=lambda _: None)
    assert "was made from this manifest" in (report_fresh(trained) or "")
    made = (trained / CARD_MD).stat().st_mtime_ns, first.artifact.manifest.stages.report.finished

    # a stage that ran again (its record's time and settings change, even to the same model.onnx) makes it stale
    exported = invoke("export", trained, "--atol", "2e-4")
    assert exported.exit_code == 0, exported.output
    assert report_fresh(trained) is None
    report_artifact(trained, progress=lambda _: None)
    assert report_fresh(trained) is not None
    assert (trained / CARD_MD).stat().st_mtime_ns != made[0]
    assert "0.0002·scale + 0.001·\\|ref\\|" in (trained / CARD_MD).read_text()  # the re-export's tolerance is shown

    # editing the recipe changes the budgets the card shows
    recipe = trained.parents[2] / "rep-tiny.yaml"
    recipe.write_text(recipe.read_text().replace("max_size_increase: 0.3", "max_size_increase: 0.4"))
    assert report_fresh(trained) is None
    report_artifact(trained, progress=lambda _: None)
    assert "| size | more than x1.4 the baseline's |" in (trained / CARD_MD).read_text()

    # a card edited by hand is not up to date (and the artifact no longer verifies until it is remade)
    (trained / CARD_MD).write_text("edited")
    assert report_fresh(trained) is None
    report_artifact(trained, progress=lambda _: None)
    Artifact.load(trained)


def test_an_imported_artifact_gets_a_card_without_curves_and_a_new_variant_makes_it_stale(imported: Path) -> None:
    result = invoke("report", imported)
    assert result.exit_code == 0, result.output
    assert "curves: none" in result.output and "imported model: it was not trained here" in result.output
    artifact = Artifact.load(imported)
    assert CARD_MD in artifact.manifest.files and CURVES_PNG not in artifact.manifest.files
    assert artifact.manifest.stages.report.curves is None and not (imported / CURVES_PNG).exists()
    card = (imported / CARD_MD).read_text()
    assert "No training curves: imported model" in card and "![training curves]" not in card
    assert "`golden.npz` holds 60 evaluation samples, from eval-data inputs" in card
    assert "| producer | handwritten |" in card and "| ONNX IR version, opset | 8, 18 |" in card
    assert "budgets: the defaults: an imported model has no recipe" in card
    assert report_fresh(imported) is not None

    optimized = invoke("optimize", imported, "--quantize", "dynamic", "--graph", "none")
    assert optimized.exit_code == 0, optimized.output
    assert report_fresh(imported) is None  # a new variant: the card no longer shows everything
    assert invoke("report", imported).exit_code == 0
    card = (imported / CARD_MD).read_text()
    assert "| `int8-dynamic` | `variants/model.int8-dynamic.onnx` | int8 | onnx | passed |" in card
    assert "metric drop <= 0.01 (against model.onnx)" in card
    assert report_fresh(imported) is not None
    Artifact.load(imported)


def test_the_card_states_the_kept_check_verdict_and_goes_stale_when_it_changes(tmp_path: Path, imported: Path) -> None:
    report_artifact(imported, progress=lambda _: None)
    assert "Checked against" not in (imported / CARD_MD).read_text()  # no verdict kept: nothing said
    baseline = tmp_path / "linear.baseline.json"
    write_baseline(Artifact.load(imported), baseline)
    run = check_stage(imported, baseline, latency_seconds=0.05).run
    assert not run.failures
    assert report_fresh(imported) is None  # the verdict is in the manifest the card digests
    report_artifact(imported, progress=lambda _: None)
    card = (imported / CARD_MD).read_text()
    assert f"Checked against `{baseline}`: all {len(run.results)} checks held (reports/check.md)." in card

    # a failed verdict names its checks, escaped as every cell and span of the card is
    artifact = Artifact.load(imported, verify=False)
    record = artifact.manifest.stages.check
    record.passed, record.failures = False, ["metric `accuracy`", "size | model.onnx"]
    artifact.save()
    assert report_fresh(imported) is None
    report_artifact(imported, progress=lambda _: None)
    card = (imported / CARD_MD).read_text()
    assert (
        f"Checked against `{baseline}`: 2 of {len(run.results)} checks failed: `metric 'accuracy'`, "
        "`size | model.onnx` (reports/check.md)." in card
    )


def test_bad_input_is_exit_2_with_the_reason_and_no_traceback(tmp_path: Path, imported: Path) -> None:
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text("{not json")
    tampered = imported
    (tampered / "golden.npz").write_bytes(b"not the golden file")
    cases = {
        tmp_path / "missing": "does not exist",
        tmp_path: "holds no artifact",
        broken: "not valid JSON",
        tampered: "golden.npz: size",
    }
    for path, message in cases.items():
        result = invoke("report", path)
        assert result.exit_code == 2, (path, result.output)
        assert message in result.output and "Traceback" not in result.output, result.output
        assert result.output.startswith("error: ")
    assert not (tampered / CARD_MD).exists()  # nothing written into an artifact that does not verify


@pytest.mark.slow
def test_the_card_of_a_classifier_shows_use_and_limits_per_class_figures_and_the_test_splits_step(
    trained: Path,
) -> None:
    result = invoke("report", trained)
    assert result.exit_code == 0, result.output
    card = (trained / CARD_MD).read_text()
    m = Artifact.load(trained).manifest
    test = m.stages.train.splits["test"]
    assert "## Intended use and limits" in card and "Intended use: a tiny MLP \\| for the report tests." in card
    assert f"| accuracy | {number(m.metrics['accuracy'])} | fraction |" in card
    assert f"one sample moves accuracy by 1/{test} = {1 / test:.4f}" in card
    p = m.metrics["accuracy"]
    assert f"its standard error is ±{(p * (1 - p) / test) ** 0.5:.4f} (binomial)" in card
    assert "single samples decide it" not in card  # the recipe's budget, 0.02, is five samples and more
    assert f"Per class on `golden.npz` ({test} samples):" in card and "| class | precision | recall | support |" in card
    assert "Confusion matrix (rows: true class, columns: predicted):" in card
    matrix = card.split("| true / predicted |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert len(matrix) == 10 and sum(int(c) for row in matrix for c in row.split("|")[2:-1]) == test
