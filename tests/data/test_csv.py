"""CSV files as people have them: `;` and tabs, string columns, empty cells, decimal commas.

sklearn's bundled wine, written as a CSV inline, trained through the real `pipe train`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.core.errors import InputError, RecipeError
from pipeline.data import load_splits
from pipeline.data.csvfile import sniff_delimiter
from pipeline.recipe.schema import parse_recipe
from pipeline.train.zoo import build_model

CULTIVARS = ["barolo", "grignolino", "barbera"]
REGIONS = ["east", "north", "south"]


def write_wine(path: Path, sep: str, region: bool = True) -> list[str]:
    """Wine's 13 features, a string label and (optionally) a string feature column 'region'."""
    from sklearn.datasets import load_wine

    wine = load_wine()
    rng = np.random.default_rng(0)
    names = [*wine.feature_names, "cultivar"] + (["region"] if region else [])
    lines = [sep.join(names)]
    for row, target in zip(wine.data, wine.target, strict=True):
        cells = [f"{v:g}" for v in row] + [CULTIVARS[target]]
        if region:  # tied to the class two times in three: a feature the model can use
            cells.append(REGIONS[(target + int(rng.random() < 0.33)) % 3])
        lines.append(sep.join(cells))
    path.write_text("\n".join(lines) + "\n")
    return names


def write_recipe(tmp_path: Path, csv_name: str, **data: object) -> Path:
    recipe = {
        "name": "wine-csv",
        "model": {"arch": "mlp", "hidden": [32]},
        "data": {"source": "csv", "path": csv_name, "label_column": "cultivar", **data},
        "train": {"epochs": 8, "batch_size": 16, "lr": 0.01},
    }
    path = tmp_path / "wine.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def recipe(tmp_path: Path, data: dict):
    return parse_recipe({"name": "t", "model": {"arch": "mlp"}, "data": data}, "test", tmp_path)


@pytest.mark.parametrize(("sep", "file"), [(";", "wine.csv"), ("\t", "wine.tsv")])
def test_wine_with_semicolons_or_tabs_trains(tmp_path: Path, sep: str, file: str) -> None:
    names = write_wine(tmp_path / file, sep)
    result = CliRunner().invoke(main, ["train", str(write_recipe(tmp_path, file)), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "a" / "wine-csv" / "1" / "manifest.json").read_text())
    assert manifest["labels"] == sorted(CULTIVARS)  # the string label column: class names in sorted order
    spec = manifest["inputs"][0]
    assert spec["shape"] == ["batch", 14]
    features = [n for n in names if n != "cultivar"]
    assert spec["features"][:13] == [{"name": n} for n in features[:13]]  # the columns, in the file's order
    assert spec["features"][13] == {"name": "region", "categories": REGIONS}
    assert manifest["metrics"]["accuracy"] > 0.8
    assert "tensorboard --logdir" in result.output  # where the curves are


def test_sniffing_and_the_recipe_override(tmp_path: Path) -> None:
    assert sniff_delimiter("a;b;c\n1;2;3\n4;5;6\n") == ";"
    assert sniff_delimiter("a\tb\n1\t2\n") == "\t"
    assert sniff_delimiter("a|b\n1|2\n") == "|"
    assert sniff_delimiter('a,b\n"1,5",2\n') == ","
    assert sniff_delimiter("label\n1\n0\n") == ","  # one column
    assert sniff_delimiter("a;b\n") == ";"  # a header alone
    # European spreadsheets: ';' between fields, a decimal comma inside them
    (tmp_path / "eu.csv").write_text("x;y;label\n" + "".join(f"{i},5;{i};{i % 2}\n" for i in range(40)))
    splits = load_splits(recipe(tmp_path, {"source": "csv", "path": "eu.csv", "label_column": "label"}))
    everything = np.concatenate([splits.train.inputs["input"], splits.val.inputs["input"], splits.test.inputs["input"]])
    assert sorted(everything[:, 0].tolist()) == [i + 0.5 for i in range(40)]
    with pytest.raises(InputError, match=r"label column 'label' is not in .*split on '\|'.*data.delimiter"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "eu.csv", "label_column": "label", "delimiter": "|"}))
    with pytest.raises(RecipeError, match=r"data.delimiter"):
        recipe(tmp_path, {"source": "csv", "path": "eu.csv", "label_column": "label", "delimiter": ":"})
    with pytest.raises(RecipeError, match=r"apply to source 'csv' only"):
        recipe(tmp_path, {"source": "wine", "delimiter": ";"})


def test_string_columns_are_categories_one_hot_inside_the_model(tmp_path: Path) -> None:
    lines = ["size,color,zip,label"] + [
        f"{i / 10},{['red', 'blue', 'green'][i % 3]},{[1000, 2000][i % 2]},{i % 2}" for i in range(60)
    ]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    data = {"source": "csv", "path": "d.csv", "label_column": "label", "categorical_columns": ["zip"]}
    splits = load_splits(recipe(tmp_path, data))
    info = splits.info
    assert info.features == [
        {"name": "size"},
        {"name": "color", "categories": ["blue", "green", "red"]},
        {"name": "zip", "categories": ["1000", "2000"]},  # numbers, but listed in data.categorical_columns
    ]
    assert info.mean[1:] == [0.0, 0.0] and info.std[1:] == [1.0, 1.0]  # indices are never standardized
    x = splits.train.inputs["input"]
    assert set(np.unique(x[:, 1]).tolist()) == {0.0, 1.0, 2.0}
    model = build_model(recipe(tmp_path, data).model, info).eval()
    onehot = model.net[0]  # after the standardization, before the MLP: [B, 3] -> [B, 1 + 3 + 2]
    encoded = onehot(torch.tensor([[0.5, 2.0, 1.0], [0.75, 0.0, 0.0]]))
    assert encoded.tolist() == [[0.5, 0, 0, 1, 0, 1], [0.75, 1, 0, 0, 1, 0]]


def test_a_column_mixing_numbers_and_text_is_refused_at_its_first_text_cell(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x,label\n1,0\n2,1\nabc,0\n4,1\n")
    with pytest.raises(InputError, match=r"d.csv line 4: column 'x' holds 'abc', not a number.*categorical_columns"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "label"}))
    (tmp_path / "ids.csv").write_text("id,label\n" + "".join(f"u{i},{i % 2}\n" for i in range(1200)))
    with pytest.raises(InputError, match=r"column 'id' holds 1200 distinct strings.*data.exclude_columns: \[id\]"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "ids.csv", "label_column": "label"}))


@pytest.mark.parametrize(
    ("cell", "column"), [("", "magnesium"), ("NA", "magnesium"), ("  ", "magnesium"), (None, "cultivar")]
)
def test_an_empty_cell_is_exit_2_naming_line_and_column_and_nothing_is_written(
    tmp_path: Path, cell: str | None, column: str
) -> None:
    names = write_wine(tmp_path / "wine.csv", ";", region=False)
    lines = (tmp_path / "wine.csv").read_text().splitlines()
    row = lines[40].split(";")
    row[names.index(column)] = "" if cell is None else cell
    lines[40] = ";".join(row)
    (tmp_path / "wine.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "a"
    result = CliRunner().invoke(main, ["train", str(write_recipe(tmp_path, "wine.csv")), "--out", str(out)])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert message.count("\n") == 0  # one line
    assert (
        f"wine.csv line 41: column {column!r} is empty" in message
        and "fill it" in message
        and "drop the row" in message
    )
    assert not out.exists() or not any(out.rglob("*"))  # no version directory, nothing at all


def test_a_non_finite_number_is_refused_naming_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x\tlabel\n1\t0\ninf\t1\n")
    with pytest.raises(InputError, match=r"d.csv line 3: column 'x' holds 'inf', not a finite number"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "label"}))


def test_bundled_sets_record_their_feature_names(tmp_path: Path) -> None:
    info = load_splits(
        parse_recipe({"name": "t", "model": {"arch": "mlp"}, "data": {"source": "wine"}}, "t", tmp_path)
    ).info
    assert [f["name"] for f in info.features][:2] == ["alcohol", "malic_acid"] and len(info.features) == 13
    digits = {"name": "t", "model": {"arch": "cnn"}, "data": {"source": "digits", "as_image": True}}
    assert load_splits(parse_recipe(digits, "t", tmp_path)).info.features is None  # an image has no columns


def test_a_column_name_used_twice_or_left_empty_is_refused(tmp_path: Path) -> None:
    # header.index() would read the first 'a' twice, and the second column's values would be lost unseen
    (tmp_path / "dup.csv").write_text("a,label,a\n" + "".join(f"{i},{i % 2},{-i}\n" for i in range(40)))
    with pytest.raises(InputError, match=r"dup.csv: the header names column 'a' 2 times; rename"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "dup.csv", "label_column": "label"}))
    (tmp_path / "twice.csv").write_text("label,a,label\n" + "".join(f"{i % 2},{i},{i % 3}\n" for i in range(40)))
    with pytest.raises(InputError, match=r"twice.csv: the header names column 'label' 2 times"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "twice.csv", "label_column": "label"}))
    (tmp_path / "junk.csv").write_text("a,label,x,x\n" + "".join(f"{i},{i % 2},1,2\n" for i in range(40)))
    unused = {"source": "csv", "path": "junk.csv", "label_column": "label", "feature_columns": ["a"]}
    assert load_splits(recipe(tmp_path, unused)).info.sample_shape == [1]  # a repeated column left out is fine
    (tmp_path / "blank.csv").write_text("a,,label\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(40)))
    with pytest.raises(InputError, match=r"blank.csv: header column 2 has no name.*data.feature_columns"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "blank.csv", "label_column": "label"}))
    used = {"source": "csv", "path": "blank.csv", "label_column": "label", "feature_columns": ["a"]}
    assert load_splits(recipe(tmp_path, used)).info.sample_shape == [1]


@pytest.mark.parametrize(
    ("sep", "cell"), [(",", '"1,234.5"'), (";", "1.234,5"), ("\t", "1 234,5"), (",", '"12,345,678"')]
)
def test_numbers_with_thousands_separators_are_refused_not_made_categories(tmp_path: Path, sep: str, cell: str):
    rows = "".join(f"{i % 2}{sep}{i}{sep}{cell}\n" for i in range(40))
    (tmp_path / "d.csv").write_text(f"label{sep}b{sep}price\n{rows}")
    shown = cell.strip('"')
    with pytest.raises(InputError, match=rf"d.csv line 2: column 'price' holds '{shown}', a number written with"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "label"}))
    (tmp_path / "plain.csv").write_text(
        f"label{sep}b{sep}price\n" + "".join(f"{i % 2}{sep}1.234{sep}{i}\n" for i in range(40))
    )
    assert load_splits(recipe(tmp_path, {"source": "csv", "path": "plain.csv", "label_column": "label"})).info.features[
        0
    ] == {"name": "b"}
    listed = {"source": "csv", "path": "d.csv", "label_column": "label", "categorical_columns": ["price"]}
    assert load_splits(recipe(tmp_path, listed)).info.features[1]["categories"] == [shown]  # codes, if the user says


def test_a_number_beyond_float32_is_refused_naming_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x,label\n1,0\n1e39,1\n" + "".join(f"{i},{i % 2}\n" for i in range(40)))
    with pytest.raises(InputError, match=r"d.csv line 3: column 'x' holds '1e39', beyond float32's range"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "label"}))
