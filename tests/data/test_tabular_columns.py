"""A table as a user brings it: sklearn's breast cancer data with a `patient_id` column, one per row.

An identifier must not become a 569-category one-hot feature silently (accuracy fell from 0.965
to 0.941 and every new patient was refused); `data.exclude_columns` leaves it out; training says
what it read before it starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.core.errors import RecipeError
from pipeline.recipe.schema import parse_recipe


def write_cancer(path: Path, rows: int | None = None) -> list[str]:
    """The 30 measurements, a `patient_id` string per row first and the diagnosis by name last."""
    from sklearn.datasets import load_breast_cancer

    cancer = load_breast_cancer()
    names = ["patient_id", *(n.replace(" ", "_") for n in cancer.feature_names), "diagnosis"]
    lines = [",".join(names)]
    for i, (row, target) in enumerate(zip(cancer.data[:rows], cancer.target[:rows], strict=True)):
        lines.append(",".join([f"P{i:05d}", *(f"{v:g}" for v in row), str(cancer.target_names[target])]))
    path.write_text("\n".join(lines) + "\n")
    return names


def write_recipe(tmp_path: Path, **data: object) -> Path:
    recipe = {
        "name": "cancer",
        "model": {"arch": "mlp", "hidden": [16]},
        "data": {"source": "csv", "path": "cancer.csv", "label_column": "diagnosis", **data},
        "train": {"epochs": 2, "batch_size": 64, "lr": 0.01},
    }
    path = tmp_path / "cancer.yaml"
    path.write_text(json.dumps(recipe))
    return path


def test_an_id_column_taken_by_default_is_refused_with_the_fix_and_nothing_is_written(tmp_path: Path) -> None:
    write_cancer(tmp_path / "cancer.csv")
    out = tmp_path / "artifacts"
    result = CliRunner().invoke(main, ["train", str(write_recipe(tmp_path)), "--out", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "column 'patient_id' holds a different value on every row" in result.output
    assert "data.exclude_columns: [patient_id]" in result.output
    assert not out.exists()


def test_exclude_columns_leaves_the_id_out_and_training_first_says_what_it_read(tmp_path: Path) -> None:
    names = write_cancer(tmp_path / "cancer.csv")
    out = tmp_path / "artifacts"
    recipe = write_recipe(tmp_path, exclude_columns=["patient_id"])
    result = CliRunner().invoke(main, ["train", str(recipe), "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = result.output.split("epoch 1/")[0]  # printed before the first epoch
    assert "data: cancer.csv, 569 rows, split on ','" in summary
    assert "30 feature columns: 30 numeric (mean_radius, " in summary
    assert "left out (data.exclude_columns): patient_id" in summary
    assert "classes: 2: benign 357 (63%), malignant 212 (37%)" in summary
    manifest = json.loads((out / "cancer" / "1" / "manifest.json").read_text())
    assert [f["name"] for f in manifest["inputs"][0]["features"]] == names[1:-1]


def test_a_few_rows_of_distinct_strings_are_not_called_an_identifier(tmp_path: Path) -> None:
    lines = ["color,size,label"] + [f"c{i},{i},{i % 2}" for i in range(12)]  # 12 rows: too few to say
    (tmp_path / "cancer.csv").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["train", str(write_recipe(tmp_path, label_column="label")), "--out",
                                       str(tmp_path / "a"), "--quiet", "--epochs", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"exclude_columns": ["patient_id"], "feature_columns": ["mean_radius"]}, "give one of them"),
        ({"source": "breast_cancer", "path": None, "label_column": None, "exclude_columns": ["x"]},
         "data.exclude_columns applies to source 'csv' only"),
    ],
)  # fmt: skip
def test_exclude_columns_refusals_in_the_recipe(tmp_path: Path, data: dict, message: str) -> None:
    spec = {"source": "csv", "path": "cancer.csv", "label_column": "diagnosis", **data}
    with pytest.raises(RecipeError, match=message):
        parse_recipe({"name": "t", "model": {"arch": "mlp"}, "data": spec}, "test", tmp_path)


@pytest.mark.parametrize(
    ("exclude", "message"),
    [(["nope"], "column(s) ['nope'] named in data are not in"),
     (["diagnosis"], "data.exclude_columns includes the label column")],
)  # fmt: skip
def test_exclude_columns_must_name_feature_columns_of_the_file(tmp_path: Path, exclude: list, message: str) -> None:
    write_cancer(tmp_path / "cancer.csv", rows=40)
    result = CliRunner().invoke(main, ["train", str(write_recipe(tmp_path, exclude_columns=exclude)), "--out",
                                       str(tmp_path / "a"), "--quiet"])  # fmt: skip
    assert result.exit_code == 2 and message in result.output, result.output
