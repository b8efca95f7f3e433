"""TF Serving REST against a real `pipe serve` process, over plain HTTP."""

from __future__ import annotations

import httpx
import numpy as np
import orjson
import pytest

from tests.serve.serve_models import embed, mlp, run_reference, sample_inputs


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def test_predict_row_form_matches_onnxruntime(http: httpx.Client) -> None:
    x = sample_inputs(mlp([4, 8, 3]), rows=3, seed=5)["x"]
    for path, seed in (("/v1/models/mlp:predict", 2), ("/v1/models/mlp/versions/1:predict", 1)):
        r = http.post(path, json={"instances": x.tolist()})
        assert r.status_code == 200, r.text
        expected = run_reference(mlp([4, 8, 3], seed=seed), {"x": x})["logits"]
        np.testing.assert_allclose(np.array(r.json()["predictions"]), expected, rtol=1e-5, atol=1e-6)


def test_predict_columnar_and_several_inputs_and_outputs(http: httpx.Client) -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2, np.float32)
    r = http.post("/v1/models/pair:predict", json={"inputs": {"a": a.tolist(), "b": b.tolist()}})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == {"sum": (a + b).tolist(), "prod": (a * b).tolist()}
    rows = [{"a": a[i].tolist(), "b": b[i].tolist()} for i in range(2)]
    r = http.post("/v1/models/pair:predict", json={"instances": rows, "signature_name": "serving_default"})
    assert r.json()["predictions"][1] == {"sum": (a[1] + b[1]).tolist(), "prod": (a[1] * b[1]).tolist()}


def test_predict_int64_model(http: httpx.Client) -> None:
    ids = [[1, 2], [3, 4]]
    r = http.post("/v1/models/embed:predict", json={"inputs": ids})
    expected = run_reference(embed(), {"ids": np.array(ids, np.int64)})
    assert r.json()["outputs"]["doubled"] == expected["doubled"].tolist()
    assert r.json()["outputs"]["vectors"] == expected["vectors"].tolist()


def test_status_and_metadata(http: httpx.Client) -> None:
    status = http.get("/v1/models/mlp").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [("1", "AVAILABLE"), ("2", "AVAILABLE")]
    assert http.get("/v1/models/mlp/versions/1").json()["model_version_status"][0]["version"] == "1"
    meta = http.get("/v1/models/mlp/metadata").json()
    assert meta["model_spec"] == {"name": "mlp", "signature_name": "", "version": "2"}
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    x = signature["inputs"]["x"]
    assert x["dtype"] == "DT_FLOAT" and [d["size"] for d in x["tensor_shape"]["dim"]] == ["-1", "4"]
    assert http.get("/v1/models/mlp/versions/1/metadata").json()["model_spec"]["version"] == "1"


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/models/nope:predict", {"instances": [[1, 2, 3, 4]]}, 404, "unknown model 'nope'"),
        ("/v1/models/mlp/versions/5:predict", {"instances": [[1, 2, 3, 4]]}, 404, "no version 5"),
        ("/v1/models/mlp:predict", {"instances": [[1, 2, 3]]}, 400, "shape [1, 3], the model expects x: FP32[-1, 4]"),
        ("/v1/models/mlp:predict", {"instances": [[1, 2], [3]]}, 400, "do not form a FP32 tensor"),
        ("/v1/models/mlp:predict", {"instances": [["a", 1, 2, 3]]}, 400, "do not form a FP32 tensor"),
        ("/v1/models/mlp:predict", {"rows": [[1, 2, 3, 4]]}, 400, "unknown key(s) ['rows']"),
        ("/v1/models/mlp:predict", {}, 400, "exactly one of 'instances'"),
        ("/v1/models/mlp:predict", {"instances": [[1, 2, 3, 4]], "signature_name": "x"}, 400, "only signature"),
        ("/v1/models/pair:predict", {"inputs": {"a": [[1, 2, 3]]}}, 400, "missing input(s) ['b']"),
        ("/v1/models/pair:predict", {"instances": [{"a": [1, 2, 3]}]}, 400, "exactly the inputs ['a', 'b']"),
        ("/v1/models/embed:predict", {"inputs": [[1.5, 2]]}, 400, "element [0, 0] is 1.5: INT64 takes integers"),
        ("/v1/models/embed:predict", {"inputs": [[True, False]]}, 400, "element [0, 0] is true: INT64 takes JSON"),
    ],
)
def test_errors_name_the_problem(http: httpx.Client, path: str, body: dict, status: int, needle: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_bad_json_and_wrong_method(http: httpx.Client) -> None:
    r = http.post("/v1/models/mlp:predict", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = http.get("/v1/models/mlp:predict")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_predict_strings(http: httpx.Client) -> None:
    r = http.post("/v1/models/strings:predict", json={"instances": ["héllo", "x"]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": ["héllo", "x"]}


def test_row_form_needs_a_shared_batch_dimension() -> None:
    """A model with a per-batch scalar output cannot answer per example: a 400 pointing at the columnar form."""
    from pipeline.serve.errors import RequestError
    from pipeline.serve.protocols.base import Decoded, ModelIO
    from pipeline.serve.protocols.tfserving import TFServing

    protocol, model = TFServing(), ModelIO("m", 1, [], [])
    rows, columns = Decoded({}, None, "instances"), Decoded({}, None, "inputs")
    results = {"scores": np.ones((2, 3), np.float32), "total": np.array(6.0, np.float32)}
    with pytest.raises(RequestError, match=r"do not share a batch dimension.*send the columnar form") as err:
        protocol.encode(model, rows, results)
    assert err.value.status == 400
    assert orjson.loads(protocol.encode(model, columns, results)[0])["outputs"]["total"] == 6.0
    body, headers = protocol.encode(model, rows, {"a": np.arange(2), "b": np.ones((2, 1))})
    assert orjson.loads(body)["predictions"] == [{"a": 0, "b": [1.0]}, {"a": 1, "b": [1.0]}]
    assert headers == {"content-type": "application/json"}
