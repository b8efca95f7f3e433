"""`pipe import MODEL --eval-data DIR`: a folder of pictures becomes golden.npz, the evaluation split and the
calibration samples, converted with the recorded image preprocessing; class folders label them by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from PIL import Image

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.samples.calibration import calibration_set, has_real_samples
from pipeline.samples.evaluation import evaluation_set
from tests.export.real_models import COLOURS, IMAGENET, imagenet_sample, mobilenet_like, write_pictures
from tests.export.test_export_import import linear_model

RECORD = json.dumps(IMAGENET)
ORDER = list(COLOURS)  # red, green, blue, yellow: the model's output order, not the folders' sorted order


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A folder of class folders (5 pictures each) and a MobileNet-like model fitted to tell them apart."""
    root = tmp_path_factory.mktemp("pictures")
    pictures = write_pictures(root / "eval")
    return mobilenet_like(root / "mobilenet.onnx", pictures=pictures), pictures


def pipe_import(model: Path, repo: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["import", str(model), "--name", "net", "--repository", str(repo), *args])
    return result.exit_code, result.output


def test_class_folders_are_matched_to_the_labels_by_name_and_become_golden_evaluation_and_calibration(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    model, pictures = world
    code, output = pipe_import(
        model, tmp_path, "--eval-data", str(pictures), "--labels", ",".join(ORDER), "--image-preprocessing", RECORD
    )
    assert code == 0, output
    assert "pictures: 20 of 20 (at most 500), 4 class folders" in output
    artifact = Artifact.load(tmp_path / "net" / "1")
    m = artifact.manifest
    assert m.labels == ORDER and m.metrics["accuracy"] == 1.0  # the model names each colour
    record = m.stages.import_
    assert record.golden == "eval-data" and not record.judged_on_generated
    assert record.pictures.classes == {"blue": 2, "green": 1, "red": 0, "yellow": 3}  # by name, not sorted order
    assert (record.pictures.found, record.pictures.used) == (20, 20)
    assert m.lineage.dataset_fingerprint == record.inputs["eval_data"] and len(record.inputs["eval_data"]) == 64

    golden = load_golden(artifact)
    files = [(pictures / name / f, ORDER.index(name)) for name in sorted(ORDER) for f in
             sorted(p.name for p in (pictures / name).iterdir())]  # fmt: skip
    np.testing.assert_array_equal(golden.target, [index for _, index in files])
    expected = np.stack([imagenet_sample(Image.open(path)) for path, _ in files])  # torchvision's pipeline, by hand
    np.testing.assert_allclose(golden.inputs["image"], expected, atol=1e-5)  # a grey level is 0.017 here
    assert golden.outputs["logits"].argmax(1).tolist() == golden.target.tolist()

    evaluation = evaluation_set(artifact)
    assert not evaluation.generated and "with targets (20 samples)" in evaluation.source
    np.testing.assert_array_equal(evaluation.target, golden.target)
    assert has_real_samples(artifact)
    calibration = calibration_set(artifact, None, 8)
    assert len(calibration) == 8 and calibration.inputs["image"].shape == (8, 3, 224, 224)


def test_without_labels_the_folders_name_them_sorted_as_image_folder_does(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    model, pictures = world
    code, output = pipe_import(model, tmp_path, "--eval-data", str(pictures), "--image-preprocessing", RECORD)
    assert code == 0, output
    artifact = Artifact.load(tmp_path / "net" / "1")
    assert artifact.manifest.labels == ["blue", "green", "red", "yellow"]
    target = load_golden(artifact).target
    assert target.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    # The model's outputs are in COLOURS order, so folder order scores what it is: the labels disagree.
    assert artifact.manifest.metrics["accuracy"] == pytest.approx(10 / 20)  # green and yellow keep their place


def test_a_flat_folder_gives_unlabelled_samples_and_the_limit_picks_the_same_ones_every_time(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    model, pictures = world
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ORDER:
        for file in (pictures / name).iterdir():
            (flat / f"{name}-{file.name}").write_bytes(file.read_bytes())
    (flat / "README.txt").write_text("not a picture: skipped, as ImageFolder skips it")
    (flat / ".hidden.png").write_bytes(b"editor leftovers are skipped too")
    chosen = []
    for repo in ("a", "b"):
        args = ["--eval-data", str(flat), "--eval-limit", "7", "--image-preprocessing", RECORD]
        code, output = pipe_import(model, tmp_path / repo, *args)
        assert code == 0, output
        assert "pictures: 7 of 20 (at most 7), unlabelled (a flat folder)" in output
        artifact = Artifact.load(tmp_path / repo / "net" / "1")
        golden = load_golden(artifact)
        assert golden.target is None and artifact.manifest.metrics == {}
        assert artifact.manifest.stages.import_.pictures.classes == {}
        chosen.append(golden.inputs["image"])
    np.testing.assert_array_equal(chosen[0], chosen[1])
    assert len({a.tobytes() for a in chosen[0]}) == 7  # seven different pictures


def refused(model: Path, repo: Path, *args: str) -> str:
    code, output = pipe_import(model, repo, *args)
    assert code == 2, output
    assert output.count("\n") == 1, output  # one line
    assert not list(repo.glob("net/*/manifest.json"))  # nothing half-made
    return output


def test_a_folder_matching_no_label_is_refused_naming_it_and_the_valid_labels(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    model, pictures = world
    labels = "red,green,blue,gold"  # the yellow folder matches none
    output = refused(model, tmp_path, "--eval-data", str(pictures), "--labels", labels, "--image-preprocessing", RECORD)
    assert "class folder" in output and "yellow" in output and "matches no label" in output
    assert "valid labels: red, green, blue, gold" in output and "never by order" in output


def test_class_folders_that_do_not_name_every_class_ask_for_the_labels(
    tmp_path: Path, world: tuple[Path, Path]
) -> None:
    model, pictures = world
    three = tmp_path / "three"
    for name in ("red", "green", "blue"):
        (three / name).mkdir(parents=True)
        for file in (pictures / name).iterdir():
            (three / name / file.name).write_bytes(file.read_bytes())
    output = refused(model, tmp_path / "artifacts", "--eval-data", str(three), "--image-preprocessing", RECORD)
    assert "class folders became the labels" in output and "4 classes" in output and "--labels" in output


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no preprocessing", "is a folder of pictures, but the manifest does not say how a picture becomes"),
        ("unreadable", "broken.png is not a readable picture"),
        ("mixed", "holds both pictures"),
        ("empty", "holds no pictures"),
        ("regression", "this model is not a classifier: give a flat folder"),
    ],
)
def test_pictures_that_cannot_be_read_as_the_model_needs_are_refused_with_the_fix(
    world: tuple[Path, Path], tmp_path: Path, case: str, message: str
) -> None:
    model, pictures = world
    folder, args = tmp_path / "eval", ["--image-preprocessing", RECORD]
    (folder / "red").mkdir(parents=True)
    (folder / "red" / "0.png").write_bytes((pictures / "red" / "0.png").read_bytes())
    if case == "no preprocessing":
        args = []
    elif case == "unreadable":
        (folder / "red" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    elif case == "mixed":
        (folder / "loose.png").write_bytes((pictures / "red" / "0.png").read_bytes())
    elif case == "empty":
        folder = tmp_path / "nothing"
        folder.mkdir()
    elif case == "regression":
        args += ["--task", "regression"]
    output = refused(model, tmp_path / "artifacts", "--eval-data", str(folder), *args)
    assert message in output
    if case == "no preprocessing":
        assert "--image-preprocessing" in output  # the fix


def test_a_model_without_an_image_input_refuses_a_folder_of_pictures(world: tuple[Path, Path], tmp_path: Path) -> None:
    _, pictures = world
    onnx.save(linear_model(), tmp_path / "linear.onnx")
    output = refused(tmp_path / "linear.onnx", tmp_path / "artifacts", "--eval-data", str(pictures))
    assert "is a folder of pictures" in output and "not an image input" in output
