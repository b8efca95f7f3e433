"""A model trained on a table, used as its users do: `pipe info`, the card, `pipe predict` with rows.

Breast cancer with a `patient_id` (left out by data.exclude_columns) and a string column `site`,
trained and exported by the real commands. `pipe predict` must take what the server takes, rows
keyed by column name, and a CSV file, and answer exactly what the numeric rows get.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.predict.command import predict_file

SITES = ["left", "right"]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[list[str]]]:
    """The exported version, the CSV's header and its first rows as text."""
    from sklearn.datasets import load_breast_cancer

    root = tmp_path_factory.mktemp("table")
    cancer = load_breast_cancer()
    header = ["patient_id", *(n.replace(" ", "_") for n in cancer.feature_names), "site", "diagnosis"]
    rows = [
        [f"P{i:05d}", *(f"{v:g}" for v in x), SITES[i % 2], str(cancer.target_names[t])]
        for i, (x, t) in enumerate(zip(cancer.data, cancer.target, strict=True))
    ]
    (root / "cancer.csv").write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    recipe = {
        "name": "cancer",
        "model": {"arch": "mlp", "hidden": [16]},
        "data": {"source": "csv", "path": "cancer.csv", "label_column": "diagnosis",
                 "exclude_columns": ["patient_id"]},
        "train": {"epochs": 2, "batch_size": 64},
    }  # fmt: skip
    (root / "cancer.yaml").write_text(json.dumps(recipe))
    for args in (["train", str(root / "cancer.yaml"), "--out", str(root / "a"), "--quiet"],
                 ["export", str(root / "a" / "cancer" / "1")]):  # fmt: skip
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    return root / "a" / "cancer" / "1", header, rows[:4]


def numeric(header: list[str], row: list[str]) -> list[float]:
    """A CSV row as the model's numbers: the features in order, `site` as its category index."""
    cells = dict(zip(header, row, strict=True))
    return [float(SITES.index(cells[n])) if n == "site" else float(cells[n]) for n in header[1:-1]]


def test_info_and_the_card_name_the_columns_and_categories(table) -> None:
    version, header, _ = table
    info = CliRunner().invoke(main, ["info", str(version)])
    assert info.exit_code == 0, info.output
    assert f"columns: {len(header) - 2}: mean_radius, mean_texture" in info.output
    assert "site: 2 categories: left, right" in info.output
    result = CliRunner().invoke(main, ["report", str(version)])
    assert result.exit_code == 0, result.output
    card = (version / "reports" / "model-card.md").read_text()
    assert f"Columns of `input`, in input order ({len(header) - 2}):" in card
    assert "| 0 | `mean_radius` | number |" in card
    assert f"| {len(header) - 3} | `site` | categorical: `left`, `right` |" in card


def test_predict_takes_rows_keyed_by_column_and_a_csv_as_the_numeric_rows(table, tmp_path: Path) -> None:
    version, header, rows = table
    (tmp_path / "rows.json").write_text(json.dumps([numeric(header, r) for r in rows]))
    expected = predict_file(version, tmp_path / "rows.json").outputs["logits"]
    keyed = [{n: (c if n == "site" else float(c)) for n, c in zip(header[1:-1], r[1:-1], strict=True)} for r in rows]
    (tmp_path / "keyed.json").write_text(json.dumps(keyed))
    (tmp_path / "one.json").write_text(json.dumps(keyed[1]))
    (tmp_path / "new.csv").write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    np.testing.assert_array_equal(predict_file(version, tmp_path / "keyed.json").outputs["logits"], expected)
    np.testing.assert_array_equal(predict_file(version, tmp_path / "one.json").outputs["logits"], expected[1:2])
    from_csv = predict_file(version, tmp_path / "new.csv")
    np.testing.assert_array_equal(from_csv.outputs["logits"], expected)
    assert from_csv.notes == ["new.csv: column(s) the model does not take were left out: patient_id, diagnosis"]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.json", '{"mean_radius": 1}', "row 0: missing column(s) ['mean_texture',"),
        ("b.json", "KEYED_WITH_SITE_up", "row 0: column 'site' holds 'up', a category the model was not trained on; "
                                         "its categories are ['left', 'right']"),
        ("c.csv", "mean_radius,site\n1,left\n", "the header has no column(s) ['mean_texture',"),
    ],
)  # fmt: skip
def test_wrong_rows_are_refused_naming_the_column(table, tmp_path: Path, name: str, text: str, message: str) -> None:
    version, header, rows = table
    if text.startswith("KEYED"):
        row = {n: (c if n == "site" else float(c)) for n, c in zip(header[1:-1], rows[0][1:-1], strict=True)}
        text = json.dumps({**row, "site": "up"})
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=None) as caught:
        predict_file(version, tmp_path / name)
    assert message in str(caught.value)


def test_unseen_categories_unknown_sends_a_new_value_as_the_all_zero_index(tmp_path: Path) -> None:
    """data.unseen_categories: unknown: a category the model never saw is answered with that column adding
    nothing (the index past the last category, which the one-hot leaves all zeros), by predict and serve alike;
    the default refuses it (test_wrong_rows_are_refused_naming_the_column)."""
    from pipeline.artifact.directory import Artifact
    from pipeline.serve.protocols.keyed import feature_list, feature_rows
    from pipeline.serve.session import _CategoryColumns

    rng = np.random.default_rng(0)
    lines = ["size,color,label"] + [f"{rng.normal():.3f},{['red', 'blue'][i % 2]},{i % 2}" for i in range(80)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    data = {"source": "csv", "path": "d.csv", "label_column": "label", "unseen_categories": "unknown"}
    recipe = {"name": "colors", "model": {"arch": "mlp", "hidden": [8]}, "train": {"epochs": 1}, "data": data}
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    for args in (["train", str(tmp_path / "r.yaml"), "--repository", str(tmp_path / "a"), "--quiet"],
                 ["export", str(tmp_path / "a" / "colors" / "1")]):  # fmt: skip
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    version = tmp_path / "a" / "colors" / "1"
    (color,) = [f for f in Artifact.load(version).manifest.inputs[0].features if f.categories]
    assert color.categories == ["blue", "red"] and color.unknown_index == 2
    (tmp_path / "numeric.json").write_text(json.dumps([[0.5, 2.0]]))  # the index past the last category
    (tmp_path / "keyed.json").write_text(json.dumps({"size": 0.5, "color": "purple"}))
    expected = predict_file(version, tmp_path / "numeric.json").outputs["logits"]
    np.testing.assert_array_equal(predict_file(version, tmp_path / "keyed.json").outputs["logits"], expected)
    features = tuple(Artifact.load(version).manifest.inputs[0].features)
    assert feature_rows([{"size": 0.5, "color": "purple"}], "input", features) == [[0.5, 2]]  # the server's too
    _CategoryColumns.of(features).check("input", np.array([[0.5, 2.0]], np.float32))  # accepted, not a 400
    assert feature_list(features)[1] == {"name": "color", "categories": ["blue", "red"], "unknown_index": 2}
