"""Where an artifact's evaluation set comes from: golden.npz, the training data read again, or import data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.records import GoldenRecord, ImportRecord
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError
from pipeline.recipe.file import load_recipe
from pipeline.samples.evaluation import evaluation_set
from tests.conftest import train_record

FEATURES = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
LABELS = (FEATURES[:, 0] > 0).astype(np.int64)
RECIPE = {
    "name": "toy",
    "task": "classification",
    "model": {"arch": "mlp", "hidden": [8]},
    "data": {"source": "npz", "path": "data/toy.npz", "normalize": False},
    "train": {"epochs": 1},
}


def artifact(root: Path, golden_rows: int, target: bool = True) -> Artifact:
    manifest = Manifest(
        name="toy",
        version=1,
        task="classification",
        inputs=[TensorSpec("input", "float32", ["batch", 4])],
        outputs=[TensorSpec("logits", "float32", ["batch", 2])],
    )
    made = Artifact(root, manifest)
    root.mkdir(parents=True)
    x = FEATURES[:golden_rows]
    save_golden(
        made,
        Golden({"input": x}, {"logits": np.stack([-x[:, 0], x[:, 0]], 1)}, LABELS[:golden_rows] if target else None),
    )
    return made


def trained(
    root: Path, golden_rows: int, whole: bool, recipe_dir: Path | None = None, recorded: bool = True
) -> Artifact:
    """An artifact as `pipe train` records it, trained from RECIPE written in `recipe_dir`.

    `recorded`: the train record names the recipe file (relative to the artifact), as it does
    when the recipe was found at training time.
    """
    made = artifact(root, golden_rows)
    recipe_path = None
    if recipe_dir is not None:
        (recipe_dir / "data").mkdir(parents=True, exist_ok=True)
        np.savez(recipe_dir / "data" / "toy.npz", X=FEATURES, y=LABELS)
        (recipe_dir / "toy.yaml").write_text(yaml.safe_dump(RECIPE))
        recipe_path = os.path.relpath(recipe_dir / "toy.yaml", root) if recorded else None
    settings = load_recipe(recipe_dir / "toy.yaml").model_dump(mode="json") if recipe_dir else RECIPE
    made.manifest.stages.train = train_record(
        {k: settings[k] for k in ("name", "task", "model", "data", "train")},
        {},
        recipe_path=recipe_path,
        golden=GoldenRecord(split="test", samples=golden_rows, whole_split=whole, split_size=15),
    )
    return made


def test_golden_npz_is_the_split_when_training_stored_it_whole(tmp_path: Path) -> None:
    evaluation = evaluation_set(trained(tmp_path / "toy" / "1", 15, whole=True))
    assert evaluation.source == "golden.npz: the whole test split (15 samples)"
    assert evaluation.data is evaluation.samples and evaluation.target.tolist() == LABELS[:15].tolist()
    assert evaluation.split[1] is evaluation.target and len(evaluation) == 15


def test_the_trained_split_is_read_again_from_the_recipe_directory(tmp_path: Path) -> None:
    root = tmp_path / "toy" / "1"
    evaluation = evaluation_set(trained(root, 5, whole=False, recipe_dir=tmp_path / "models"))
    assert evaluation.source == "the test split read again from the training data (15 samples)"
    assert len(evaluation.samples["input"]) == 5 and len(evaluation) == 15
    assert evaluation.recorded["logits"].shape == (5, 2)
    rows = {row.tobytes(): label for row, label in zip(FEATURES, LABELS, strict=True)}
    assert [rows[r.tobytes()] for r in evaluation.data["input"]] == evaluation.target.tolist()  # the real labels


def test_a_recipe_given_places_the_data_when_the_recorded_path_does_not(tmp_path: Path) -> None:
    recipe_dir = tmp_path / "elsewhere"
    made = trained(tmp_path / "toy" / "1", 5, whole=False, recipe_dir=recipe_dir, recorded=False)
    assert made.manifest.stages.train.recipe_path is None
    with pytest.raises(InputError, match="the data could not be read again") as caught:
        evaluation_set(made)
    assert "data/toy.npz" in str(caught.value)
    assert len(evaluation_set(made, load_recipe(recipe_dir / "toy.yaml"))) == 15


def test_an_import_with_eval_data_is_measured_on_it(tmp_path: Path) -> None:
    made = artifact(tmp_path / "toy" / "1", 40)
    made.manifest.stages.import_ = ImportRecord(
        source="x.onnx", source_sha256="0" * 64, producer="", ir_version=8, opset=18, golden="eval-data"
    )
    evaluation = evaluation_set(made)
    assert evaluation.source == "the evaluation data given at import with targets (40 samples)"
    assert evaluation.target is not None and len(evaluation) == 40


def test_golden_inputs_without_targets_give_agreement_only(tmp_path: Path) -> None:
    evaluation = evaluation_set(artifact(tmp_path / "toy" / "1", 16, target=False))
    assert evaluation.target is None and evaluation.data is evaluation.samples
    assert evaluation.source == "golden.npz inputs without targets (16 samples): agreement only"
