"""One request must not freeze the server: long texts, and millions of BYTES elements (binary or JSON), each
sent beside a health probe (GET /v2/health/live every ~50 ms) whose worst wait must stay under a second;
the server's peak memory is printed with it (pytest -s). Also: strings under a BYTES `input_ids`, as
docs/http-api.md shows them, and a tokenizer that panics, refused with a 400."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pytest

from tests.serve.health_probe import HealthProbe
from tests.serve.serve_models import mlp, write_artifact
from tests.serve.serve_process import Server, start_server
from tests.serve.text_model import DIM, import_text_model

WORST_WAIT_S = 1.0  # generous for a shared 2-core machine: a held event loop shows as seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """mlp (FP32 [-1, 4] only), text (a tokenizer, max length 16) and panics (a tokenizer whose regex gives up)."""
    base = tmp_path_factory.mktemp("freezes")
    repo = base / "artifacts"
    write_artifact(repo, "mlp", 1, mlp([4, 8, 3], seed=1))
    import_text_model(repo, "text", base / "scratch")
    import_text_model(repo, "panics", base / "scratch", backtracking=True)
    running = start_server([repo], base / "serve.log", "--poll", "0")
    yield running
    running.stop()


def binary_request(name: str, elements: list[bytes] | None = None, raw: bytes | None = None, count: int = 0) -> tuple[
        bytes, dict[str, str]]:  # fmt: skip
    """A V2 binary request of one BYTES input: `elements` length-prefixed, or `raw` as the tensor bytes
    declared as `count` elements."""
    if elements is not None:
        raw, count = b"".join(struct.pack("<I", len(e)) + e for e in elements), len(elements)
    assert raw is not None
    inputs = [{"name": name, "datatype": "BYTES", "shape": [count], "parameters": {"binary_data_size": len(raw)}}]
    header = orjson.dumps({"inputs": inputs})
    return header + raw, {"inference-header-content-length": str(len(header)),
                          "content-type": "application/octet-stream"}  # fmt: skip


def embedding(http: httpx.Client, texts: list[str]) -> np.ndarray:
    answer = http.post("/v2/models/text/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()["outputs"][0]["data"], np.float32).reshape(len(texts), DIM)


def test_sixteen_texts_of_a_megabyte_are_cut_before_tokenizing(server: Server) -> None:
    long_text = ("the cat sat on the mat " * 46_000)[: 2**20].encode()  # 1 MiB, ~276,000 words
    body, headers = binary_request("text", [long_text] * 16)
    with httpx.Client(base_url=server.url, timeout=60) as http, HealthProbe(server) as probe:
        started = time.perf_counter()
        answer = http.post("/v2/models/text/infer", content=body, headers=headers)
        took = time.perf_counter() - started
        short = embedding(http, [" ".join(["the cat sat on the mat"] * 3)])  # 18 words: cut to 16 tokens too
    print(f"16 x 1 MiB texts in V2 binary: {answer.status_code} in {took:.2f} s; {probe.report()}")
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json()["outputs"][0]["data"], np.float32).reshape(16, DIM)
    np.testing.assert_allclose(got, np.repeat(short, 16, axis=0), atol=1e-5)  # the same 16 tokens
    assert probe.failed == [] and probe.worst_s < WORST_WAIT_S, probe.report()
    assert probe.peak_rss_mb < 600, probe.report()


def test_millions_of_bytes_elements_are_refused_before_decoding(server: Server) -> None:
    count = 15_700_000  # empty elements: 4 bytes each, 62.8 MB
    body, headers = binary_request("x", raw=bytes(4 * count), count=count)
    strings = b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [%d], "data": [' % count
    strings += b",".join([b'""'] * count) + b"]}]}"  # the same as JSON strings: 47 MB
    with httpx.Client(base_url=server.url, timeout=60) as http, HealthProbe(server) as probe:
        started = time.perf_counter()
        as_binary = http.post("/v2/models/mlp/infer", content=body, headers=headers)
        binary_s = time.perf_counter() - started
        started = time.perf_counter()
        as_json = http.post("/v2/models/mlp/infer", content=strings, headers={"content-type": "application/json"})
        json_s = time.perf_counter() - started
        time.sleep(0.2)  # a probe after the last answer
    print(f"15.7M BYTES elements to an FP32 model: binary {as_binary.status_code} in {binary_s:.2f} s, "
          f"JSON {as_json.status_code} in {json_s:.2f} s; {probe.report()}")  # fmt: skip
    assert (
        as_binary.status_code == 400 and "holds 15700000 rows, more than this model's max batch size" in as_binary.text
    )
    assert as_json.status_code == 400 and "more than any request model 'mlp' takes can hold" in as_json.text
    assert probe.failed == [] and probe.worst_s < WORST_WAIT_S, probe.report()


def test_strings_under_a_bytes_input_ids_are_texts(server: Server) -> None:
    texts = ["the cat sat", "a dog ran on the mat"]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        by_ids = http.post("/v2/models/text/infer", json={"inputs": [
            {"name": "input_ids", "datatype": "BYTES", "shape": [2], "data": texts}]})  # fmt: skip
        want = embedding(http, texts)
    assert by_ids.status_code == 200, by_ids.text
    np.testing.assert_allclose(np.array(by_ids.json()["outputs"][0]["data"]).reshape(2, DIM), want, atol=1e-6)


def test_a_tokenizer_that_panics_is_a_400_naming_the_text(server: Server) -> None:
    texts = ["the cat", "a" * 40 + " b"]  # `(a+)+$` backtracks past the regex engine's limit on the a's
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.post("/v2/models/panics/infer", json={"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": texts}]})  # fmt: skip
        fine = http.post("/v1/models/panics:predict", json={"instances": ["the cat sat"]})
    assert answer.status_code == 400, answer.text
    assert "the tokenizer failed on text 1 (" in answer.json()["error"]
    assert fine.status_code == 200, fine.text  # the tokenizer still works after its panic


def test_a_text_cut_inside_a_character_loses_the_character_not_the_request() -> None:
    from pipeline.serve.errors import RequestError
    from pipeline.serve.text import _text

    right = ("a" + "é" * 10).encode()  # 21 bytes; 3 characters take at most 12 of them
    assert _text(right, "text", 0, 3, left=False) == "a" + "é" * 5  # the 12th byte began a 6th é: dropped
    left = ("é" * 10 + "a").encode()
    assert _text(left, "text", 0, 3, left=True) == "é" * 5 + "a"  # the first byte kept was inside an é
    with pytest.raises(RequestError, match="row 2: the text is not UTF-8"):
        _text(b"\xff" + b"a" * 20, "text", 2, 3, left=False)


def test_json_bodies_are_counted_against_what_the_model_can_take() -> None:
    from pipeline.artifact.tensors import TokenInput
    from pipeline.serve.errors import RequestError
    from pipeline.serve.protocols.base import ModelIO
    from pipeline.serve.protocols.bounds import check_counts
    from pipeline.serve.protocols.datatypes import IOSpec

    def body(data: list, datatype: str = "FP32", pad: int = 0) -> bytes:
        entry = {"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}
        return orjson.dumps({"inputs": [entry]}) + b" " * pad

    table = ModelIO("table", 1, [IOSpec("x", "FP32", (-1, 4))], [], max_rows=64)
    check_counts(body([[0.5] * 4] * 64, pad=300_000), table)  # the most it takes, padded past the bound: fine
    with pytest.raises(RequestError, match=r"at least 100003 values, more than any request model 'table' takes"):
        check_counts(body([0.5] * 100_000), table)
    with pytest.raises(RequestError, match="about 100007 strings"):  # 300 KB of "", "", ...
        check_counts(body([""] * 100_000, "BYTES"), table)
    ragged = ModelIO("s", 1, [IOSpec("x", "BYTES", (-1, -1))], [], max_rows=64)
    check_counts(body([["a"] * 1000] * 60, "BYTES"), ragged)  # a free dim: any number of strings
    ids = IOSpec("input_ids", "INT64", (-1, -1), tokens=TokenInput(100, 16, 0, "ids"))
    text = ModelIO("t", 1, [IOSpec("text", "BYTES", (-1,), tokenized_into=("input_ids",)), ids], [], max_rows=64)
    check_counts(body(["a, b, c, " * 20_000] * 2, "BYTES"), text)  # texts hold commas: values are not counted
    with pytest.raises(RequestError, match="strings"):
        check_counts(body(["a"] * 100_000, "BYTES"), text)
