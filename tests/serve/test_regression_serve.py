"""A regression model from recipe to HTTP: `pipe train` and `pipe export` on models/diabetes-mlp.yaml,
then a real `pipe serve` answering V2 and TF Serving requests with predictions in the target's units."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from tests.serve.serve_process import Server, start_server

RECIPE = Path(__file__).resolve().parents[2] / "models" / "diabetes-mlp.yaml"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    repo = tmp_path_factory.mktemp("artifacts")
    for command in (["train", str(RECIPE), "--out", str(repo), "--epochs", "40", "--quiet"],
                    ["export", str(repo / "diabetes-mlp" / "1")]):  # fmt: skip
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, result.output
    return Artifact.load(repo / "diabetes-mlp" / "1")


@pytest.fixture(scope="module")
def served(artifact: Artifact, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server([artifact.root.parents[1]], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()


def test_v2_and_tf_serving_answer_the_golden_predictions(artifact: Artifact, served: Server) -> None:
    golden = load_golden(artifact)
    x, want = golden.inputs["input"][:5], golden.outputs["predictions"][:5]
    with httpx.Client(base_url=served.url, timeout=30) as http:
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
        answer = http.post("/v2/models/diabetes-mlp/infer", json=body)
        assert answer.status_code == 200, answer.text
        (output,) = answer.json()["outputs"]
        assert (output["name"], output["shape"]) == ("predictions", [5, 1])
        np.testing.assert_allclose(np.asarray(output["data"]).reshape(5, 1), want, rtol=1e-5, atol=1e-3)

        answer = http.post("/v1/models/diabetes-mlp:predict", json={"instances": x.tolist()})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.asarray(answer.json()["predictions"]).reshape(5, 1), want, rtol=1e-5, atol=1e-3)
    # in the target's units (disease progression 25..346), not standardized values around 0
    assert 50 < float(want.mean()) < 250 and artifact.manifest.metrics["r2"] > 0.3
