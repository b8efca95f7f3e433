"""Safety and operations on real servers: API key, body limit, metrics, batching, graceful shutdown."""

from __future__ import annotations

import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.serve.serve_models import mlp, run_reference
from tests.serve.serve_process import start_server

pytestmark = pytest.mark.slow  # starts server processes

X = np.arange(4, dtype=np.float32).reshape(1, 4)
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}


def test_api_key_body_limit_and_two_workers(repository: Path, tmp_path: Path) -> None:
    env = {"PIPE_TEST_KEY": "s3cret"}
    args = ("--api-key-env", "PIPE_TEST_KEY", "--max-body-mb", "0.001", "--workers", "2", "--poll", "0")
    server = start_server([repository], tmp_path / "serve.log", *args, env=env)
    try:
        url = f"{server.url}/v2/models/mlp/infer"
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200  # probes need no key
        r = httpx.post(url, json=BODY)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["error"]
        assert httpx.post(url, json=BODY, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.post(url, json=BODY, headers=auth).status_code == 200
        with triton.InferenceServerClient(server.address) as client:
            inp = triton.InferInput("x", [1, 4], "FP32")
            # JSON input: tritonclient 2.73 puts an int Inference-Header-Content-Length into httpx
            # headers when custom headers are passed with binary inputs, and httpx refuses it.
            inp.set_data_from_numpy(X, binary_data=False)
            result = client.infer("mlp", [inp], model_version="1", headers=auth)
            np.testing.assert_allclose(
                result.as_numpy("logits"), run_reference(mlp([4, 8, 3], seed=1), {"x": X})["logits"], rtol=1e-5
            )
        big = b"0" * 2000
        r = httpx.post(url, content=big, headers=auth)
        assert r.status_code == 413 and "over the 1048-byte limit" in r.json()["error"]
        r = httpx.post(url, content=iter([big[:1000], big[1000:]]), headers=auth)  # chunked, no length
        assert r.status_code == 413
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    finally:
        server.stop()


def _metric(text: str, name: str) -> float:
    match = re.search(rf'^{name}{{model="mlp",version="1"}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_batching_metrics_and_graceful_shutdown(repository: Path, tmp_path: Path) -> None:
    # A long queue delay makes batching visible and keeps a request in flight during shutdown.
    args = ("--max-queue-delay-ms", "1500", "--max-batch-size", "8", "--poll", "0")
    server = start_server([repository], tmp_path / "serve.log", *args)
    url = f"{server.url}/v2/models/mlp/versions/1/infer"
    expected = run_reference(mlp([4, 8, 3], seed=1), {"x": X})["logits"].ravel()
    try:
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda _: httpx.post(url, json=BODY, timeout=30), range(8)))
        assert [r.status_code for r in responses] == [200] * 8
        text = httpx.get(f"{server.url}/metrics").text
        assert _metric(text, "pipe_request_success_total") == 8
        assert _metric(text, "pipe_inference_count_total") == 8
        assert _metric(text, "pipe_execution_count_total") == 1  # one batch of 8: average batch size 8
        assert _metric(text, "pipe_queue_duration_seconds_total") > 0
        assert _metric(text, "pipe_compute_duration_seconds_total") > 0

        slow: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: slow.setdefault("r", httpx.post(url, json=BODY, timeout=30)))
        thread.start()
        threading.Event().wait(0.5)  # the request now waits in the batch queue
        server.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert slow["r"].status_code == 200
        np.testing.assert_allclose(slow["r"].json()["outputs"][0]["data"], expected, rtol=1e-5)
        server.proc.wait(30)
    finally:
        server.stop()
    assert "stopped: every accepted request was answered" in server.logs()
