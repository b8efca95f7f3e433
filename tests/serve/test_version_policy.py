"""Which versions go live (issue 22): labels (`pipe promote`), `--versions checked|promoted`, on real servers.

Before labels, a new version directory served every unversioned request as soon as its model.onnx
appeared, checked or not: `test_a_new_version_waits_for_promotion_before_taking_unversioned_requests`
failed on that code at its second assertion (the new v2 answered).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pipeline.artifact.directory import Artifact
from pipeline.artifact.labels import LABELS_NAME, read_labels
from pipeline.artifact.records import CheckRecord
from tests.serve.serve_models import mlp, write_artifact
from tests.serve.serve_process import start_server, wait_for

pytestmark = pytest.mark.slow  # starts server processes and waits for reloads

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}
POLL = ("--poll", "0.2")


def pipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=60)


def answered_by(url: str, path: str = "/v2/models/m/infer") -> str:
    r = httpx.post(f"{url}{path}", json=BODY, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["model_version"]


def checked(repo: Path, version: int, passed: bool) -> None:
    """Record a `pipe check` on a version, as the check stage does (the server rereads a changed manifest)."""
    artifact = Artifact.load(repo / "m" / str(version))
    failures = [] if passed else ["metric.accuracy dropped by 0.0185 (budget 0.005)"]
    artifact.manifest.stages.check = CheckRecord(baseline="baseline.json", passed=passed, failures=failures)
    artifact.save()


def test_a_new_version_waits_for_promotion_before_taking_unversioned_requests(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    promoted = pipe("promote", str(repo / "m" / "1"))
    assert promoted.returncode == 0 and "m: stable -> v1; no check record" in promoted.stdout, promoted.stderr
    server = start_server([repo], tmp_path / "serve.log", *POLL)
    try:
        assert answered_by(server.url) == "1"
        write_artifact(repo, "m", 2, mlp([4, 8, 3], seed=2))  # a new version, never checked nor promoted
        wait_for(lambda: httpx.get(f"{server.url}/v2/models/m/versions/2/ready").status_code == 200)
        assert answered_by(server.url) == "1"  # unversioned: still the stable version
        assert answered_by(server.url, "/v2/models/m/versions/2/infer") == "2"  # by number, it is there
        assert answered_by(server.url, "/v2/models/m/labels/stable/infer") == "1"

        assert pipe("promote", str(repo / "m" / "2"), "--label", "canary").returncode == 0
        wait_for(lambda: httpx.get(f"{server.url}/v1/models/m/labels/canary/metadata").status_code == 200)
        tf = httpx.post(f"{server.url}/v1/models/m/labels/canary:predict", json={"instances": [[0, 1, 2, 3]]})
        assert tf.status_code == 200 and len(tf.json()["predictions"][0]) == 3, tf.text
        assert httpx.get(f"{server.url}/v2/models/m/labels/canary").json()["parameters"]["labels"] == ["canary"]
        missing = httpx.post(f"{server.url}/v2/models/m/labels/beta/infer", json=BODY)
        assert missing.status_code == 404 and "has no label 'beta'" in missing.json()["error"], missing.text

        promoted = pipe("promote", str(repo / "m" / "2"))
        assert "m: stable -> v2 (was v1)" in promoted.stdout, promoted.stderr
        wait_for(lambda: answered_by(server.url) == "2")
        assert read_labels(repo / "m") == {"canary": 2, "stable": 2}
    finally:
        server.stop()


def test_versions_checked_serves_a_version_once_its_check_passed(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    checked(repo, 1, passed=True)
    write_artifact(repo, "m", 2, mlp([4, 8, 3], seed=2))  # never checked
    write_artifact(repo, "m", 3, mlp([4, 8, 3], seed=3))
    checked(repo, 3, passed=False)
    server = start_server([repo], tmp_path / "serve.log", *POLL, "--versions", "checked")
    try:
        assert answered_by(server.url) == "1"
        assert httpx.get(f"{server.url}/v2/models/m/versions/2/ready").status_code == 404
        index = {e["version"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        assert index["1"]["state"] == "READY" and index["2"]["state"] == "UNAVAILABLE"
        assert "no check record" in index["2"]["reason"] and "failed" in index["3"]["reason"]
        assert "accuracy dropped" in index["3"]["reason"]
        checked(repo, 2, passed=True)
        wait_for(lambda: answered_by(server.url) == "2")
        checked(repo, 2, passed=False)  # checked again, and it failed: no longer served
        wait_for(lambda: answered_by(server.url) == "1")
    finally:
        server.stop()
    assert " ERROR " not in server.logs(), server.logs()  # held back is a step to take, not a fault


def test_versions_promoted_serves_only_labelled_versions(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    for version in (1, 2, 3):
        write_artifact(repo, "m", version, mlp([4, 8, 3], seed=version))
    (repo / "m" / LABELS_NAME).write_text(json.dumps({"stable": 1, "canary": 2}))
    server = start_server([repo], tmp_path / "serve.log", *POLL, "--versions", "promoted")
    try:
        assert httpx.get(f"{server.url}/v2/models/m").json()["versions"] == ["1", "2"]
        assert answered_by(server.url) == "1"
        status = httpx.get(f"{server.url}/v1/models/m/versions/3").json()["model_version_status"][0]
        assert status["state"] != "AVAILABLE" and "has no label" in status["status"]["error_message"]
        assert pipe("promote", str(repo / "m" / "3"), "--label", "canary").returncode == 0  # canary moves to v3
        wait_for(lambda: httpx.get(f"{server.url}/v2/models/m").json()["versions"] == ["1", "3"])
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--label", "Stable!"], "label 'Stable!' is not a label name; use 1-64 characters"),
        (["--label", "2"], "label '2' is not a label name"),
    ],
)
def test_promote_refuses_bad_labels(tmp_path: Path, args: list[str], needle: str) -> None:
    write_artifact(tmp_path / "artifacts", "m", 1, mlp([4, 8, 3], seed=1))
    proc = pipe("promote", str(tmp_path / "artifacts" / "m" / "1"), *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_promote_refuses_a_failed_check_unless_forced_and_a_model_directory(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    checked(repo, 1, passed=False)
    proc = pipe("promote", str(repo / "m" / "1"))
    assert proc.returncode == 2 and "its recorded check failed (metric.accuracy dropped" in proc.stderr, proc.stderr
    assert not (repo / "m" / LABELS_NAME).exists()
    forced = pipe("promote", str(repo / "m" / "1"), "--force")
    assert forced.returncode == 0 and "check FAILED" in forced.stdout, forced.stderr
    proc = pipe("promote", str(repo / "m"))
    assert proc.returncode == 2 and "give one version directory, artifacts/NAME/N" in proc.stderr, proc.stderr
