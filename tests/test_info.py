"""`pipe info` on a model directory (every version, its stages and status) and on a bare .onnx file."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.records import CheckRecord, ExportRecord
from pipeline.artifact.variants import Variant
from pipeline.cli import main
from tests.conftest import build_artifact, train_record


def model_directory(root: Path) -> Path:
    """v1 trained only; v2 trained, exported, an opt and a failed int8 variant, a failed check; v3 tampered;
    v4 a run without a manifest yet."""
    model = root / "artifacts" / "toy"
    first = build_artifact(model / "1", version=1)
    first.manifest.stages.train = train_record({}, {})
    first.save()
    second = build_artifact(model / "2", version=2)
    m = second.manifest
    m.stages.train = train_record({}, {})
    m.stages.export = ExportRecord(exporter="dynamo", opset=18, requested_opset=18, external_data=False)
    m.variants["fp32"] = Variant(file="model.onnx", precision="fp32", format="onnx", stage="export")
    second.write_file("variants/model.opt.onnx", b"opt")
    m.variants["opt"] = Variant(file="variants/model.opt.onnx", precision="fp32", format="onnx", stage="optimize")
    m.variants["int8"] = Variant(
        file="variants/model.int8.onnx", precision="int8", format="onnx", stage="optimize", status="failed",
        reason="accuracy drop 0.04 > 0.01",
    )  # fmt: skip
    m.stages.check = CheckRecord(baseline="models/toy.baseline.json", passed=False, failures=["accuracy dropped 0.03"])
    second.save()
    third = build_artifact(model / "3", version=3)
    (third.root / "model.onnx").write_bytes(b"evil")
    (model / "4" / "checkpoint").mkdir(parents=True)
    return model


def test_info_on_a_model_directory_lists_every_version_with_its_stages(tmp_path: Path) -> None:
    model = model_directory(tmp_path)
    result = CliRunner().invoke(main, ["info", str(model)])
    out = result.output
    lines = out.splitlines()
    assert lines[0] == f"toy: 4 version(s) in {model}"
    v1 = next(i for i, line in enumerate(lines) if line.strip().startswith("v1 "))
    assert f"trained, not exported (next: pipe export {model / '1'})" in lines[v1]
    assert lines[v1 + 1].strip().startswith("stages: trained ")
    v2 = next(i for i, line in enumerate(lines) if line.strip().startswith("v2 "))
    assert "exported, check FAILED (accuracy dropped 0.03)" in lines[v2] and "accuracy=0.97" in lines[v2]
    assert "exported, variants int8 (failed), opt, check FAILED" in lines[v2 + 1]
    damaged = next(line for line in lines if line.strip().startswith("v3 "))
    assert "damaged: " in damaged and "model.onnx: size 4 bytes" in damaged  # why, on its one line
    assert "Traceback" not in out
    assert "v4" in out and "unfinished: no manifest.json" in out and "--resume" in out
    # a damaged version makes the whole answer exit 2, after the listing, naming it
    assert result.exit_code == 2
    assert "1 version(s) did not load: toy v3" in out


def test_info_on_a_healthy_model_directory_and_a_repository_exits_0(tmp_path: Path) -> None:
    model = model_directory(tmp_path)
    for version in ("3", "4"):
        for path in sorted((model / version).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (model / version).rmdir()
    by_model = CliRunner().invoke(main, ["info", str(model)])
    assert by_model.exit_code == 0, by_model.output
    assert "toy: 2 version(s)" in by_model.output
    build_artifact(model.parent / "other" / "1", name="other")
    repository = CliRunner().invoke(main, ["info", str(model.parent)])
    assert repository.exit_code == 0, repository.output
    assert "other: 1 version(s)" in repository.output and "toy: 2 version(s)" in repository.output


def test_info_on_a_version_still_shows_its_manifest(tmp_path: Path) -> None:
    model = model_directory(tmp_path)
    result = CliRunner().invoke(main, ["info", str(model / "2")])
    assert result.exit_code == 0, result.output
    assert "toy v2" in result.output and "FAILED (accuracy drop 0.04 > 0.01)" in result.output
    assert Artifact.load(model / "2").manifest.version == 2


def test_info_on_a_bare_onnx_file_points_to_pipe_import(tmp_path: Path) -> None:
    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(b"an onnx model made elsewhere")
    for args in (["info", str(onnx_file)], ["info", str(onnx_file), "--json"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (
            f"error: {onnx_file} is an ONNX model, not an artifact; make one from it with: "
            f"pipe import {onnx_file} --name NAME (then: pipe info artifacts/NAME)"
        )
