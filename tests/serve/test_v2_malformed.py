"""Hand-made V2 bodies, well formed and not, sent as raw bytes to a real server: 4xx, never 5xx."""

from __future__ import annotations

import struct

import httpx
import numpy as np
import orjson
import pytest

from pipeline.serve.protocols.binary import decode_tensor, encode_tensor
from tests.serve.serve_models import mlp, run_reference

X = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def binary_body(header: dict, tail: bytes) -> tuple[bytes, dict[str, str]]:
    raw = orjson.dumps(header)
    return raw + tail, {"Inference-Header-Content-Length": str(len(raw))}


def x_header(size: int | None = None, shape: list[int] | None = None, datatype: str = "FP32") -> dict:
    tensor = {"name": "x", "shape": shape or [2, 4], "datatype": datatype}
    tensor["parameters"] = {"binary_data_size": X.nbytes if size is None else size}
    return {"inputs": [tensor]}


def test_json_without_content_type_and_binary_response(http: httpx.Client) -> None:
    request = {"id": "no-ct", "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.tolist()}]}
    request["parameters"] = {"binary_data_output": True}
    r = http.post("/v2/models/mlp/versions/1/infer", content=orjson.dumps(request))  # no Content-Type
    assert r.status_code == 200, r.text
    size = int(r.headers["inference-header-content-length"])
    header = orjson.loads(r.content[:size])
    assert header["id"] == "no-ct" and header["outputs"][0]["parameters"]["binary_data_size"] == 2 * 3 * 4
    logits = np.frombuffer(r.content[size:], dtype="<f4").reshape(2, 3)
    np.testing.assert_allclose(logits, run_reference(mlp([4, 8, 3], seed=1), {"x": X})["logits"], rtol=1e-5)


def test_well_formed_binary_request(http: httpx.Client) -> None:
    body, headers = binary_body(x_header(), X.tobytes())
    r = http.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"  # no binary output asked for: plain JSON


MALFORMED = [
    ("header length not a number", b"{}", {"Inference-Header-Content-Length": "ten"}, "must be an integer"),
    ("header length past the body", b"{}", {"Inference-Header-Content-Length": "99"}, "the body holds 2 bytes"),
    ("header length negative", b"{}", {"Inference-Header-Content-Length": "-1"}, "the body holds 2 bytes"),
    ("header cut inside JSON", *binary_body(x_header(), X.tobytes())[:1], {"Inference-Header-Content-Length": "5"},
     "not valid JSON"),
    ("size shorter than the shape", *binary_body(x_header(size=16), X.tobytes()[:16]), "needs 32 (8 elements"),
    ("size past the end", *binary_body(x_header(size=64), X.tobytes()), "runs past the end"),
    ("extra bytes after tensors", *binary_body(x_header(), X.tobytes() + b"junk"), "declare 32"),
    ("negative size", *binary_body(x_header(size=-4), X.tobytes()), "non-negative integer"),
    ("size is a string", *binary_body(x_header(size="32"), X.tobytes()), "non-negative integer"),  # type: ignore[arg-type]
    ("shape disagrees with size", *binary_body(x_header(shape=[3, 4]), X.tobytes()), "needs 48"),
    ("BYTES prefix truncated", *binary_body(x_header(size=3, shape=[1], datatype="BYTES"), b"\x01\x00\x00"),
     "inside a 4-byte length"),
    ("BYTES element too long", *binary_body(x_header(size=6, shape=[1], datatype="BYTES"),
                                           struct.pack("<I", 50) + b"ab"), "past the end"),
    ("unknown datatype", *binary_body(x_header(datatype="FP128"), X.tobytes()), "unsupported datatype 'FP128'"),
    ("wrong datatype for the model", *binary_body(x_header(size=32, shape=[2, 2], datatype="FP64"), X.tobytes()),
     "datatype FP64, the model expects x: FP32"),
    ("shape with negative dim", *binary_body(x_header(shape=[-2, 4]), X.tobytes()), "non-negative integers"),
    # zero elements, but dims numpy cannot shape (their product overflows): a 400, not a 500
    ("shape with huge dims and a zero", *binary_body(x_header(size=0, shape=[2**62, 2**62, 0]), b""),
     "more elements than a tensor can hold"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "headers", "needle"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_binary_bodies_get_400(http: httpx.Client, body: bytes, headers: dict, needle: str) -> None:
    r = http.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


JSON_ERRORS = [
    (b"[1, 2", "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (b'{"inputs": []}', "non-empty list"),
    (b'{"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32"}]}', "neither data nor"),
    (b'{"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2]}]}', "needs 8 elements"),
    (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ["a", 1, 2, 3]}]}', "does not fit"),
    (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2], [3]]}]}', "does not fit"),
    (b'{"id": 5, "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}', "id must"),
    (b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],'
     b' "outputs": [{"name": "probs"}]}', "unknown output(s) ['probs']"),
    (b'{"inputs": [{"name": "x", "shape": [100, 4], "datatype": "FP32", "data": ' + str([0] * 400).encode() + b"}]}",
     "more than this model's max batch size 64"),
    (b'{"inputs": [{"name": "x", "shape": [4611686018427387904, 4611686018427387904, 0], "datatype": "FP32",'
     b' "data": []}]}', "more elements than a tensor can hold"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "needle"), JSON_ERRORS)
def test_malformed_json_gets_400(http: httpx.Client, body: bytes, needle: str) -> None:
    r = http.post("/v2/models/mlp/infer", content=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


@pytest.mark.parametrize(
    ("data", "needle"),
    [([1.5, 2], "element [0] is 1.5: INT64 takes integers"), ([True, False], "element [0] is true: INT64 takes JSON")],
    ids=["fraction", "boolean"],
)
def test_json_data_is_not_cast_silently_to_an_integer_datatype(http: httpx.Client, data: list, needle: str) -> None:
    body = {"inputs": [{"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": data}]}
    r = http.post("/v2/models/embed/infer", json=body)
    assert r.status_code == 400, r.text
    assert "input 'ids': data does not fit datatype INT64" in r.json()["error"] and needle in r.json()["error"]


def test_server_healthy_after_malformed_input(http: httpx.Client, server) -> None:
    assert http.get("/v2/health/ready").status_code == 200
    assert "Traceback" not in server.logs()


@pytest.mark.parametrize(
    "array",
    [
        np.array([[b"ab", b""], [b"\x00\xff", b"xyz"]], dtype=object),
        np.array([True, False, True]),
        np.arange(6, dtype=np.float16).reshape(2, 3),
        np.array([2**63 - 1, -(2**63)], dtype=np.int64),
        np.arange(4, dtype=np.uint8),
    ],
    ids=["bytes", "bool", "fp16", "int64", "uint8"],
)
def test_binary_codec_round_trip(array: np.ndarray) -> None:
    raw = encode_tensor(array)
    back = decode_tensor(memoryview(raw), "t", array.dtype, list(array.shape))
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tolist() == array.tolist()
