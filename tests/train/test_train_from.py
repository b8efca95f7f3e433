"""`pipe train --from`: the data's classes are the parent's, and the new version goes beside the parent.

The parent is a scikit-learn digits classifier written as ONNX and brought in by `pipe import` with
labels "0".."9" (tests/train/test_train_ort.py's `foreign_classifier`); the ORT worker runs for real.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.data import DataInfo, Split, Splits
from pipeline.runtime.runners import ort_runner
from pipeline.train.ort_start import in_parent_classes
from tests.train.test_train_ort import foreign_classifier, pipe

DIGITS = [str(i) for i in range(10)]


def splits_of(labels: list[str], target: list[int]) -> Splits:
    """Splits whose targets are the data's own class numbers 0..k-1, named `labels`."""
    x = np.zeros((len(target), 2), np.float32)
    split = Split({"input": x}, np.asarray(target, np.int64))
    return Splits(split, split, split, DataInfo("features", [2], len(labels), labels), "f")


def test_the_datas_classes_map_to_the_parent_classes_they_name() -> None:
    """Digits 3 and 7 were numbered 0 and 1 by the reader; they are the parent's classes 3 and 7."""
    mapped = in_parent_classes(splits_of(["3", "7"], [0, 1, 1, 0]), DIGITS, 10, Path("parent"))
    assert mapped.train.target.tolist() == [3, 7, 7, 3]
    assert mapped.info.labels == DIGITS and mapped.info.num_classes == 10
    named = in_parent_classes(splits_of(["dog", "cat"], [0, 1]), ["cat", "dog", "emu"], 3, Path("parent"))
    assert named.test.target.tolist() == [1, 0]  # by name, not by order
    unnamed = in_parent_classes(splits_of(["0", "2"], [1, 0]), [], 3, Path("parent"))
    assert unnamed.val.target.tolist() == [2, 0] and unnamed.info.labels == ["0", "1", "2"]
    with pytest.raises(InputError, match=r"class 'emu' is not a class of parent.*'cat', 'dog'"):
        in_parent_classes(splits_of(["cat", "emu"], [0, 1]), ["cat", "dog"], 2, Path("parent"))
    with pytest.raises(InputError, match=r"class '12' is not a class of parent: it answers 10 classes"):
        in_parent_classes(splits_of(["3", "12"], [0, 1]), DIGITS, 10, Path("parent"))


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """artifacts/skclf/1: the imported digits classifier, labelled "0".."9"; and the digits."""
    tmp = tmp_path_factory.mktemp("from")
    onnx_file, x, y = foreign_classifier(tmp)
    np.savez(tmp / "eval.npz", x=x[:200], target=y[:200])
    result = CliRunner().invoke(main, ["import", str(onnx_file), "--name", "skclf", "--eval-data",
                                       str(tmp / "eval.npz"), "--labels", ",".join(DIGITS),
                                       "--repository", str(tmp / "artifacts")])  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp / "artifacts" / "skclf" / "1", x, y


def test_a_repository_other_than_the_parents_is_refused(
    parent: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    root, x, y = parent
    np.savez(tmp_path / "d.npz", X=x[:100], y=y[:100])
    result = CliRunner().invoke(main, ["train", "--from", str(root), "--data", str(tmp_path / "d.npz"),
                                       "--repository", str(tmp_path / "elsewhere")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "goes into the parent's model directory" in result.output and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(("location", "refusal"), [
    ("../../../../etc/passwd", "escapes the model's directory"),
    ("stray.bin", "which its manifest does not list"),
])  # fmt: skip
def test_a_parent_whose_weights_point_outside_it_is_refused_by_name(
    parent: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path, location: str, refusal: str
) -> None:
    """A forged parent (its manifest re-hashed over the forged model.onnx): before, exit 3 reading the location."""
    import shutil

    import onnx

    root, x, y = parent
    forged = tmp_path / "artifacts" / "skclf" / "1"
    shutil.copytree(root, forged)
    model = onnx.load(forged / "model.onnx")
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.ClearField("float_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    onnx.save(model, forged / "model.onnx")
    (forged / "stray.bin").write_bytes(b"\0" * 4096)
    artifact = Artifact.load(forged, verify=False)
    artifact.add_file("model.onnx")
    artifact.save()
    np.savez(tmp_path / "d.npz", X=x[:100], y=y[:100])
    result = CliRunner().invoke(main, ["train", "--from", str(forged), "--data", str(tmp_path / "d.npz")])
    assert result.exit_code == 2, result.output
    assert refusal in result.output and repr(location) in result.output
    assert sorted(p.name for p in forged.parent.iterdir()) == ["1"]  # no version left behind


@pytest.mark.slow
def test_a_model_tuned_on_two_classes_answers_their_labels_beside_its_parent(
    parent: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    """Before: the 3s and 7s trained as classes 0 and 1 (every 3 answered "0", accuracy 1.0 recorded),
    and the version went to ./artifacts/skclf/1 under the working directory."""
    root, x, y = parent
    keep = (y == 3) | (y == 7)
    np.savez(tmp_path / "37.npz", X=x[keep], y=y[keep])
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    here = os.getcwd()
    try:
        os.chdir(cwd)  # the subprocess inherits it
        proc = pipe("train", "--from", str(root), "--trainable", "head/*", "--data", str(tmp_path / "37.npz"),
                    "--epochs", "3", "--quiet")  # fmt: skip
    finally:
        os.chdir(here)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (cwd / "artifacts").exists()
    child = Artifact.load(root.parent / "2")
    assert child.manifest.labels == DIGITS
    golden = np.load(child.path("golden.npz"))
    assert set(golden["target"].tolist()) == {3, 7}  # the parent's class indices, not 0 and 1
    answers = ort_runner(child.path("checkpoint/model.onnx"))({"x": golden["in.x"]})["scores"].argmax(1)
    assert (answers == golden["target"]).mean() > 0.9 and child.manifest.metrics["accuracy"] > 0.9
