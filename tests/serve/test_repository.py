"""Repository behaviour on real servers: versions, variants, hot reload, tampered artifacts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.serve.serve_models import mlp, run_reference, two_in_two_out, write_artifact
from tests.serve.serve_process import start_server, wait_for

pytestmark = pytest.mark.slow  # starts server processes and waits for reloads

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def infer(url: str, path: str) -> np.ndarray:
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
    r = httpx.post(f"{url}{path}", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 3)


def expected(seed: int, scale: float = 1.0) -> np.ndarray:
    return run_reference(mlp([4, 8, 3], seed=seed, scale=scale), {"x": X})["logits"]


def tamper(root: Path) -> None:
    data = bytearray((root / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (root / "model.onnx").write_bytes(bytes(data))


def test_hot_reload_swaps_in_new_versions_and_survives_a_broken_one(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    server = start_server([repo], tmp_path / "serve.log", "--poll", "0.2", "--latest", "2")
    try:
        url = server.url
        np.testing.assert_allclose(infer(url, "/v2/models/m/infer"), expected(1), rtol=1e-5, atol=1e-6)
        # A new version written elsewhere and moved in, as a deploy would do.
        write_artifact(tmp_path / "staging", "m", 2, mlp([4, 8, 3], seed=2))
        shutil.move(tmp_path / "staging" / "m" / "2", repo / "m" / "2")
        wait_for(lambda: httpx.get(f"{url}/v2/models/m").json()["versions"] == ["1", "2"])
        np.testing.assert_allclose(infer(url, "/v2/models/m/infer"), expected(2), rtol=1e-5, atol=1e-6)
        # A tampered version 3 is refused and reported; version 2 keeps serving.
        broken = write_artifact(tmp_path / "staging", "m", 3, mlp([4, 8, 3], seed=3)).root
        tamper(broken)
        shutil.move(broken, repo / "m" / "3")
        wait_for(lambda: "refused m v3" in server.logs())
        assert "failed verification" in server.logs() and "model.onnx: sha256 does not match" in server.logs()
        r = httpx.get(f"{url}/v2/models/m/versions/3/ready")
        assert r.status_code == 404 and "failed to load" in r.json()["error"]
        status = httpx.get(f"{url}/v1/models/m").json()["model_version_status"]
        assert [(s["version"], s["state"]) for s in status] == [
            ("1", "AVAILABLE"),
            ("2", "AVAILABLE"),
            ("3", "UNAVAILABLE"),
        ]
        assert "tampered" in status[2]["status"]["error_message"]
        np.testing.assert_allclose(infer(url, "/v2/models/m/infer"), expected(2), rtol=1e-5, atol=1e-6)
        assert 'pipe_model_ready{model="m",version="3"} 0' in httpx.get(f"{url}/metrics").text
        # Version 4 loads; with --latest 2, version 1 is unloaded.
        write_artifact(tmp_path / "staging", "m", 4, mlp([4, 8, 3], seed=4))
        shutil.move(tmp_path / "staging" / "m" / "4", repo / "m" / "4")
        wait_for(lambda: httpx.get(f"{url}/v2/models/m").json()["versions"] == ["2", "4"])
        np.testing.assert_allclose(infer(url, "/v2/models/m/infer"), expected(4), rtol=1e-5, atol=1e-6)
        assert httpx.get(f"{url}/v2/models/m/versions/1/ready").status_code == 404
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    finally:
        server.stop()
    assert "stopped: every accepted request was answered" in server.logs()


def test_latest_variant_choice_and_a_tampered_model_at_startup(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    write_artifact(repo, "m", 2, mlp([4, 8, 3], seed=2), variants={"opt": mlp([4, 8, 3], seed=2, scale=2.0)})
    write_artifact(repo, "pair", 1, two_in_two_out())
    tamper(write_artifact(repo, "bad", 1, mlp([4, 8, 3], seed=5)).root)
    server = start_server([repo], tmp_path / "serve.log", "--latest", "1", "--variant", "opt", "--poll", "0")
    try:
        meta = httpx.get(f"{server.url}/v2/models/m").json()
        assert meta["versions"] == ["2"]
        assert meta["parameters"]["variant"] == "opt" and meta["parameters"]["file"] == "variants/model.opt.onnx"
        np.testing.assert_allclose(infer(server.url, "/v2/models/m/infer"), expected(2, 2.0), rtol=1e-5, atol=1e-6)
        assert httpx.get(f"{server.url}/v2/models/pair").json()["parameters"]["variant"] == "fp32"
        assert "has no variant 'opt'" in server.logs()  # pair falls back to fp32, and says so
        r = httpx.get(f"{server.url}/v2/models/bad/ready")
        assert r.status_code == 404 and "failed verification" in r.json()["error"]
        assert "refused bad v1" in server.logs()
    finally:
        server.stop()


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_strict_readiness_keeps_the_server_not_ready_while_a_model_serves_no_version(
    tmp_path: Path, strict: bool
) -> None:
    """As Triton's default (--strict-readiness): every model found must be ready; by default one served
    version makes the server ready, and each model's /ready answers for itself either way."""
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    tamper(write_artifact(repo, "bad", 1, mlp([4, 8, 3], seed=5)).root)
    flags = ["--strict-readiness"] if strict else []
    server = start_server([repo], tmp_path / "serve.log", "--poll", "0", *flags, probe="live")
    try:
        wait_for(lambda: "refused bad v1" in server.logs())
        ready = httpx.get(f"{server.url}/v2/health/ready")
        if strict:
            assert ready.status_code == 400, ready.text
            assert "not ready (--strict-readiness): no version of bad is served" in ready.json()["error"]
        else:
            assert ready.status_code == 200, ready.text
        assert httpx.get(f"{server.url}/v2/models/m/ready").status_code == 200
        assert httpx.get(f"{server.url}/v2/models/bad/ready").status_code == 404
    finally:
        server.stop()


def test_per_model_variant_that_does_not_exist_is_reported(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    server = start_server([repo], tmp_path / "serve.log", "--variant", "m=int8", "--poll", "0", probe="live")
    try:
        r = httpx.get(f"{server.url}/v2/models/m/ready")
        assert r.status_code == 404 and "variant 'int8' does not exist; available: ['fp32']" in r.json()["error"]
        r = httpx.get(f"{server.url}/v2/health/ready")  # its only version refused: the server is not ready
        assert r.status_code == 400 and "every version was refused (m v1" in r.json()["error"], r.text
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["/no/such/dir"], "/no/such/dir is not a directory"),
        (["{repo}", "--latest", "0"], "--latest 0 must be at least 1"),
        (["{repo}", "--api-key-env", "PIPE_TEST_UNSET_KEY"], "PIPE_TEST_UNSET_KEY: that environment variable"),
        (["{repo}", "--variant", "m="], "give VARIANT or MODEL=VARIANT"),
        (["{repo}", "--max-body-mb", "0"], "--max-body-mb must be > 0"),
        (["{repo}", "--intra-op-threads", "-1"], "--intra-op-threads and --inter-op-threads must be >= 0"),
    ],
)
def test_bad_usage_exits_2(tmp_path: Path, args: list[str], needle: str) -> None:
    repo = tmp_path / "artifacts"
    repo.mkdir()
    command = [sys.executable, "-m", "pipeline", "serve", *(a.format(repo=repo) for a in args)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
