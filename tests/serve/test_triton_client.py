"""KServe V2 against a real `pipe serve` process, through the real tritonclient.http client."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.serve.serve_models import embed, mlp, run_reference, sample_inputs, two_in_two_out


@pytest.fixture(scope="module")
def client(server) -> triton.InferenceServerClient:
    with triton.InferenceServerClient(server.address) as c:
        yield c


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "pipe" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_and_readiness_with_and_without_version(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("mlp")
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}]
    assert meta["parameters"]["providers"] == ["CPUExecutionProvider"]
    assert client.get_model_metadata("mlp", model_version="1")["versions"] == ["1"]
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("mlp", "9") and not client.is_model_ready("nope")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("version", ["1", "2", ""], ids=["v1", "v2", "latest"])
def test_infer_matches_onnxruntime(client: triton.InferenceServerClient, binary: bool, version: str) -> None:
    x = sample_inputs(mlp([4, 8, 3]), rows=5, seed=7)["x"]
    expected = run_reference(mlp([4, 8, 3], seed=int(version or 2)), {"x": x})["logits"]
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = triton.InferRequestedOutput("logits", binary_data=binary)
    result = client.infer("mlp", [inp], model_version=version, outputs=[out], request_id="req-42")
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["model_version"] == (version or "2")
    assert ("parameters" in response["outputs"][0]) is binary  # binary_data_size only for binary outputs


def test_binary_by_default_without_outputs(client: triton.InferenceServerClient) -> None:
    feeds = sample_inputs(two_in_two_out(), rows=3)
    inputs = []
    for name, array in feeds.items():
        inputs.append(triton.InferInput(name, list(array.shape), "FP32"))
        inputs[-1].set_data_from_numpy(array)  # binary_data=True by default
    result = client.infer("pair", inputs)  # no outputs: the client asks for binary_data_output
    np.testing.assert_allclose(result.as_numpy("sum"), feeds["a"] + feeds["b"], rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("prod"), feeds["a"] * feeds["b"], rtol=1e-6)
    assert result.get_response()["id"]  # an id is made when the request has none


def test_output_selection_and_mixed_binary(client: triton.InferenceServerClient) -> None:
    feeds = sample_inputs(two_in_two_out(), rows=2)
    a = triton.InferInput("a", [2, 3], "FP32")
    a.set_data_from_numpy(feeds["a"], binary_data=False)
    b = triton.InferInput("b", [2, 3], "FP32")
    b.set_data_from_numpy(feeds["b"], binary_data=True)
    result = client.infer("pair", [a, b], outputs=[triton.InferRequestedOutput("prod", binary_data=False)])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["prod"]
    assert result.as_numpy("sum") is None
    np.testing.assert_allclose(result.as_numpy("prod"), feeds["a"] * feeds["b"], rtol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_int64_inputs_and_outputs(client: triton.InferenceServerClient, binary: bool) -> None:
    ids = np.array([[1, 9], [0, 3], [4, 4]], dtype=np.int64)
    inp = triton.InferInput("ids", [3, 2], "INT64")
    inp.set_data_from_numpy(ids, binary_data=binary)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("vectors", "doubled")]
    result = client.infer("embed", [inp], outputs=outputs)
    expected = run_reference(embed(), {"ids": ids})
    np.testing.assert_array_equal(result.as_numpy("doubled"), expected["doubled"])
    np.testing.assert_array_equal(result.as_numpy("vectors"), expected["vectors"])
    assert result.as_numpy("doubled").dtype == np.int64


def test_errors_are_4xx_with_a_reason(client: triton.InferenceServerClient) -> None:
    x = np.zeros((1, 4), dtype=np.float32)
    inp = triton.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as info:
        client.infer("nope", [inp])
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException, match="has no version 7") as info:
        client.infer("mlp", [inp], model_version="7")
    assert info.value.status() == "404"
    wrong = triton.InferInput("y", [1, 4], "FP32")
    wrong.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match=r"unknown input\(s\) \['y'\].*x: FP32\[-1, 4\]") as info:
        client.infer("mlp", [wrong])
    assert info.value.status() == "400"
    as_double = triton.InferInput("x", [1, 4], "FP64")
    as_double.set_data_from_numpy(x.astype(np.float64))
    with pytest.raises(InferenceServerException, match="datatype FP64, the model expects x: FP32"):
        client.infer("mlp", [as_double])
    wide = triton.InferInput("x", [1, 5], "FP32")
    wide.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape \[1, 5\], the model expects x: FP32\[-1, 4\]"):
        client.infer("mlp", [wide])
    out_of_range = triton.InferInput("ids", [1, 2], "INT64")
    out_of_range.set_data_from_numpy(np.array([[1, 99]], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="could not run on this input"):
        client.infer("embed", [out_of_range])
    assert client.is_server_live()


def test_server_log_names_provider(server, repository: Path) -> None:
    assert "on ['CPUExecutionProvider']" in server.logs()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_tensors(client: triton.InferenceServerClient, binary: bool) -> None:
    text = np.array(["héllo".encode(), b"", b"a b c"], dtype=object)
    inp = triton.InferInput("text", [3], "BYTES")
    inp.set_data_from_numpy(text, binary_data=binary)
    result = client.infer("strings", [inp], outputs=[triton.InferRequestedOutput("echo", binary_data=binary)])
    got = [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("echo")]  # JSON gives str
    assert got == ["héllo", "", "a b c"]
    not_utf8 = triton.InferInput("text", [1], "BYTES")
    not_utf8.set_data_from_numpy(np.array([b"\xff"], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException, match="not UTF-8"):
        client.infer("strings", [not_utf8])


def test_model_config_as_triton_writes_it(client: triton.InferenceServerClient) -> None:
    """What perf_analyzer and model navigators read first: batch size, inputs without the batch dim."""
    config = client.get_model_config("mlp")
    print(config)  # the report quotes it
    assert config["name"] == "mlp" and config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 64
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [3]}]
    assert config["version_policy"] == {"all": {}} and config["default_model_filename"] == "model.onnx"
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 256
    assert client.get_model_config("mlp", "1")["default_model_filename"] == "model.onnx"
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_config("nope")


def test_inference_statistics_count_what_was_answered(client: triton.InferenceServerClient) -> None:
    before = client.get_inference_statistics("pair", "1")["model_stats"][0]
    feeds = sample_inputs(two_in_two_out(), rows=3)
    inputs = []
    for name, array in feeds.items():
        inputs.append(triton.InferInput(name, list(array.shape), "FP32"))
        inputs[-1].set_data_from_numpy(array)
    for _ in range(2):
        client.infer("pair", inputs)
    after = client.get_inference_statistics("pair", "1")["model_stats"][0]
    assert (after["name"], after["version"]) == ("pair", "1")
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 2
    assert after["inference_count"] == before["inference_count"] + 6  # rows
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    every = client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in every} >= {("mlp", "1"), ("mlp", "2"), ("pair", "1")}
    assert [s["version"] for s in client.get_inference_statistics("mlp")["model_stats"]] == ["1", "2"]


def test_repository_index_lists_every_version(client: triton.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    assert {"name": "mlp", "version": "2", "state": "READY"} in index
    assert {(entry["name"], entry["version"]) for entry in index} >= {("mlp", "1"), ("pair", "1"), ("embed", "1")}
