"""The OpenAPI document matches the routes, and the server never loads torch or tensorflow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

HEAVY = ("torch", "tensorflow", "onnx2tf", "keras")

V2_BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]}
TF_BODY = {"instances": [[0.1, 0.2, 0.3, 0.4]]}
# The generation routes take a text-generation model, which this repository has none of: to the MLP they answer
# 400 naming what they take (tests/serve/test_generation.py serves a tiny Llama through each of them).
GENERATION = {
    "/generate": {"text_input": "hi"},
    "/generate_stream": {"text_input": "hi"},
    "/v1/chat/completions": {"model": "mlp", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "mlp", "prompt": "hi"},
}


def test_every_documented_operation_answers(server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert document["paths"]["/v2/models/{model_name}"]["parameters"][0]["schema"]["enum"] == [
        "embed",
        "mlp",
        "pair",
        "strings",
    ]
    for template, item in document["paths"].items():
        path = template.replace("{model_name}", "mlp").replace("{version}", "1").replace("{label}", "canary")
        for method in ("get", "post"):
            if method not in item:
                continue
            body = TF_BODY if path.endswith((":predict", ":classify")) else V2_BODY
            generation = next((b for tail, b in GENERATION.items() if path.endswith(tail)), None)
            body = generation or (body if method == "post" else None)
            r = httpx.request(method.upper(), f"{server.url}{path}", json=body)
            if generation is not None:
                assert r.status_code == 400 and "text-generation" in r.text, f"{path}: {r.status_code} {r.text}"
                continue
            assert r.status_code == 200, f"{method.upper()} {path}: {r.status_code} {r.text}"


@pytest.mark.parametrize(
    "path", ["/v3", "/v2/models/mlp/explain", "/v2/models/mlp/versions/1/ready/extra", "/v1/models/mlp/versions/1/x"]
)
def test_undocumented_paths_are_404(server, path: str) -> None:
    r = httpx.get(f"{server.url}{path}")
    assert r.status_code == 404 and "error" in r.json()


LOAD_AND_LIST = """
import asyncio, json, sys
from pathlib import Path
from pipeline.serve.app import ServeApp
from pipeline.serve.config import ServeConfig
from pipeline.serve.repository import RepositorySettings

async def main():
    app = ServeApp(ServeConfig(RepositorySettings((Path(sys.argv[1]),), poll_s=0)))
    await app._start()  # load and verify every model, as the server's startup does
    assert app.state.repository.models, "nothing loaded"
    await app.state.repository.stop()

asyncio.run(main())
import pipeline.cli, pipeline.serve.server, uvicorn, uvloop, httptools  # what `pipe serve` runs on
print(json.dumps(sorted(sys.modules)))
"""


def test_serving_loads_no_heavy_framework(repository: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_AND_LIST, str(repository)], capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(proc.stdout))
    assert "onnxruntime" in loaded and "uvicorn" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_serve_help_lists_the_options() -> None:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "serve", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for option in ("--workers", "--latest", "--variant", "--max-batch-size", "--api-key-env", "--provider"):
        assert option in proc.stdout


def test_the_document_declares_every_answer_the_inference_routes_give() -> None:
    """Every POST reads its body under --read-timeout (408 on any of them), and V2 infer answers binary
    outputs as application/octet-stream, as a conformance checker reading the document must expect."""
    from pipeline.serve.app import ROUTES
    from pipeline.serve.openapi import document

    paths = document(ROUTES, ["m"])["paths"]
    posts = {path: item["post"] for path, item in paths.items() if "post" in item}
    assert any(path.endswith(":classify") for path in posts)
    for path, operation in posts.items():
        assert {"400", "404", "408", "413", "503"} <= set(operation["responses"]), path
    for path in ("/v2/models/{model_name}/infer", "/v2/models/{model_name}/versions/{version}/infer"):
        assert set(posts[path]["responses"]["200"]["content"]) == {"application/json", "application/octet-stream"}
