"""`pipe export --target edge` on the models people put on devices (issue 18): a YOLOv8-layout detector with free
axes and Ultralytics metadata, a PaddleOCR-like classifier declaring [-1, 3, ?, ?], a regression model answering
around 1e5. Each is converted once per module and read by several tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.cli import main
from pipeline.edge.attempts import ULTRALYTICS
from pipeline.edge.device import device_python
from tests.export.real_models import SIZES, colour_detector, paddle_classifier, shapes_picture

pytestmark = pytest.mark.slow  # onnx2tf converts in a subprocess: seconds to a minute per model


def imported(tmp: Path, model: Path, name: str, eval_data: Path, *flags: str) -> Path:
    repo = tmp / "artifacts"
    result = CliRunner().invoke(main, ["import", str(model), "--name", name, "--eval-data", str(eval_data),
                                       "--repository", str(repo), *flags])  # fmt: skip
    assert result.exit_code == 0, result.output
    return repo / name / "1"


def edge(root: Path, *flags: str) -> tuple[Result, Manifest]:
    result = CliRunner().invoke(main, ["export", str(root), "--target", "edge", *flags])
    return result, Artifact.load(root).manifest


def on_device_runtime(manifest: Manifest, name: str) -> bool | None:
    """Whether the variant ran on tflite-runtime 2.14; None when the device-like environment is not built."""
    if device_python() is None:
        return None
    runtimes = manifest.variants[name].edge.runtimes
    return next(ok for runtime, ok in runtimes.items() if runtime.startswith("tflite_runtime"))


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result, Manifest]:
    """The colour detector (dynamic batch, height, width, anchors; Ultralytics metadata) imported with pictures of
    shapes, then converted to fp32, fp16 and int8."""
    tmp = tmp_path_factory.mktemp("detector")
    pictures = tmp / "pictures"
    pictures.mkdir()
    for i in range(16):
        shapes_picture(SIZES[i % len(SIZES)], seed=i).save(pictures / f"p{i:02d}.png")
    root = imported(tmp, colour_detector(tmp / "colour.onnx"), "colour", pictures)
    return root, *edge(root)


def test_a_yolov8_layout_detector_converts_at_its_recorded_size_and_fp32_fp16_pass(detector) -> None:
    root, result, manifest = detector
    assert "images axis 2 (height) fixed at 320: from the recorded image preprocessing (320x320)" in result.output
    for precision in ("fp32", "fp16"):
        v = manifest.variants[f"tflite-{precision}"]
        assert v.passed, (precision, v.reason, result.output)
        assert v.edge.inputs[0].shape == [-1, 320, 320, 3]  # the batch stays free, height and width fixed
        assert on_device_runtime(manifest, f"tflite-{precision}") in (True, None)
    assert manifest.inputs[0].shape == ["batch", 3, "height", "width"]  # serving keeps its free dims
    record = manifest.stages.edge
    assert [(f.dim, f.size) for f in record.fixed_dims] == [("height", 320), ("width", 320)]
    assert record.attempts[0].used and record.attempts[0].options == ULTRALYTICS  # a detector starts with these
    report = json.loads((root / "reports" / "edge-convert.json").read_text())
    assert report["attempts"][0]["used"] and len(report["fixed_dims"]) == 2
    assert "| height | 320 |" in (root / "reports" / "edge-convert.md").read_text()


def test_the_detectors_int8_is_calibrated_on_its_pictures_and_judged_by_box_agreement(detector) -> None:
    _, result, manifest = detector
    int8 = manifest.variants["tflite-int8"]
    assert int8.settings["int8_io"] == "integer" and int8.edge.inputs[0].dtype == "int8"  # pictures: q = pixel - 128
    line = next(line for line in result.output.splitlines() if line.startswith("[edge] tflite-int8: converted"))
    assert "box agreement" in line  # judged as detections: boxes matched at IoU >= 0.5, not element by element


def test_the_detectors_boxes_are_normalized_so_int8_passes_box_agreement(detector) -> None:
    root, result, manifest = detector
    int8 = manifest.variants["tflite-int8"]
    assert int8.passed, (int8.reason, result.output)  # 0.745 with boxes in pixels sharing the scores' int8 scale
    feeding = json.loads((root / "edge" / "feeding.json").read_text())["models"]
    for precision in ("fp32", "fp16", "int8"):  # every precision alike, multiplied back by the runner and the gate
        assert manifest.variants[f"tflite-{precision}"].settings["boxes_normalized_by"] == {"output0": [320, 320]}
        assert feeding[f"model.{precision}.tflite"]["outputs"][0]["boxes_normalized_by"] == [320, 320]
    assert int8.edge.outputs[0].boxes_normalized_by == [320, 320]


@pytest.fixture(scope="module")
def paddle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The PaddleOCR-like classifier ([-1, 3, ?, ?]) imported with real-shaped inputs at 48x192."""
    tmp = tmp_path_factory.mktemp("paddle")
    data = tmp / "eval.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((8, 3, 48, 192), dtype=np.float32))
    return tmp, imported(tmp, paddle_classifier(tmp / "cls.onnx", ["0", "180"]), "cls", data)


def test_free_spatial_dims_are_fixed_from_paddleocrs_convention_and_the_model_runs_on_tflite_runtime(paddle) -> None:
    """The Paddle-like classifier states no size; the import recorded PaddleOCR's own (cls_image_shape 48x192,
    which its golden inputs also have), and edge fixes the dims from that record, saying where it came from."""
    _, root = paddle
    result, manifest = edge(root, "--precision", "fp32")
    assert result.exit_code == 0, result.output
    fp32 = manifest.variants["tflite-fp32"]
    assert fp32.passed and fp32.edge.inputs[0].shape == [-1, 48, 192, 3]
    assert on_device_runtime(manifest, "tflite-fp32") in (True, None)  # it aborted with free spatial dims
    fixed = manifest.stages.edge.fixed_dims
    assert [(f.axis, f.size) for f in fixed] == [(2, 48), (3, 192)]
    assert fixed[0].source.startswith("the recorded image size: PaddleOCR's cls_image_shape")
    assert not fixed[0].guessed


def test_input_shape_gives_the_device_size_and_the_golden_pictures_are_resampled_to_it(paddle) -> None:
    _, root = paddle
    result, manifest = edge(root, "--precision", "fp32", "--input-shape", "x:?,3,48,96")
    assert result.exit_code == 0, result.output
    assert manifest.variants["tflite-fp32"].edge.inputs[0].shape == [-1, 48, 96, 3]
    assert [f.source for f in manifest.stages.edge.fixed_dims] == ["--input-shape", "--input-shape"]
    assert manifest.stages.edge.settings["input_shapes"] == {"x": ["?", 3, 48, 96]}
    assert on_device_runtime(manifest, "tflite-fp32") in (True, None)


def houses(path: Path, n: int = 200) -> tuple[Path, np.ndarray]:
    """A house-price regression MLP (normalization baked in, outputs around 1e5..4e5) over eight columns of very
    different ranges, as california housing has (income, age, rooms, ..., population, latitude, longitude)."""
    rng = np.random.default_rng(0)
    lo = np.array([0.5, 1, 1, 0.3, 3, 0.7, 32.5, -124.3])
    hi = np.array([15, 52, 10, 2, 35000, 6, 42, -114.3])
    x = (lo + (hi - lo) * rng.random((n, 8))).astype(np.float32)
    arrays = {
        "mean": x.mean(0), "std": x.std(0), "w1": rng.normal(0, 0.6, (8, 16)), "b1": rng.normal(0, 0.1, 16),
        "w2": rng.normal(0, 30000, (16, 1)), "b2": np.array([206070.0]),
    }  # fmt: skip
    weights = [numpy_helper.from_array(np.asarray(a, np.float32), k) for k, a in arrays.items()]
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["c"]),
        helper.make_node("Div", ["c", "std"], ["z"]),
        helper.make_node("Gemm", ["z", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["price"]),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    price = helper.make_tensor_value_info("price", TensorProto.FLOAT, ["batch", 1])
    graph = helper.make_graph(nodes, "houses", [x_info], [price], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path, x


def test_a_regression_models_int8_takes_and_gives_floats(tmp_path: Path) -> None:
    model, x = houses(tmp_path / "houses.onnx")
    np.savez(tmp_path / "eval.npz", x=x)
    root = imported(tmp_path, model, "houses", tmp_path / "eval.npz", "--task", "regression")
    result, manifest = edge(root, "--precision", "int8")
    assert "int8 has float inputs and outputs" in result.output
    int8 = manifest.variants["tflite-int8"]
    assert int8.settings["int8_io"] == "float"
    assert int8.edge.inputs[0].dtype == "float32" and int8.edge.outputs[0].dtype == "float32"
    assert on_device_runtime(manifest, "tflite-int8") in (True, None)
    # per-feature scaling: the leading (x - mean) / std is the caller's, in float, so one int8 scale fits every column
    assert int8.passed, (int8.reason, result.output)  # relative error 0.43 with one scale over the raw columns
    assert int8.settings["normalized_inputs"] == ["x"]
    entry = json.loads((root / "edge" / "feeding.json").read_text())["models"]["model.int8.tflite"]["inputs"][0]
    assert entry["normalize"]["mean"] == pytest.approx(x.mean(0), rel=1e-4)
    assert entry["normalize"]["std"] == pytest.approx(x.std(0), rel=1e-4)
    assert entry["preprocessing"] == {**entry["normalize"], "applied_in_model": False}  # the device program's part
