"""PaddleOCR's models as RapidOCR ships them: a size the graph leaves free is taken from PaddleOCR's own
convention where one exists, said where it is guessed, and pictures can be fed blue-first (BGR)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from tests import corpus
from tests.export.real_models import picture

MODELS = "rapidocr_onnxruntime/models"


@pytest.fixture(scope="module")
def cls_model() -> Path:
    return corpus.path(corpus.RAPIDOCR, f"{MODELS}/ch_ppocr_mobile_v2.0_cls_infer.onnx")


def imported(args: list[str], repo: Path, name: str) -> tuple[Artifact, str]:
    result = CliRunner().invoke(main, ["import", *args, "--name", name, "--repository", str(repo)])
    assert result.exit_code == 0, result.output
    return Artifact.load(repo / name / "1"), result.output


def test_the_direction_classifier_gets_paddleocrs_48x192_not_a_silent_32x32(cls_model: Path, tmp_path: Path) -> None:
    artifact, output = imported([str(cls_model)], tmp_path, "cls")
    assert "image_size: 48x192 (PaddleOCR's cls_image_shape" in output
    assert load_golden(artifact).inputs["x"].shape == (16, 3, 48, 192)
    record = artifact.manifest.stages.import_
    assert record is not None and "convention" in record.read["image_size"].source


def test_a_size_no_graph_metadata_or_convention_gives_is_said_with_the_flag(tmp_path: Path) -> None:
    det = corpus.path(corpus.RAPIDOCR, f"{MODELS}/ch_PP-OCRv4_det_infer.onnx")
    artifact, output = imported([str(det)], tmp_path, "det")
    assert "size guessed" in output and "--input-shape x:?,3,<size>,<size>" in output
    record = artifact.manifest.stages.import_
    assert record is not None and any("size guessed" in note for note in record.notes)


def test_bgr_pictures_reach_the_model_blue_first(cls_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pictures"
    folder.mkdir()
    for i, colour in enumerate([(220, 30, 30), (30, 60, 220), (30, 180, 40)]):
        picture(colour, (192, 48), seed=i).save(folder / f"{i}.png")
    made = {}
    for mode in ("RGB", "BGR"):
        record = f'{{"mode": "{mode}", "size": [48, 192], "scale": 0.00392156862745098}}'
        args = [str(cls_model), "--eval-data", str(folder), "--image-preprocessing", record]
        artifact, _ = imported(args, tmp_path / mode, "cls")
        assert artifact.manifest.inputs[0].preprocessing["image"]["mode"] == mode
        made[mode] = load_golden(artifact).inputs["x"]
    np.testing.assert_array_equal(made["BGR"], made["RGB"][:, ::-1])
    assert not np.array_equal(made["BGR"], made["RGB"])  # red pictures: the channels differ
