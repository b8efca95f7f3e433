"""TF Serving rows keyed by column name, against a real `pipe serve` of a model trained on a CSV.

Wine written with ';' and a string column 'region', trained and exported by the real commands; the
keyed request must get exactly the answer of the row form, which is onnxruntime's on the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from tests.serve.serve_process import Server, start_server

REGIONS = ["east", "north", "south"]


@pytest.fixture(scope="module")
def wine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[list[str]]]:
    """artifacts/wine-csv/1, exported, and the CSV's header and first rows as text."""
    from sklearn.datasets import load_wine

    root = tmp_path_factory.mktemp("keyed")
    data = load_wine()
    header = [*data.feature_names, "region", "cultivar"]
    rows = [
        [f"{v:g}" for v in x] + [REGIONS[(t + i % 2) % 3], ["barolo", "grignolino", "barbera"][t]]
        for i, (x, t) in enumerate(zip(data.data, data.target, strict=True))
    ]
    (root / "wine.csv").write_text("\n".join(";".join(r) for r in [header, *rows]) + "\n")
    recipe = {
        "name": "wine-csv",
        "model": {"arch": "mlp", "hidden": [16]},
        "data": {"source": "csv", "path": "wine.csv", "label_column": "cultivar"},
        "train": {"epochs": 3, "batch_size": 32},
    }
    (root / "wine.yaml").write_text(json.dumps(recipe))
    artifacts = root / "artifacts"
    for args in (
        ["train", str(root / "wine.yaml"), "--out", str(artifacts), "--quiet"],
        ["export", str(artifacts / "wine-csv" / "1")],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    return artifacts, header, rows[:5]


@pytest.fixture(scope="module")
def http(wine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    running: Server = start_server([wine[0]], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    with httpx.Client(base_url=running.url, timeout=30) as client:
        yield client
    running.stop()


def test_keyed_instances_get_the_answer_of_the_row_form(wine, http: httpx.Client) -> None:
    import onnxruntime as ort

    artifacts, header, rows = wine
    features = header[:-1]  # every column but the label, in the file's order
    keyed = [
        {name: (cell if name == "region" else float(cell)) for name, cell in zip(features, row, strict=False)}
        for row in rows
    ]
    coded = [[REGIONS.index(v) if k == "region" else v for k, v in instance.items()] for instance in keyed]
    named = [list(instance.values()) for instance in keyed]  # a row naming its category
    shuffled = [dict(reversed(list(instance.items()))) for instance in keyed]  # keys in any order
    answers = []
    for instances in (coded, keyed, named, shuffled):
        r = http.post("/v1/models/wine-csv:predict", json={"instances": instances})
        assert r.status_code == 200, r.text
        answers.append(r.json()["predictions"])
    assert answers[1] == answers[0] and answers[2] == answers[0] and answers[3] == answers[0]
    session = ort.InferenceSession(str(artifacts / "wine-csv" / "1" / "model.onnx"))
    expected = session.run(None, {"input": np.array(coded, dtype=np.float32)})[0]
    np.testing.assert_allclose(np.array(answers[0]), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            lambda x: x.update(region="west"),
            "column 'region' holds 'west', not one of its categories ['east', 'north', 'south']",
        ),
        (lambda x: x.update(region=3), "column 'region' holds 3, not one of its categories"),
        (
            lambda x: x.pop("alcohol"),
            "instances[0]: missing column(s) ['alcohol']; input 'input' takes the columns ['alcohol', ",
        ),
        (lambda x: x.update(alcool=1.0), "instances[0]: unknown column(s) ['alcool']"),
    ],
)
def test_a_wrong_keyed_instance_is_a_400_naming_the_column(wine, http: httpx.Client, change, needle: str) -> None:
    _, header, rows = wine
    instance = {
        name: (cell if name == "region" else float(cell)) for name, cell in zip(header[:-1], rows[0], strict=False)
    }
    change(instance)
    r = http.post("/v1/models/wine-csv:predict", json={"instances": [instance]})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


@pytest.mark.parametrize("index", [3, -1, 1.5])
def test_a_category_index_out_of_range_is_a_400_on_every_protocol(wine, http: httpx.Client, index: float) -> None:
    """V2 and TF Serving's columnar form carry the numeric row as is: an index the model has no
    category for would one-hot encode to zeros and be answered; the server refuses it instead."""
    _, header, rows = wine
    features = header[:-1]  # every column but the label
    row = [
        float(REGIONS.index(cell) if name == "region" else cell) for name, cell in zip(features, rows[0], strict=False)
    ]
    row[header.index("region")] = index
    needle = (
        f"input 'input': column 'region' (feature {header.index('region')}) holds category index {index:g} "
        "in row 0; valid indices are the whole numbers 0..2 (categories ['east', 'north', 'south'])"
    )
    v2 = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, len(row)], "data": row}]}
    for path, body, wanted in (
        ("/v2/models/wine-csv/infer", v2, needle),
        ("/v1/models/wine-csv:predict", {"inputs": [row]}, needle),
        ("/v1/models/wine-csv:predict", {"instances": [row]}, "column 'region' holds"),  # refused by name
    ):
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert wanted in r.json()["error"], (path, r.text)


def test_metadata_names_the_columns_and_their_categories(wine, http: httpx.Client) -> None:
    """A client learns the columns to key a row by, and the categories a string column takes, from metadata."""
    _, header, _ = wine
    expected = [{"name": n, **({"categories": REGIONS} if n == "region" else {})} for n in header[:-1]]
    v2 = http.get("/v2/models/wine-csv").json()
    assert v2["inputs"][0]["parameters"]["features"] == expected
    tf = http.get("/v1/models/wine-csv/metadata").json()
    assert tf["metadata"]["features"] == {"input": expected}
