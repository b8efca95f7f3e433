"""`pipe benchmark`: every format of a real artifact timed side by side, reported, recorded, and kept up to date.

One small MLP is trained on the bundled digits by `pipe run` (train, export, dynamic int8, a TFLite
fp32 model: about 20 s) and shared by the tests that only read it; the tests that change an
artifact work on a copy, or on a linear model `pipe import`ed from ONNX text. No test asserts
milliseconds: the machine is shared. Each timing runs 0.05 s per row and batch.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
import yaml
from click.testing import CliRunner, Result

from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import Variant
from pipeline.benchmark.stage import benchmark_artifact, benchmark_fresh
from pipeline.cli import main
from pipeline.core.fsutil import sha256_file
from tests.conftest import LINEAR, build_artifact

FAST = ["--seconds", "0.05"]
TINY = {
    "name": "bench-tiny",
    "model": {"arch": "mlp", "hidden": [32]},
    "data": {"source": "digits"},
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.01},
    "optimize": {"quantize": ["dynamic"], "graph": "none"},
    "edge": {"precisions": ["fp32"]},  # one TFLite model: conversion costs seconds per precision
}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained, exported, optimized and edge-converted artifact; copy it before changing it."""
    tmp = tmp_path_factory.mktemp("bench")
    recipe = tmp / "bench-tiny.yaml"
    recipe.write_text(yaml.safe_dump(TINY))
    result = invoke("run", str(recipe), "--out", str(tmp / "artifacts"))
    assert result.exit_code == 0, result.output
    return tmp / "artifacts" / "bench-tiny" / "1"


def copy_of(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "artifacts" / root.parent.name / root.name
    shutil.copytree(root, target)
    return target


def imported(tmp_path: Path) -> Path:
    """A linear classifier made by `pipe import` with evaluation data: no torch, no edge model."""
    source = tmp_path / "linear.onnx"
    onnx.save(onnx.parser.parse_model(LINEAR), source)
    x = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, target=np.zeros(40, dtype=np.int64))
    repo = tmp_path / "artifacts"
    result = invoke("import", str(source), "--name", "linear", "--eval-data", str(tmp_path / "eval.npz"),
                    "--labels", "a,b,c", "--repository", str(repo))  # fmt: skip
    assert result.exit_code == 0, result.output
    return repo / "linear" / "1"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_every_format_of_a_trained_artifact_is_timed_side_by_side_and_recorded(trained: Path, tmp_path: Path) -> None:
    root = copy_of(trained, tmp_path)
    result = invoke("benchmark", str(root), *FAST, "--json", str(tmp_path / "copy.json"))
    assert result.exit_code == 0, result.output
    for name in ("torch", "fp32", "int8-dynamic", "tflite-fp32"):
        assert name in result.output  # the table on the terminal

    report = json.loads((root / "reports" / "benchmark.json").read_text())
    assert json.loads((tmp_path / "copy.json").read_text()) == report
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["torch", "fp32", "int8-dynamic", "tflite-fp32"]
    assert {rows[n]["runtime"] for n in rows} == {"torch", "onnxruntime", "litert"}
    manifest = Artifact.load(root).manifest  # the report and plot are listed, and verify
    for row in rows.values():
        assert row["timed"] and row["not_timed"] == "", row
        assert 0 < row["p50_ms"] <= row["p95_ms"] and row["latency_batch"] == 1
        assert row["throughput"] > 0 and row["throughput_batch"] == 32
        assert row["size_bytes"] == manifest.files[row["file"]].size > 0
        assert row["metric"] is not None and row["drop"] is not None
    assert rows["torch"]["metric"] == manifest.metrics["accuracy"]  # the trained model's test metric
    assert rows["torch"]["file"] == manifest.stages.train.checkpoint.weights
    assert rows["fp32"]["drop"] == 0.0
    int8 = manifest.variants["int8-dynamic"].metrics["accuracy"]
    assert rows["int8-dynamic"]["drop"] == pytest.approx(manifest.variants["fp32"].metrics["accuracy"] - int8)
    assert report["settings"] == {"seconds": 0.05, "threads": 1, "batch": 1, "throughput_batch": 32}
    assert report["machine"]["cpu_count"] and report["machine"]["onnxruntime"] and report["machine"]["torch"]

    record = manifest.stages.benchmark
    assert record is not None and record.formats == list(rows) and record.failed == []
    timed = ["checkpoint/model.safetensors", "model.onnx", "variants/model.int8-dynamic.onnx",
             "edge/model.fp32.tflite", "golden.npz"]  # fmt: skip
    assert record.inputs == {path: sha256_file(root / path) for path in sorted(timed)}
    assert {"reports/benchmark.json", "reports/benchmark.png"} <= set(manifest.files)
    width, height = png_size(root / "reports" / "benchmark.png")
    assert 600 <= width <= 2000 and 400 <= height <= 1500
    assert not list(root.glob(".benchmark-*"))  # the scratch directory is gone


def test_a_second_call_is_up_to_date_until_a_variant_changes(trained: Path, tmp_path: Path) -> None:
    root = copy_of(trained, tmp_path)
    benchmark_artifact(root, {"seconds": 0.05}, progress=lambda _: None, plot=False)
    reason = benchmark_fresh(root)
    assert reason is not None and "4 models" in reason

    # the int8 variant made again with other settings: another file, so the benchmark is stale
    before = sha256_file(root / "variants" / "model.int8-dynamic.onnx")
    remade = invoke("optimize", str(root), "--quantize", "dynamic", "--graph", "none", "--reduce-range")
    assert remade.exit_code == 0, remade.output
    assert sha256_file(root / "variants" / "model.int8-dynamic.onnx") != before
    assert benchmark_fresh(root) is None

    benchmark_artifact(root, {"seconds": 0.05}, progress=lambda _: None, plot=False)
    assert benchmark_fresh(root) is not None
    remade = invoke("optimize", str(root), "--quantize", "dynamic", "--quantize", "fp16", "--graph", "none")
    assert remade.exit_code == 0, remade.output
    assert benchmark_fresh(root) is None  # one row more to time


def test_an_imported_model_has_no_torch_row_and_says_so(tmp_path: Path) -> None:
    root = imported(tmp_path)
    result = invoke("benchmark", str(root), *FAST, "--no-plot")
    assert result.exit_code == 0, result.output
    assert "no torch row" in result.output and "imported" in result.output
    report = json.loads((root / "reports" / "benchmark.json").read_text())
    assert [row["name"] for row in report["rows"]] == ["fp32"]
    manifest = Artifact.load(root).manifest
    assert "reports/benchmark.png" not in manifest.files and manifest.stages.benchmark.plot is None


def test_a_stale_variant_is_timed_and_marked_and_one_that_cannot_run_is_named(tmp_path: Path) -> None:
    root = imported(tmp_path)
    artifact = Artifact.load(root)
    (root / "variants").mkdir()
    shutil.copy(root / "model.onnx", root / "variants" / "model.old.onnx")  # made from a model.onnx since replaced
    artifact.add_variant("old", Variant(file="variants/model.old.onnx", precision="fp32", format="onnx",
                                        stage="optimize", parent="0" * 64))  # fmt: skip
    other = onnx.parser.parse_model(LINEAR.replace("x)", "z)").replace("(x, W)", "(z, W)"))
    onnx.save(other, root / "variants" / "model.other.onnx")  # takes an input golden.npz does not hold
    parent = artifact.manifest.files["model.onnx"].sha256
    artifact.add_variant("other", Variant(file="variants/model.other.onnx", precision="fp32", format="onnx",
                                          stage="optimize", parent=parent))  # fmt: skip
    artifact.save()

    outcome = benchmark_artifact(root, {"seconds": 0.05}, progress=lambda _: None)
    results = {r.row.name: r for r in outcome.results}
    assert results["old"].row.status == "stale" and "stale" in results["old"].row.reason
    assert results["old"].latency is not None  # timed, and marked: not servable
    assert results["other"].latency is None and "input(s) ['z']" in results["other"].not_timed
    assert results["fp32"].latency is not None
    record = Artifact.load(root).manifest.stages.benchmark
    assert record.formats == ["fp32", "old", "other"] and record.failed == ["other"]
    report = json.loads((root / "reports" / "benchmark.json").read_text())
    assert report["not_timed"] == ["other"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "0"], "--threads 0 must be >= 1"),
        (["--seconds", "0"], "--seconds 0 must be > 0"),
    ],
)
def test_bad_settings_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    root = imported(tmp_path)
    result = invoke("benchmark", str(root), *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and "reports/benchmark.json" not in Artifact.load(root).manifest.files


def test_not_an_artifact_or_no_model_onnx_yet_exit_2(tmp_path: Path) -> None:
    missing = invoke("benchmark", str(tmp_path / "nowhere"))
    assert missing.exit_code == 2 and "does not exist" in missing.output, missing.output
    (tmp_path / "empty").mkdir()
    empty = invoke("benchmark", str(tmp_path / "empty"))
    assert empty.exit_code == 2 and "holds no artifact" in empty.output, empty.output

    toy = build_artifact(tmp_path / "artifacts" / "toy" / "1")  # trained, not exported: no model.onnx
    toy.remove_file("model.onnx")
    toy.save()
    result = invoke("benchmark", str(toy.root))
    assert result.exit_code == 2 and "no model.onnx yet" in result.output and "pipe export" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_json_copy_that_cannot_be_written_exits_2_and_keeps_the_report(tmp_path: Path) -> None:
    root = imported(tmp_path)
    (tmp_path / "file").write_text("")  # a file where the copy's directory would be
    result = invoke("benchmark", str(root), *FAST, "--no-plot", "--json", str(tmp_path / "file" / "dir.json"))
    assert result.exit_code == 2 and "--json" in result.output and "cannot write it" in result.output, result.output
    assert "reports/benchmark.json" in Artifact.load(root).manifest.files
