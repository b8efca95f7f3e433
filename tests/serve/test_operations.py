"""Operations on real servers: exit 2 before loading, readiness, versions in URLs, read deadlines,
the access log and Prometheus metrics summed across workers."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from tests.serve.serve_models import mlp, write_artifact
from tests.serve.serve_process import Server, free_port, start_server, wait_for

pytestmark = pytest.mark.slow  # starts server processes

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}


def _serve(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pipeline", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_taken_port_is_exit_2_before_any_model_loads(repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve(str(repository), "--port", str(port), "--poll", "0")
    assert proc.returncode == 2, proc.stderr
    assert f"--port {port}: 127.0.0.1:{port} is taken (address already in use)" in proc.stderr
    assert "loaded" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is offered here")
def test_provider_cuda_without_cuda_is_exit_2_before_any_model_loads(repository: Path) -> None:
    proc = _serve(str(repository), "--port", str(free_port()), "--provider", "cuda")
    assert proc.returncode == 2, proc.stderr
    assert "--provider cuda: this onnxruntime offers only [" in proc.stderr
    assert "install onnxruntime-gpu" in proc.stderr and "loaded" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--read-timeout", "0"], "--read-timeout 0 must be > 0"),
        (["--access-log", "/no/such/dir/access.jsonl"], "--access-log /no/such/dir/access.jsonl: cannot append"),
    ],
)
def test_bad_operations_flags_are_exit_2(repository: Path, args: list[str], needle: str) -> None:
    proc = _serve(str(repository), "--port", str(free_port()), *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_versions_in_urls_are_ascii_digits_or_a_4xx(server: Server) -> None:
    huge = "9" * 5000  # more digits than int() converts (Python's 4,300-digit limit)
    for version in ("²", huge, "-1", "1.0", "0x1"):
        for method, path in (
            ("GET", f"/v2/models/mlp/versions/{version}"),
            ("GET", f"/v2/models/mlp/versions/{version}/ready"),
            ("POST", f"/v2/models/mlp/versions/{version}/infer"),
            ("GET", f"/v1/models/mlp/versions/{version}"),
            ("GET", f"/v1/models/mlp/versions/{version}/metadata"),
            ("POST", f"/v1/models/mlp/versions/{version}:predict"),
        ):
            r = httpx.request(method, server.url + path, json=BODY if method == "POST" else None)
            assert r.status_code in (400, 404), (method, path[:60], r.status_code, r.text[:200])
            assert "version" in r.json()["error"]
    assert "Traceback" not in server.logs()


def _not_exported(repo: Path, name: str, version: int) -> None:
    """A version `pipe train` wrote and `pipe export` has not reached: a manifest, no model.onnx."""
    root = repo / name / str(version)
    root.mkdir(parents=True)
    spec = [TensorSpec("x", "float32", ["batch", 4])]
    Artifact(root, Manifest(name=name, version=version, task="regression", inputs=spec, outputs=spec)).save()


def test_ready_only_while_a_model_is_served_and_unexported_is_no_error(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    _not_exported(repo, "m", 1)
    server = start_server([repo], tmp_path / "serve.log", "--poll", "0.2", probe="live")
    try:
        r = httpx.get(f"{server.url}/v2/health/ready")
        assert r.status_code == 400 and "not ready: no model is loaded" in r.json()["error"], r.text
        r = httpx.get(f"{server.url}/v2/models/m/ready")
        assert r.status_code == 404 and "trained but not exported yet" in r.json()["error"]
        assert "run `pipe export" in r.json()["error"]
        write_artifact(repo, "m", 2, mlp([4, 8, 3], seed=1))
        wait_for(lambda: httpx.get(f"{server.url}/v2/health/ready").status_code == 200)
        assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}
    finally:
        server.stop()
    lines = [line for line in server.logs().splitlines() if "m v1" in line]
    assert lines and all(" WARNING " in line and "not serving m v1 yet" in line for line in lines), lines
    assert " ERROR " not in server.logs()


def _recv_all(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Read until the server closes the connection (bounded): what it sent, and when it closed."""
    started, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data, time.monotonic() - started
        data += chunk


def test_slow_headers_and_slow_bodies_time_out(repository: Path, tmp_path: Path) -> None:
    server = start_server([repository], tmp_path / "serve.log", "--poll", "0", "--read-timeout", "1")
    try:
        # Headers a byte at a time (slowloris): each byte keeps the connection busy, none completes it.
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            sock.settimeout(0.25)
            while time.monotonic() - started < 5:  # bounded: a server without a deadline fails below
                try:
                    sock.sendall(b"X")
                    sock.recv(1, socket.MSG_PEEK)  # the server answered (or closed): stop trickling
                    break
                except TimeoutError:
                    continue
                except OSError:  # the server closed the connection while we wrote
                    break
            answer, _ = _recv_all(sock, 5)
            elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"did not arrive within 1s (--read-timeout)" in answer
        assert 0.9 < elapsed < 5, elapsed  # not before the deadline; the 408 above proves it fired (no wall-clock race)

        # Whole headers, a tenth of the body, then silence.
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            started = time.monotonic()
            head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            sock.sendall(head + b"{" * 10)
            answer, _ = _recv_all(sock, 5)
            elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"the body did not arrive within 1s" in answer
        assert 0.9 < elapsed < 5, elapsed  # not before the deadline; the 408 above proves it fired (no wall-clock race)

        assert httpx.post(f"{server.url}/v2/models/mlp/infer", json=BODY).status_code == 200  # others unaffected
    finally:
        server.stop()
    assert "Traceback" not in server.logs()


def _sum(text: str, series: str, **labels: str) -> float:
    """The sum of one series across the scrape, over every label set holding `labels` (model mlp by default)."""
    wanted = {"model": "mlp", **labels}
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == series and wanted.items() <= sample.labels.items()
    )


def test_access_log_and_histograms_add_up_across_two_workers(repository: Path, tmp_path: Path) -> None:
    access = tmp_path / "access.jsonl"
    args = ("--workers", "2", "--poll", "0", "--access-log", str(access))
    server = start_server([repository], tmp_path / "serve.log", *args)
    url = f"{server.url}/v2/models/mlp/versions/1/infer"
    try:
        metrics_dir = Path(re.search(r"summed through (\S+) ", server.logs()).group(1))
        assert metrics_dir.is_dir()
        with ThreadPoolExecutor(8) as pool:  # a new connection per request: both workers take some
            statuses = list(pool.map(lambda _: httpx.post(url, json=BODY, timeout=30).status_code, range(100)))
        assert statuses == [200] * 100
        text = httpx.get(f"{server.url}/metrics").text
    finally:
        server.stop()
    for histogram in ("pipe_request_latency_seconds", "pipe_request_queue_seconds", "pipe_request_compute_seconds"):
        assert _sum(text, f"{histogram}_count") == 100, histogram
        assert _sum(text, f"{histogram}_bucket", le="+Inf") == 100, histogram
    assert _sum(text, "pipe_batch_size_sum") == 100  # rows over every run
    assert _sum(text, "pipe_request_success_total") == 100 and _sum(text, "pipe_inference_count_total") == 100
    assert _sum(text, "pipe_batch_size_count") == _sum(text, "pipe_execution_count_total") >= 1
    assert _sum(text, "pipe_request_latency_seconds_sum") == pytest.approx(
        _sum(text, "pipe_request_duration_seconds_total")
    )
    assert 'pipe_model_ready{model="mlp",version="1"} 1.0' in text
    assert not metrics_dir.exists()  # the server's own directory, removed on exit

    lines = [json.loads(line) for line in access.read_text().splitlines()]
    infer = [line for line in lines if line["route"] == "/v2/models/mlp/versions/1/infer"]
    assert len(infer) == 100
    assert {(x["method"], x["model"], x["version"], x["status"], x["rows"]) for x in infer} == {
        ("POST", "mlp", 1, 200, 1)
    }
    assert all(x["queue_ms"] >= 0 and x["compute_ms"] > 0 and x["total_ms"] >= x["compute_ms"] for x in infer)
    assert len({x["pid"] for x in infer}) == 2  # both workers answered, and the scrape summed them
    probe = next(x for x in lines if x["route"] == "/v2/health/ready")
    assert probe["model"] is None and probe["status"] == 200 and probe["time"].endswith("+00:00")


def test_sigterm_removes_the_metrics_directory(repository: Path, tmp_path: Path) -> None:
    """uvicorn raises SIGTERM again after its graceful shutdown; the server's metrics directory must still go."""
    running = start_server([repository / "mlp" / "1"], tmp_path / "serve.log", "--poll", "0")
    directory = Path(re.search(r"summed through (\S+)", running.logs()).group(1))
    assert directory.is_dir()
    running.stop()
    assert "stopped: every accepted request was answered" in running.logs()
    assert not directory.exists(), f"{directory} left behind"


def test_request_ids_reach_answers_errors_and_logs_and_logs_are_json(repository: Path, tmp_path: Path) -> None:
    """One id per request: an incoming X-Request-ID kept (an unusable one replaced), else made; echoed in the
    header, in error bodies and the access log; the server's own lines are JSON beside a JSON access log."""
    access = tmp_path / "access.jsonl"
    server = start_server([repository], tmp_path / "serve.log", "--poll", "0", "--access-log", str(access))
    try:
        given = httpx.post(f"{server.url}/v2/models/mlp/infer", json=BODY, headers={"x-request-id": "trace-7f3a"})
        assert given.status_code == 200 and given.headers["x-request-id"] == "trace-7f3a"
        assert given.json()["id"] == "trace-7f3a"  # V2's id when the body names none
        refused = httpx.post(f"{server.url}/v2/models/nope/infer", json=BODY)
        made = refused.headers["x-request-id"]
        assert refused.status_code == 404 and refused.json()["request_id"] == made and len(made) > 8
        odd = httpx.get(f"{server.url}/v2/models/nope", headers={"x-request-id": "x" * 500})
        assert odd.headers["x-request-id"] != "x" * 500 and odd.json()["request_id"] == odd.headers["x-request-id"]
        metrics = httpx.get(f"{server.url}/metrics").text
    finally:
        server.stop()
    ids = {line["route"]: line["request_id"] for line in map(json.loads, access.read_text().splitlines())}
    assert ids["/v2/models/mlp/infer"] == "trace-7f3a" and ids["/v2/models/nope/infer"] == made
    own = [json.loads(line) for line in server.logs().splitlines() if line.strip()]  # every line is JSON
    assert any(x["logger"] == "pipe.serve" and x["message"].startswith("loaded mlp v2") for x in own)
    assert any(x["logger"].startswith("uvicorn") for x in own) and all(x["level"] for x in own)
    assert 'pipe_model_loads_total{model="mlp",outcome="loaded"} 2.0' in metrics
    assert "pipe_requests_in_flight 1.0" in metrics  # the scrape itself
    assert 'pipe_queue_depth{model="mlp",version="2"} 0.0' in metrics
