"""`pipe import` reads what exporters record: Ultralytics, Paddle and Hugging Face metadata, tasks that fit the outputs.

The models are shaped like the real ones (tests/export/real_models.py): a YOLOv8-layout detector
exported by torch with Ultralytics' own metadata keys, and a PaddleClas-style classifier with
Paddle's -1 dims and `character` labels. Each is imported with the real command.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.export.conventions import MAX_PARSED, read_conventions
from tests.conftest import LINEAR
from tests.export.real_models import COCO_FIRST, paddle_classifier, set_metadata, ultralytics_metadata, yolo_detector

NAMES = COCO_FIRST[:3]


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return yolo_detector(tmp_path_factory.mktemp("yolo") / "yolov8n.onnx", NAMES)


def imported(repo: Path, name: str) -> Artifact:
    return Artifact.load(repo / name / "1")


@pytest.fixture(scope="module")
def yolo(tmp_path_factory: pytest.TempPathFactory, detector: Path) -> tuple[Path, str]:
    """The detector imported with no flags once: (repository, the command's output)."""
    repo = tmp_path_factory.mktemp("imported") / "artifacts"
    result = invoke("import", detector, "--name", "yolo", "--repository", repo)
    assert result.exit_code == 0, result.output
    return repo, result.output


def test_an_ultralytics_detector_imported_with_no_flags_is_a_detector(detector: Path, yolo: tuple[Path, str]) -> None:
    repo, output = yolo
    assert "task: detection (metadata_props['task'] = 'detect' (Ultralytics))" in output
    assert "golden images: [16, 3, 320, 320] for [batch, 3, height, width]" in output

    m = imported(repo, "yolo").manifest
    assert m.task == "detection" and m.labels == NAMES
    assert m.outputs[0].shape == ["batch", 7, "anchors"]
    assert (m.detection.confidence, m.detection.iou, m.detection.max_detections, m.detection.stride) == (
        0.25, 0.7, 300, 32,
    )  # fmt: skip
    image = m.inputs[0].preprocessing["image"]
    assert image == {"mode": "RGB", "letterbox": {"size": [320, 320], "pad": 114}, "resize": "bilinear",
                     "scale": 1 / 255}  # fmt: skip
    record = m.stages.import_
    assert record.convention == "Ultralytics"
    assert record.metadata == ultralytics_metadata(NAMES)  # every key kept verbatim, the unread ones too
    sources = {what: reading.source for what, reading in record.read.items()}
    assert sources == {
        "task": "metadata_props['task'] = 'detect' (Ultralytics)",
        "labels": "metadata_props['names'] (Ultralytics)",
        "image_size": "metadata_props['imgsz'] = '[320, 320]' (Ultralytics)",
        "image": "Ultralytics detect preprocessing: fit, pad 114, scale 1/255, RGB",
        "stride": "metadata_props['stride'] = '32' (Ultralytics)",
        "detection": "Ultralytics' prediction defaults",
    }
    assert record.read["image_size"].value == [320, 320] and record.notes == []
    golden = load_golden(imported(repo, "yolo"))
    assert golden.inputs["images"].shape == (16, 3, 320, 320)
    assert golden.outputs["output0"].shape == (16, 7, 2100)  # 40*40 + 20*20 + 10*10 anchors at strides 8/16/32
    rows = {row["check"] for row in record.parity["rows"]}
    assert {"batch 1", "batch 16", "batch 2, height 160", "batch 2, width 160"} <= rows

    info = invoke("info", repo / "yolo" / "1")
    assert info.exit_code == 0, info.output
    for line in (
        "yolo v1  (detection,",
        "labels    3: person, bicycle, car",
        "detection confidence > 0.25, NMS IoU 0.7, max 300 boxes per picture, stride 32",
        "imported  " + str(detector) + " (Ultralytics, producer pytorch",
        "metadata  11 key(s) in metadata_props",
        "names        \"{0: 'person', 1: 'bicycle', 2: 'car'}\"  -> labels",
        "license      'AGPL-3.0 License (https://ultralytics.com/license)'",
        "read      task detection <- metadata_props['task'] = 'detect' (Ultralytics)",
        "image RGB, letterbox 320x320 pad 114, bilinear, scale 0.003922 <- Ultralytics detect preprocessing",
    ):
        assert line in info.output, (line, info.output)


@pytest.mark.slow
def test_flags_win_over_metadata_and_are_recorded_as_the_source(tmp_path: Path, detector: Path) -> None:
    repo = tmp_path / "artifacts"
    preprocessing = '{"mode": "RGB", "size": [256, 256], "scale": 0.00392156862745098}'
    flags = ["--labels", "cat,dog,bird", "--confidence", "0.5", "--max-detections", "10"]
    result = invoke("import", detector, "--name", "yolo", "--repository", repo, *flags,
                    "--image-preprocessing", preprocessing)  # fmt: skip
    assert result.exit_code == 0, result.output
    m = imported(repo, "yolo").manifest
    assert m.labels == ["cat", "dog", "bird"] and m.detection.confidence == 0.5 and m.detection.max_detections == 10
    assert m.detection.iou == 0.7  # not given: the default
    assert m.inputs[0].preprocessing["image"]["size"] == [256, 256]
    assert "letterbox" not in m.inputs[0].preprocessing["image"]
    read = m.stages.import_.read
    assert read["labels"].source == "--labels" and read["image"].source == "--image-preprocessing"
    assert read["detection"].source == "--confidence, --max-detections and Ultralytics' prediction defaults"
    # the flag's picture size, not imgsz, sizes the golden inputs
    assert load_golden(imported(repo, "yolo")).inputs["images"].shape[2:] == (256, 256)
    assert "metadata_props['imgsz'] = '[320, 320]' (Ultralytics) ignored: --image-preprocessing says how pictures " \
           "are made" in m.stages.import_.notes  # fmt: skip

    tensor = invoke("import", detector, "--name", "raw", "--repository", repo, "--task", "tensor")
    assert tensor.exit_code == 0, tensor.output
    raw = imported(repo, "raw").manifest
    assert raw.task == "tensor" and raw.detection is None and raw.labels == []
    assert "metadata_props['names'] (Ultralytics) ignored: a tensor model's outputs hold no classes" in tensor.output


def test_a_task_that_does_not_fit_the_outputs_is_refused_with_the_reason(tmp_path: Path, detector: Path) -> None:
    repo = tmp_path / "artifacts"
    refused = invoke("import", detector, "--name", "yolo", "--repository", repo, "--task", "classification")
    assert refused.exit_code == 2, refused.output
    assert "--task classification: output 'output0' [batch, 7, anchors] is not a classifier's: a classifier has " \
           "one [batch, classes] output" in refused.output  # fmt: skip
    assert not repo.exists()

    classifier = paddle_classifier(tmp_path / "cls.onnx", ["cat", "dog", "bird", "fish"])
    refused = invoke("import", classifier, "--name", "cls", "--repository", repo, "--task", "detection")
    assert refused.exit_code == 2, refused.output
    assert "--task detection: output 'softmax_0.tmp_0' [softmax_0.tmp_0_dim0, 4] is not a detection head's " \
           "[batch, 4 + classes, anchors]" in refused.output  # fmt: skip

    wrong = invoke("import", detector, "--name", "yolo", "--repository", repo, "--labels", "a,b")
    assert wrong.exit_code == 2 and "2 labels given (['a', 'b']) but output 'output0' has 3 classes" in wrong.output
    misplaced = invoke("import", classifier, "--name", "cls", "--repository", repo, "--confidence", "0.3")
    assert misplaced.exit_code == 2
    assert "--confidence set how a detector's boxes are decoded; the task is classification" in misplaced.output
    for flag, value in (("--confidence", "1.5"), ("--iou", "nan"), ("--max-detections", "0")):
        bad = invoke("import", detector, "--name", "yolo", "--repository", repo, flag, value)
        assert bad.exit_code == 2 and f"{flag} " in bad.output, bad.output
    assert not repo.exists()


def test_a_model_no_classifier_has_the_outputs_of_becomes_tensor_with_a_note(tmp_path: Path, detector: Path) -> None:
    repo = tmp_path / "artifacts"
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(detector.read_bytes())
    set_metadata(bare, {})  # the same detector with its metadata stripped: nothing says it is one
    result = invoke("import", bare, "--name", "bare", "--repository", repo)
    assert result.exit_code == 0, result.output
    m = imported(repo, "bare").manifest
    assert m.task == "tensor" and m.stages.import_.read["task"].source == "default: the outputs fit no task named"
    note, guessed = m.stages.import_.notes
    assert note.startswith("task tensor: output 'output0' [batch, 7, anchors] is not a classifier's")
    assert guessed.startswith("input 'images': size guessed (height 32, width 32")  # no imgsz: said (issue 28)
    assert "Pass --task to say what the model is" in note and f"note: {note}" in result.output
    # no imgsz: generated at the default spatial size
    assert load_golden(imported(repo, "bare")).inputs["images"].shape == (16, 3, 32, 32)

    # A metadata task that does not fit: a "detector" whose output is a classifier's
    classifier = paddle_classifier(tmp_path / "cls.onnx", ["cat", "dog", "bird", "fish"])
    set_metadata(classifier, {**ultralytics_metadata(["a", "b", "c", "d"]), "imgsz": "[64, 64]"})
    result = invoke("import", classifier, "--name", "odd", "--repository", repo)
    assert result.exit_code == 0, result.output
    odd = imported(repo, "odd").manifest
    assert odd.task == "tensor"
    notes = odd.stages.import_.notes
    said = "task tensor: metadata_props['task'] = 'detect' (Ultralytics) says detection, but "
    assert notes[0].startswith(said + "output 'softmax_0.tmp_0' [softmax_0.tmp_0_dim0, 4] is not a detection head's")
    assert notes[1] == "metadata_props['names'] (Ultralytics) ignored: a tensor model's outputs hold no classes"


def test_a_paddle_classifier_takes_its_labels_from_character(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    labels = ["cat", "dog", "bird", "fish"]
    source = paddle_classifier(tmp_path / "pplcnet.onnx", labels)
    result = invoke("import", source, "--name", "pplcnet", "--repository", repo)
    assert result.exit_code == 0, result.output
    m = imported(repo, "pplcnet").manifest
    assert m.task == "classification" and m.labels == labels
    assert m.inputs[0].shape == ["x_dim0", 3, "x_dim2", "x_dim3"]  # Paddle's -1 dims, named apart
    record = m.stages.import_
    assert record.convention == "Paddle"
    assert {k: r.source for k, r in record.read.items()} == {
        "task": "default",
        "labels": "metadata_props['character'] (Paddle)",
    }
    assert "labels: 4 labels (metadata_props['character'] (Paddle))" in result.output

    # A label count that does not match the output: ignored with a note, never a wrong label
    five = paddle_classifier(tmp_path / "five.onnx", labels, character="a\nb\nc\nd\ne\n")
    result = invoke("import", five, "--name", "five", "--repository", repo)
    assert result.exit_code == 0, result.output
    m = imported(repo, "five").manifest
    assert m.labels == [] and "labels" not in m.stages.import_.read
    assert m.stages.import_.notes[0] == (
        "metadata_props['character'] (Paddle) ignored: 5 labels given (['a', 'b', 'c', 'd', 'e']) but output "
        "'softmax_0.tmp_0' has 4 classes"
    )
    assert m.stages.import_.notes[1].startswith("input 'x': size guessed")  # [-1, 3, -1, -1]: said (issue 28)


def _metadata_model(tmp_path: Path, metadata: dict[str, str]) -> onnx.ModelProto:
    path = tmp_path / "linear.onnx"
    onnx.save(onnx.parser.parse_model(LINEAR), path)
    set_metadata(path, metadata)
    return onnx.load(str(path))


def test_hugging_face_id2label_and_unknown_keys(tmp_path: Path) -> None:
    metadata = {"id2label": '{"0": "neg", "1": "neu", "2": "pos"}', "framework": "pt", "names": "{0: 'x'}"}
    found = read_conventions(_metadata_model(tmp_path, metadata))
    assert found.labels == ["neg", "neu", "pos"] and found.convention == "Hugging Face"
    assert found.sources == {"labels": "metadata_props['id2label'] (Hugging Face)"}
    # names without Ultralytics' author is nobody's convention: kept, not read
    assert found.metadata == metadata
    assert found.notes == []

    repo = tmp_path / "artifacts"
    result = invoke("import", tmp_path / "linear.onnx", "--name", "hf", "--repository", repo)
    assert result.exit_code == 0, result.output
    assert imported(repo, "hf").manifest.labels == ["neg", "neu", "pos"]
    info = invoke("info", repo / "hf" / "1")
    assert "    framework  'pt'\n" in info.output and "-> labels" in info.output


HOSTILE = {  # metadata value -> the note it leaves (the import goes on without it)
    "{0: 'a', 2: 'b'}": "metadata_props['names'] ignored: the ids are not 0..1",
    "{}": "metadata_props['names'] ignored: it names no labels",
    "[" * 300 + "]" * 300: "metadata_props['names'] ignored: not a valid literal (too many nested parentheses)",
    "__import__('os').system('echo pwned')": "metadata_props['names'] ignored: not a plain literal",
    "{0: 'a', 1: 'a', 2: 'c'}": "ignored: labels repeat ('a'); class names must be distinct",
    "{0: 'a\\nb', 1: 'b', 2: 'c'}": "label 0: class name 'a\\nb' holds '\\n'",
    "{0: 'a\\x1b[31m', 1: 'b', 2: 'c'}": "label 0: class name 'a\\x1b[31m' holds '\\x1b'",
    "{0: '', 1: 'b', 2: 'c'}": "label 0 ('') is empty or longer than 1000 characters",
    "{0: 1, 1: 2, 2: 3}": "a name is not a string",
    "9" * 5000: "metadata_props['names'] ignored: not a valid literal (Exceeds the limit (4300 digits)",
    "x" * (MAX_PARSED + 1): f"ignored: {MAX_PARSED + 1:,} characters, over the {MAX_PARSED:,} read",
}


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_metadata_is_ignored_with_a_one_line_note(tmp_path: Path, value: str) -> None:
    metadata = {**ultralytics_metadata(["a", "b", "c"]), "task": "classify", "names": value}
    found = read_conventions(_metadata_model(tmp_path, metadata))
    assert found.labels is None
    (note,) = [n for n in found.notes if "names" in n]
    assert HOSTILE[value] in note and "\n" not in note and len(note) < 400
    assert len(found.metadata["names"]) <= 2_100  # recorded, bounded


def test_hostile_sizes_and_keys_through_the_command(tmp_path: Path, detector: Path) -> None:
    repo = tmp_path / "artifacts"
    source = tmp_path / "hostile.onnx"
    source.write_bytes(detector.read_bytes())
    metadata = {**ultralytics_metadata(NAMES), "imgsz": "[10**9, 1]", "stride": "'32'",
                **{f"key{i}": "v" * 5_000 for i in range(70)}}  # fmt: skip
    set_metadata(source, metadata)
    result = invoke("import", source, "--name", "hostile", "--repository", repo)
    assert result.exit_code == 0, result.output
    record = imported(repo, "hostile").manifest.stages.import_
    assert len(record.metadata) == 64 and all(len(v) < 2_100 for v in record.metadata.values())
    assert record.metadata["key0"].endswith("... (5,000 characters)")
    notes = "\n".join(record.notes)
    assert "81 metadata keys; the first 64 are recorded" in notes
    assert "metadata_props['imgsz'] ignored: " in notes and "metadata_props['stride'] ignored: " in notes
    assert "Traceback" not in result.output
    m = imported(repo, "hostile").manifest
    assert m.task == "detection" and "image_size" not in record.read and "image" not in record.read

    # a letterbox size the fixed input does not take: the graph wins, with a note
    fixed = tmp_path / "fixed.onnx"
    model = onnx.load(str(detector))
    for axis, size in ((0, 1), (2, 256), (3, 256)):
        model.graph.input[0].type.tensor_type.shape.dim[axis].dim_value = size
    onnx.save(model, fixed)
    result = invoke("import", fixed, "--name", "fixed", "--repository", repo)
    assert result.exit_code == 0, result.output
    m = imported(repo, "fixed").manifest
    assert "metadata_props['imgsz'] = '[320, 320]' (Ultralytics) ignored: input 'images' is fixed at 256x256" in (
        m.stages.import_.notes
    )
    assert m.inputs[0].preprocessing["image"]["letterbox"] == {"size": [256, 256], "pad": 114}


def test_decoded_golden_outputs_are_boxes_in_input_pixels(yolo: tuple[Path, str]) -> None:
    """The recorded outputs are the head's: cx, cy, w, h inside a 320x320 picture, scores in 0..1."""
    out = load_golden(imported(yolo[0], "yolo")).outputs["output0"]
    assert np.all((out[:, 4:] >= 0) & (out[:, 4:] <= 1))
    assert 0 < out[:, 0].min() and out[:, 0].max() < 320 and np.all(out[:, 2:4] > 0)


@pytest.mark.parametrize("size", [(200, 100), (100, 300), (320, 320), (641, 479)])
def test_a_picture_is_letterboxed_as_ultralytics_does(
    tmp_path: Path, yolo: tuple[Path, str], size: tuple[int, int]
) -> None:
    """The recorded letterbox, as pipe serve and pipe predict convert a picture, against numpy and Pillow here."""
    from PIL import Image

    from pipeline.runtime.images import image_input

    manifest = imported(yolo[0], "yolo").manifest
    width, height = size
    pixels = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "picture.png")
    got, _ = image_input(manifest, manifest.inputs[0]).convert(tmp_path / "picture.png", "picture.png")

    ratio = min(320 / height, 320 / width)
    new_w, new_h = round(width * ratio), round(height * ratio)
    resized = np.asarray(Image.fromarray(pixels).resize((new_w, new_h), Image.Resampling.BILINEAR))
    dw, dh = (320 - new_w) / 2, (320 - new_h) / 2  # LetterBox(center=True): the odd pixel below and right
    pads = ((round(dh - 0.1), round(dh + 0.1)), (round(dw - 0.1), round(dw + 0.1)), (0, 0))
    want = np.pad(resized, pads, constant_values=114)
    assert got.shape == (3, 320, 320) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.transpose(2, 0, 1).astype(np.float32) / 255, atol=1e-6)


def test_the_model_card_says_where_each_reading_came_from(yolo: tuple[Path, str]) -> None:
    from pipeline.recipe.budgets import BudgetSpec
    from pipeline.report.card import CardFacts, lineage_section, metrics_section

    artifact = imported(yolo[0], "yolo")
    facts = CardFacts("", BudgetSpec(), "defaults", None, None, "imported, not trained here")
    lineage = "\n".join(lineage_section(artifact, facts))
    assert "| exporter's metadata | 11 key(s), convention Ultralytics |" in lineage
    assert "| task from | metadata_props['task'] = 'detect' (Ultralytics) |" in lineage
    assert "| labels from | metadata_props['names'] (Ultralytics) |" in lineage
    metrics = "\n".join(metrics_section(artifact, facts))
    assert "No task metric: a detection model has none here; its variants are judged against model.onnx by box " \
           "agreement" in metrics  # fmt: skip
