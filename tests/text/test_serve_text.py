"""Text in, text served: a model imported with its tokenizer takes strings over KServe V2 (JSON and
tritonclient's binary BYTES) and TF Serving (instances of strings), tokenized in the server, and answers
what transformers in torch answers; token ids still work and are checked; rows of different lengths from
different requests batch together, padded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from pipeline.artifact.directory import Artifact
from pipeline.runtime.text import TextEncoder
from pipeline.serve.batching import Batcher, BatchSettings
from pipeline.serve.metrics import Metrics
from pipeline.serve.session import ModelSession, SessionOptions
from tests.serve.serve_process import Server, start_server
from tests.text.test_import_hf import _transformers_embedding

TEXTS = ["the cat sat on the mat", "dogs", "a bird sang a song in the tree by the window all day long"]


@pytest.fixture(scope="module")
def server(text_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server([text_repository], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def expected(bert_dir: Path) -> np.ndarray:
    return _transformers_embedding(bert_dir, TEXTS)


def _cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_bytes_text_gets_transformers_embedding(
    server: Server, expected: np.ndarray, binary: bool
) -> None:
    with triton.InferenceServerClient(server.address) as client:
        meta = client.get_model_metadata("embed")
        assert meta["inputs"][0] == {
            "name": "text",
            "datatype": "BYTES",
            "shape": [-1],
            "parameters": {"tokenized_into": ["input_ids", "attention_mask", "token_type_ids"]},
        }
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object), binary_data=binary)
        result = client.infer("embed", [text])
    got = result.as_numpy("embedding")
    assert got.shape == (3, 32)
    assert _cosines(got, expected).min() >= 0.9999


def test_tf_serving_strings_get_transformers_embedding(server: Server, expected: np.ndarray) -> None:
    with httpx.Client(base_url=server.url) as http:
        rows = http.post("/v1/models/embed:predict", json={"instances": TEXTS})
        keyed = http.post("/v1/models/embed:predict", json={"instances": [{"text": t} for t in TEXTS]})
        columns = http.post("/v1/models/embed:predict", json={"inputs": TEXTS})
        meta = http.get("/v1/models/embed/metadata").json()["metadata"]
    assert rows.status_code == 200, rows.text
    got = np.array(rows.json()["predictions"])
    assert _cosines(got, expected).min() >= 0.9999
    np.testing.assert_allclose(np.array(keyed.json()["predictions"]), got, atol=1e-6)
    np.testing.assert_allclose(np.array(columns.json()["outputs"]), got, atol=1e-6)
    assert meta["text"] == {"input": "text", "tokenized_into": ["input_ids", "attention_mask", "token_type_ids"]}


def test_a_classifier_answers_text_with_its_labels(server: Server) -> None:
    with httpx.Client(base_url=server.url) as http:
        keyed = http.post("/v1/models/sentiment:classify", json={"examples": [{"text": "the cat sat"}]})
        bare = http.post("/v1/models/sentiment:classify", json={"instances": ["the cat sat", "dogs"]})
    assert keyed.status_code == 200 and bare.status_code == 200, (keyed.text, bare.text)
    assert {label for label, _ in keyed.json()["results"][0]} == {"neg", "pos"}
    assert len(bare.json()["results"]) == 2


def test_token_ids_still_work_and_are_checked(server: Server, embed_artifact: Artifact) -> None:
    encoder = TextEncoder.of(embed_artifact.root, embed_artifact.manifest)
    assert encoder is not None
    feeds = encoder.encode(TEXTS[:1])
    inputs = [{"name": n, "datatype": "INT64", "shape": list(a.shape), "data": a.ravel().tolist()} for n, a in
              feeds.items()]  # fmt: skip
    with httpx.Client(base_url=server.url) as http:
        by_ids = http.post("/v2/models/embed/infer", json={"inputs": inputs})
        by_text = http.post("/v1/models/embed:predict", json={"instances": TEXTS[:1]})
        inputs[0]["data"][1] = 500
        unknown = http.post("/v2/models/embed/infer", json={"inputs": inputs})
        both = http.post(
            "/v2/models/embed/infer",
            json={"inputs": [*inputs, {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
        )
    assert by_ids.status_code == 200, by_ids.text
    np.testing.assert_allclose(by_ids.json()["outputs"][0]["data"], by_text.json()["predictions"][0], atol=1e-6)
    assert unknown.status_code == 400
    assert "token id 500 at [0, 1] is outside the vocabulary: ids must be in [0, 128)" in unknown.json()["error"]
    assert both.status_code == 400 and "send the texts alone" in both.json()["error"]


def test_long_texts_are_cut_to_the_recorded_max_length(server: Server) -> None:
    with httpx.Client(base_url=server.url) as http:
        answer = http.post("/v1/models/embed:predict", json={"instances": [" ".join(["cat"] * 500)]})
    assert answer.status_code == 200, answer.text  # 502 tokens, cut to 32: the position table has 64


def test_rows_of_different_lengths_batch_together_padded(embed_artifact: Artifact) -> None:
    session = ModelSession(embed_artifact.root / "model.onnx", SessionOptions(provider="cpu"), embed_artifact.manifest)
    assert session.padding == {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}
    encoder = TextEncoder.of(embed_artifact.root, embed_artifact.manifest)
    assert encoder is not None
    requests = [encoder.encode([text]) for text in TEXTS * 4]  # lengths 8, 3 and 16
    alone = [session.run(feeds)["embedding"] for feeds in requests]
    stats = Metrics().model("embed", 1)

    async def main() -> list[dict[str, np.ndarray]]:
        with ThreadPoolExecutor(2) as pool:
            settings = BatchSettings(max_batch_size=32, max_queue_delay_ms=50)
            batcher = Batcher(session.run, session.batchable, settings, pool, stats, padding=session.padding)
            results = await asyncio.gather(*(batcher.infer(feeds, 1) for feeds in requests))
            await batcher.close()
            return results

    results = asyncio.run(main())
    for got, want in zip(results, alone, strict=True):
        np.testing.assert_allclose(got["embedding"], want, atol=1e-5)
    assert stats.executions <= 2, f"{stats.executions} runs for {len(requests)} requests of 3 lengths"


def test_texts_as_n_by_1_and_non_utf8_text(server: Server) -> None:
    with httpx.Client(base_url=server.url) as http:
        column = http.post(
            "/v2/models/embed/infer",
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": TEXTS[:2]}]},
        )
        flat = http.post("/v1/models/embed:predict", json={"instances": TEXTS[:2]})
        with triton.InferenceServerClient(server.address) as client:
            text = triton.InferInput("text", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"\xff\xfe cat"], dtype=object))
            try:
                client.infer("embed", [text])
                refused = ""
            except triton.InferenceServerException as exc:
                refused = str(exc)
    assert column.status_code == 200, column.text
    np.testing.assert_allclose(np.array(column.json()["outputs"][0]["data"]).reshape(2, 32), flat.json()["predictions"],
                               atol=1e-6)  # fmt: skip
    assert "row 0: the text is not UTF-8" in refused
