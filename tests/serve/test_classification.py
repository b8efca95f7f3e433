"""Labels, classification, probabilities and token limits against a real `pipe serve` process.

Through the real tritonclient.http (the classification extension, JSON and binary) and plain HTTP
(TF Serving's `:classify` and metadata), compared with onnxruntime run on the same inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.serve.classify_models import (
    DIGIT_NAMES,
    MAX_LENGTH,
    VOCAB,
    digits,
    digits_classifier,
    token_classifier,
    write_repository,
)
from tests.serve.serve_models import run_reference
from tests.serve.serve_process import Server, start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("classify") / "artifacts"
    write_repository(repo)
    running = start_server([repo], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(served: Server) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(served.address) as c:
        yield c


@pytest.fixture(scope="module")
def http(served: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as c:
        yield c


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _digits(rows: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Held-out digits (the classifier was fitted on the first 1200) and onnxruntime's logits on them."""
    x = digits()[0][1500 : 1500 + rows]
    return x, run_reference(digits_classifier(), {"x": x})["logits"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_class_count_gives_onnxruntimes_top3(client: triton.InferenceServerClient, binary: bool) -> None:
    x, logits = _digits()
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = triton.InferRequestedOutput("logits", binary_data=binary, class_count=3)
    answer = client.infer("digits", [inp], outputs=[out]).as_numpy("logits")

    assert answer.shape == (12, 3)
    top3 = np.argsort(-logits, axis=1, kind="stable")[:, :3]
    for row, expected in zip(answer, top3, strict=True):
        fields = [(b if isinstance(b, bytes) else b.encode()).decode().split(":") for b in row]
        assert [int(f[1]) for f in fields] == expected.tolist()
        assert [f[2] for f in fields] == [DIGIT_NAMES[i] for i in expected]
    first = answer[0][0]
    first = first.decode() if isinstance(first, bytes) else first
    assert first == f"{logits[0, top3[0, 0]]:f}:{top3[0, 0]}:{DIGIT_NAMES[top3[0, 0]]}"  # Triton's %f score
    # the classifier is real: its top-1 on held-out digits is mostly right
    assert (top3[:, 0] == digits()[1][1500:1512]).mean() >= 0.8


def test_probabilities_are_a_softmax_only_when_asked(client: triton.InferenceServerClient) -> None:
    x, logits = _digits(4)
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    raw = client.infer("digits", [inp]).as_numpy("logits")
    np.testing.assert_allclose(raw, logits, rtol=1e-5, atol=1e-5)  # not normalized unless asked

    probs = client.infer("digits", [inp], parameters={"probabilities": True}).as_numpy("logits")
    np.testing.assert_allclose(probs, _softmax(logits), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)

    out = triton.InferRequestedOutput("logits", class_count=2)
    top = client.infer("digits", [inp], outputs=[out], parameters={"probabilities": True}).as_numpy("logits")
    best = np.argmax(logits[0])
    assert top[0][0].decode() == f"{_softmax(logits)[0, best]:f}:{best}:{DIGIT_NAMES[best]}"


def test_classification_without_labels_is_score_and_index(http: httpx.Client) -> None:
    body = {
        "inputs": [
            {"name": "a", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]},
            {"name": "b", "shape": [1, 3], "datatype": "FP32", "data": [1.5, 3, -1]},
        ],
        "outputs": [{"name": "scores", "parameters": {"classification": 5}}],  # more than there are: all 3
    }
    r = http.post("/v2/models/summed/infer", json=body)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 3]
    assert out["data"] == ["3.000000:1", "1.500000:0", "-1.000000:2"]


def test_classification_of_an_empty_batch_is_an_empty_answer(http: httpx.Client) -> None:
    """A batch of 0 rows is a valid request (V2 takes shape [0, 64]); its classes are [0, k], not a 500."""
    body = {
        "inputs": [{"name": "x", "shape": [0, 64], "datatype": "FP32", "data": []}],
        "outputs": [{"name": "logits", "parameters": {"classification": 3}}],
    }
    r = http.post("/v2/models/digits/infer", json=body)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [0, 3] and out["data"] == []


@pytest.mark.parametrize(
    ("model", "parameters", "needle"),
    [
        ("digits", {"classification": 0}, "classification must be the number of classes to return"),
        ("digits", {"classification": "3"}, "classification must be the number of classes to return"),
        ("digits", {"classification": True}, "classification must be the number of classes to return"),
        ("digits", {"probabilities": "yes"}, "probabilities must be true or false"),
        ("flags", {"classification": 1}, "output 'negated' is BOOL; classification ranks numeric scores"),
        ("flags", {"probabilities": True}, "probabilities are a softmax of float scores"),
    ],
)
def test_bad_classification_parameters_are_400(http: httpx.Client, model: str, parameters: dict, needle: str) -> None:
    inputs = {
        "digits": {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64},
        "flags": {"name": "flags", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
    }[model]
    output = "logits" if model == "digits" else "negated"
    body = {"inputs": [inputs], "outputs": [{"name": output, "parameters": parameters}]}
    r = http.post(f"/v2/models/{model}/infer", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


def test_tf_serving_classify(http: httpx.Client) -> None:
    x, logits = _digits(3)
    r = http.post("/v1/models/digits:classify", json={"examples": [{"x": row} for row in x.tolist()]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 3
    for result, row in zip(results, logits, strict=True):
        assert [label for label, _ in result] == DIGIT_NAMES  # every class, in the model's order
        np.testing.assert_allclose([score for _, score in result], row, rtol=1e-5, atol=1e-5)

    r = http.post("/v1/models/digits/versions/1:classify", json={"instances": x.tolist(), "probabilities": True})
    assert r.status_code == 200, r.text
    scores = np.array([[score for _, score in result] for result in r.json()["results"]])
    np.testing.assert_allclose(scores, _softmax(logits), rtol=1e-4, atol=1e-6)


def test_tf_serving_classify_context_and_refusals(http: httpx.Client) -> None:
    r = http.post("/v1/models/summed:classify", json={"context": {"a": [1, 1, 1]}, "examples": [{"b": [0, 2, 1]}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [[["", 1.0], ["", 3.0], ["", 2.0]]]}  # no labels: "" as in TF Serving

    for body, needle in [
        ({"examples": [{"a": [1, 1, 1], "b": [0, 2, 1]}], "context": {"a": [0, 0, 0]}}, "repeats ['a']"),
        ({"examples": [], "instances": []}, "send exactly one of 'examples' or 'instances'"),
        ({"examples": []}, "examples must be a non-empty list"),  # named as sent, not "instances"
        ({"examples": [{"b": [0, 2, 1]}], "context": {"a": [1, 1, 1]}, "x": 1}, "unknown"),
        ({"examples": [[0, 2, 1]], "context": {"a": [1, 1, 1]}}, "with a context, examples must be a list of objects"),
        ({"examples": [{"b": [0, 2, 1]}], "context": {"c": 1}}, "context must be an object holding some of"),
        ({"examples": [{"a": [1, 1, 1], "b": [0, 2, 1]}], "probabilities": 1}, "probabilities must be true or false"),
    ]:
        r = http.post("/v1/models/summed:classify", json=body)
        assert r.status_code == 400, (body, r.text)
        assert needle in r.json()["error"], r.text
    r = http.post("/v1/models/flags:classify", json={"instances": [[True, False]]})
    assert r.status_code == 400 and "classification ranks numeric scores" in r.json()["error"]
    assert http.get("/v1/models/digits:classify").status_code == 405


def test_labels_and_token_limits_in_metadata(client: triton.InferenceServerClient, http: httpx.Client) -> None:
    assert "classification" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("digits")
    assert meta["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": [-1, 10], "parameters": {"labels": DIGIT_NAMES}}
    ]
    assert "parameters" not in meta["inputs"][0]
    tokens = client.get_model_metadata("tokens")["inputs"][0]
    assert tokens["parameters"] == {"vocab_size": VOCAB, "max_sequence_length": MAX_LENGTH, "padding_id": 0}

    tf = http.get("/v1/models/digits/metadata").json()["metadata"]
    assert tf["labels"] == {"logits": DIGIT_NAMES}
    tf = http.get("/v1/models/tokens-nopad/metadata").json()["metadata"]
    assert tf["tokens"] == {"ids": {"vocab_size": VOCAB, "max_sequence_length": None, "padding_id": None}}


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        (
            [[1, 2, 3, 4, 5, 6, 7]],
            f"sequences of 7 tokens are longer than the model's max_sequence_length {MAX_LENGTH}",
        ),
        ([[1, 2, -1]], f"token id -1 at [0, 2] is outside the vocabulary: ids must be in [0, {VOCAB})"),
        ([[1, 2], [3, VOCAB]], f"token id {VOCAB} at [1, 1] is outside the vocabulary"),
    ],
    ids=["too-long", "negative", "past-vocab"],
)
def test_token_limits_are_400_naming_the_limit(
    client: triton.InferenceServerClient, http: httpx.Client, ids, needle
) -> None:
    array = np.array(ids, dtype=np.int64)
    for binary in (True, False):
        inp = triton.InferInput("ids", list(array.shape), "INT64")
        inp.set_data_from_numpy(array, binary_data=binary)
        with pytest.raises(InferenceServerException, match=r"\[400\]") as err:
            client.infer("tokens", [inp])
        assert needle in str(err.value)
    r = http.post("/v1/models/tokens:predict", json={"instances": ids})
    assert r.status_code == 400 and needle in r.json()["error"], r.text


def test_tf_serving_pads_ragged_token_rows_with_the_recorded_padding_id(http: httpx.Client) -> None:
    padded = np.array([[1, 2, 0, 0], [4, 5, 6, 7]], dtype=np.int64)
    expected = run_reference(token_classifier(), {"ids": padded})["logits"]
    for body in ({"instances": [[1, 2], [4, 5, 6, 7]]}, {"inputs": [[1, 2], [4, 5, 6, 7]]}):
        r = http.post("/v1/models/tokens:predict", json=body)
        assert r.status_code == 200, r.text
        answer = r.json().get("predictions", r.json().get("outputs"))
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)

    r = http.post("/v1/models/tokens-nopad:predict", json={"instances": [[1, 2], [4, 5, 6, 7]]})
    assert r.status_code == 400
    assert "rows hold 2 to 4 tokens, and this model records no padding id" in r.json()["error"]
    r = http.post("/v1/models/tokens-nopad:predict", json={"instances": [[1, 2, 0, 0], [4, 5, 6, 7]]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("model", "datatype", "shape", "data", "needle"),
    [
        ("digits", "FP32", [1, 64], [None] + [0] * 63, "element [0] is null: FP32 takes JSON numbers"),
        ("digits", "FP32", [1, 64], [0] * 5 + ["1.5"] + [0] * 58, "element [5] is '1.5': FP32 takes JSON numbers"),
        ("digits", "FP32", [1, 64], [[0.5] * 63 + [True]], "element [0, 63] is true: FP32 takes JSON numbers"),
        ("digits", "FP32", [1, 64], [0] * 63 + [1e39], "element [63] is 1e+39: out of range for FP32"),
        ("tokens", "INT64", [1, 2], [1, 2.5], "element [1] is 2.5: INT64 takes integers"),
        ("tokens", "INT64", [1, 2], [1, 2**63], f"element [1] is {2**63}: out of range for INT64"),
        ("flags", "BOOL", [1, 2], [1, 0], "element [0] is 1: BOOL takes JSON true or false"),
        ("flags", "BOOL", [1, 2], [True, None], "element [1] is null: BOOL takes JSON true or false"),
    ],
    ids=[
        "null",
        "string",
        "bool-in-floats",
        "fp32-overflow",
        "fraction",
        "int64-overflow",
        "int-for-bool",
        "null-bool",
    ],
)
def test_json_values_must_fit_the_datatype(http: httpx.Client, model, datatype, shape, data, needle) -> None:
    name = {"digits": "x", "tokens": "ids", "flags": "flags"}[model]
    body = {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}
    r = http.post(f"/v2/models/{model}/infer", json=body)
    assert r.status_code == 400, r.text
    assert f"input {name!r}" in r.json()["error"] and needle in r.json()["error"], r.text


def test_tf_serving_values_must_fit_the_datatype(http: httpx.Client) -> None:
    r = http.post("/v1/models/digits:predict", json={"instances": [[0] * 63 + [None]]})
    assert r.status_code == 400
    assert "input 'x'" in r.json()["error"] and "element [0, 63] is null" in r.json()["error"]
    r = http.post("/v1/models/flags:predict", json={"inputs": [[True, False], [False, "true"]]})
    assert r.status_code == 400 and "element [1, 1] is 'true'" in r.json()["error"]
    r = http.post("/v1/models/flags:predict", json={"inputs": [[True, False]]})
    assert r.status_code == 200 and r.json() == {"outputs": [[False, True]]}


def test_server_still_answers_after_every_refusal(client: triton.InferenceServerClient, served: Server) -> None:
    assert client.is_server_live() and client.is_model_ready("digits")
    assert "Traceback" not in served.logs()


def test_manifest_tokens_record_is_validated(tmp_path: Path) -> None:
    from pipeline.artifact.manifest import Manifest
    from pipeline.core.errors import ArtifactError

    base = {
        "schema_version": 2,
        "name": "m",
        "version": 1,
        "task": "classification",
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 3]}],
    }
    tokens = {"name": "ids", "dtype": "int64", "shape": ["batch", "sequence"], "layout": "NT"}
    ok = Manifest.from_dict(
        {**base, "inputs": [{**tokens, "tokens": {"vocab_size": 10, "max_length": 6, "padding_id": 0}}]}
    )
    assert ok.inputs[0].tokens is not None and ok.inputs[0].tokens.max_length == 6
    assert Manifest.from_dict({**base, "inputs": [tokens]}).inputs[0].tokens is None  # optional: older manifests
    assert "tokens" not in Manifest.from_dict({**base, "inputs": [tokens]}).to_dict()["inputs"][0]
    for bad, needle in [
        ({"vocab_size": 0}, "inputs[0].tokens.vocab_size: expected a number >= 1, got 0"),
        ({"vocab_size": "10"}, "inputs[0].tokens.vocab_size: expected an integer"),
        ({"vocab_size": 10, "padding_id": 10}, "inputs[0].tokens.padding_id: 10 is not an id in [0, 10)"),
        ({"vocab_size": 10, "max_len": 6}, "inputs[0].tokens: unknown key(s) ['max_len']"),
    ]:
        with pytest.raises(ArtifactError, match=None) as err:
            Manifest.from_dict({**base, "inputs": [{**tokens, "tokens": bad}]})
        assert needle in str(err.value)
    with pytest.raises(ArtifactError, match="token ids are integers"):
        Manifest.from_dict({**base, "inputs": [{**tokens, "dtype": "float32", "tokens": {"vocab_size": 10}}]})
