"""`pipe predict` on a detector: the YOLOv8-layout colour detector imported with no flags, given a picture of
another size than its 320x320, prints boxes in the picture's pixels (text and --json) that match a
reference decoding written plainly (tests/export/real_models.py `reference_detections`) at IoU >= 0.99;
an .npz of the input tensor gets boxes in input pixels; the detection options are checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from pipeline.cli import main
from tests.export.real_models import (
    SHAPE_CLASSES,
    colour_detector,
    letterboxed,
    plain_decode,
    plain_iou,
    reference_detections,
    shapes_picture,
)

LABELS = list(SHAPE_CLASSES)


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The detector imported with no flags; its pictures beside it (photo.jpg: 403x211, a letterbox)."""
    root = tmp_path_factory.mktemp("predict-detections")
    colour_detector(root / "colour.onnx")
    shapes_picture((403, 211), seed=1).save(root / "photo.jpg", quality=95)
    result = invoke("import", root / "colour.onnx", "--name", "shapes", "--repository", root / "artifacts")
    assert result.exit_code == 0, result.output
    return root


def matched(got: list[tuple], want: list[tuple]) -> None:
    """The same boxes: as many, the same classes and scores, each at IoU >= 0.99 with its reference."""
    assert len(got) == len(want) > 0
    for (cls, score, box), (want_cls, want_score, want_box) in zip(got, want, strict=True):
        assert cls == want_cls and score == pytest.approx(want_score, abs=1e-4)  # text shows 4 decimals
        assert plain_iou(box, want_box) >= 0.99, (box, want_box)


def test_a_picture_prints_its_boxes_in_its_own_pixels(detector: Path) -> None:
    want = reference_detections(detector / "colour.onnx", Image.open(detector / "photo.jpg"))
    result = invoke("predict", detector / "artifacts" / "shapes", "--input", detector / "photo.jpg", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["coordinates"] == "picture" and answer["top_k"] == []
    assert answer["detection"] == {"confidence": 0.25, "iou": 0.7, "max_detections": 300}
    assert answer["outputs"] == {"output0": {"dtype": "float32", "shape": [1, 7, 2100]}}  # decoded, not dumped
    (found,) = answer["detections"]
    assert found["labels"] == [LABELS[c] for c in found["classes"]]
    matched(list(zip(found["classes"], found["scores"], found["boxes"], strict=True)), want)
    assert max(b[2] for b in found["boxes"]) <= 403 and max(b[3] for b in found["boxes"]) <= 211

    text = invoke("predict", detector / "artifacts" / "shapes", "--input", detector / "photo.jpg")
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[1] == f"sample 0: {len(want)} boxes (x1, y1, x2, y2 in picture pixels, the letterbox undone)"
    rows = [re.split(r"\s+", line.strip()) for line in lines[2 : 2 + len(want)]]
    got = [(LABELS.index(r[0]), float(r[1]), [float(v) for v in r[2:]]) for r in rows]
    matched(got, want)
    assert "output0: float32[1, 7, 2100]  (decoded above: confidence > 0.25, NMS IoU 0.7" in text.output


def test_options_override_the_recorded_settings(detector: Path) -> None:
    want = reference_detections(detector / "colour.onnx", Image.open(detector / "photo.jpg"), confidence=0.9,
                                max_detections=2)  # fmt: skip
    result = invoke("predict", detector / "artifacts" / "shapes", "--input", detector / "photo.jpg", "--json",
                    "--confidence", "0.9", "--max-detections", "2")  # fmt: skip
    assert result.exit_code == 0, result.output
    (found,) = json.loads(result.output)["detections"]
    matched(list(zip(found["classes"], found["scores"], found["boxes"], strict=True)), want)
    bad = invoke("predict", detector / "artifacts" / "shapes", "--input", detector / "photo.jpg", "--iou", "1.5")
    assert bad.exit_code == 2 and "--iou" in bad.output


def test_a_tensor_gets_boxes_in_input_pixels(detector: Path) -> None:
    sample, _, _ = letterboxed(Image.open(detector / "photo.jpg"))
    np.savez(detector / "sample.npz", images=sample[np.newaxis])
    import onnxruntime as ort

    head = ort.InferenceSession(str(detector / "colour.onnx")).run(None, {"images": sample[np.newaxis]})[0]
    result = invoke("predict", detector / "artifacts" / "shapes", "--input", detector / "sample.npz", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["coordinates"] == "input"
    (found,) = answer["detections"]
    got = list(zip(found["classes"], found["scores"], found["boxes"], strict=True))
    matched(got, plain_decode(head[0], 0.25, 0.7, 300))


def test_detection_options_for_another_model_are_refused(tmp_path: Path) -> None:
    from tests.export.real_models import paddle_classifier

    paddle_classifier(tmp_path / "cls.onnx", ["a", "b"])
    made = invoke("import", tmp_path / "cls.onnx", "--name", "cls", "--repository", tmp_path / "artifacts",
                  "--input-shape", "x:-1,3,32,32")  # fmt: skip
    assert made.exit_code == 0, made.output
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 3, 32, 32), np.float32))
    result = invoke("predict", tmp_path / "artifacts" / "cls", "--input", tmp_path / "x.npz", "--confidence", "0.5")
    assert result.exit_code == 2
    assert "--confidence set how a detector's boxes are decoded; this is a classification model" in result.output
