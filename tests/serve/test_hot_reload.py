"""Hot reload on real servers: variants added to a served version, refused manifest changes, malformed versions."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline.artifact.directory import Artifact
from tests.serve.serve_models import add_variant, mlp, run_reference, write_artifact
from tests.serve.serve_process import Server, start_server, wait_for

pytestmark = pytest.mark.slow  # starts server processes and waits for reloads

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
POLL = ("--poll", "0.2")


def infer(url: str, path: str = "/v2/models/m/infer") -> np.ndarray:
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
    r = httpx.post(f"{url}{path}", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 3)


def expected(seed: int) -> np.ndarray:
    return run_reference(mlp([4, 8, 3], seed=seed), {"x": X})["logits"]


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def replace_manifest(root: Path, text: str) -> None:
    """Rewrite manifest.json the way stages do (a new file renamed over the old)."""
    (root / "manifest.tmp").write_text(text)
    os.replace(root / "manifest.tmp", root / "manifest.json")


def parameters(server: Server) -> dict:
    return httpx.get(f"{server.url}/v2/models/m").json()["parameters"]


def tf_status(server: Server) -> dict:
    return httpx.get(f"{server.url}/v1/models/m").json()["model_version_status"][0]


def test_a_variant_made_later_is_swapped_in_and_a_refused_change_keeps_serving(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "artifacts", "m", 1, mlp([4, 8, 3], seed=1)).root
    server = start_server([tmp_path / "artifacts"], tmp_path / "serve.log", "--variant", "int8", *POLL)
    try:
        assert parameters(server)["variant"] == "fp32"  # no int8 yet: fp32, with a warning
        assert "has no variant 'int8'" in server.logs()

        # pipe optimize adds int8 to the served version, and it passed: the server swaps it in.
        artifact = Artifact.load(root)
        add_variant(artifact, "int8", mlp([4, 8, 3], seed=9))
        artifact.save()
        wait_for(lambda: parameters(server)["variant"] == "int8")
        assert parameters(server)["file"] == "variants/model.int8.onnx"
        np.testing.assert_allclose(infer(server.url), expected(9), rtol=1e-5, atol=1e-6)
        assert "reloaded m v1 from" in server.logs() and "variant int8 (variants/model.int8.onnx) replaces fp32" in (
            server.logs()
        )

        # A change that does not verify (a tampered file): int8 keeps serving, and the refusal shows.
        flip_last_byte(root / "model.onnx")
        artifact.save()
        wait_for(lambda: "kept serving m v1" in server.logs())
        assert "sha256 does not match" in parameters(server)["reload_error"]
        status = tf_status(server)
        assert status["state"] == "AVAILABLE" and "failed verification" in status["status"]["error_message"]
        np.testing.assert_allclose(infer(server.url), expected(9), rtol=1e-5, atol=1e-6)
        assert httpx.get(f"{server.url}/v2/models/m/ready").status_code == 200
        time.sleep(1.0)  # five more scans: the refusal is logged once, not on every scan
        assert server.logs().count("kept serving m v1") == 1

        # A malformed manifest: the same.
        replace_manifest(root, '{"name": "m", ')
        wait_for(lambda: server.logs().count("kept serving m v1") == 2)
        assert "not valid JSON" in parameters(server)["reload_error"]
        np.testing.assert_allclose(infer(server.url), expected(9), rtol=1e-5, atol=1e-6)

        # Repaired: the refusal clears, int8 still serves.
        flip_last_byte(root / "model.onnx")
        artifact.save()
        wait_for(lambda: "reload_error" not in parameters(server))
        assert tf_status(server)["status"] == {"error_code": "OK", "error_message": ""}
        assert "m v1: its manifest is valid again" in server.logs()

        # A sound manifest that records int8 as failed: the server-wide preference goes back to fp32
        # (a failed optimize run never takes the model offline), and the log says why.
        artifact.manifest.variants["int8"].status = "failed"
        artifact.manifest.variants["int8"].reason = "top-1 agreement 0.91 < 0.99"
        artifact.save()
        wait_for(lambda: parameters(server)["variant"] == "fp32")
        np.testing.assert_allclose(infer(server.url), expected(1), rtol=1e-5, atol=1e-6)
        assert "variant 'int8' failed optimize: top-1 agreement 0.91 < 0.99; serving fp32 instead" in server.logs()
        assert tf_status(server)["state"] == "AVAILABLE"
    finally:
        server.stop()
    assert "Traceback" not in server.logs()


def _break_versions(repo: Path, outside: Path, staging: Path, first: int, stray: str) -> dict[str, str]:
    """Versions first..first+3 of m, each malformed another way, and a stray directory: what each refusal says."""
    m = repo / "m"
    bad_json = write_artifact(staging, "m", first, mlp([4, 8, 3])).root
    replace_manifest(bad_json, "{not json")
    tampered = write_artifact(staging, "m", first + 1, mlp([4, 8, 3])).root
    flip_last_byte(tampered / "model.onnx")
    linked = write_artifact(outside, "m", first + 2, mlp([4, 8, 3])).root
    linked_manifest = write_artifact(staging, "m", first + 3, mlp([4, 8, 3])).root
    (outside / f"manifest{first + 3}.json").write_bytes((linked_manifest / "manifest.json").read_bytes())
    (linked_manifest / "manifest.json").unlink()
    (linked_manifest / "manifest.json").symlink_to(outside / f"manifest{first + 3}.json")
    not_a_version = write_artifact(staging / "strays", "m", first + 4, mlp([4, 8, 3])).root
    # Moved in whole, as a deploy would, so a scan never sees one half-made.
    for directory in (bad_json, tampered, linked_manifest):
        shutil.move(directory, m / directory.name)
    (m / str(first + 2)).symlink_to(linked, target_is_directory=True)
    shutil.move(not_a_version, m / stray)
    return {
        f"refused m v{first} from {m / str(first)}: ": "not valid JSON",
        f"refused m v{first + 1} from {m / str(first + 1)}: ": "model.onnx: sha256 does not match the manifest",
        f"refused m v{first + 2} from {m / str(first + 2)}: ": f"is a symlink to {linked}",
        f"refused m v{first + 3} from {m / str(first + 3)}: ": "manifest.json is a symlink to",
        f"refused {m / stray}: ": f"{stray!r} is not a version directory name",
    }


def _refusals_logged_once(server: Server, refusals: dict[str, str]) -> bool:
    lines = server.logs().splitlines()
    for start, reason in refusals.items():
        matching = [line for line in lines if start in line]
        if not matching:
            return False
        assert len(matching) == 1, matching
        assert reason in matching[0], (reason, matching[0])  # the reason, on the refusal's own line
    return True


def test_every_malformed_version_is_refused_in_one_line_and_healthy_ones_keep_serving(tmp_path: Path) -> None:
    repo, outside, staging = tmp_path / "artifacts", tmp_path / "outside", tmp_path / "staging"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    write_artifact(repo, "other", 1, mlp([4, 8, 3], seed=2))
    at_start = _break_versions(repo, outside, staging / "a", 2, "²")
    server = start_server([repo], tmp_path / "serve.log", *POLL)
    try:
        assert httpx.get(f"{server.url}/v2/models/m").json()["versions"] == ["1"]
        assert _refusals_logged_once(server, at_start)
        np.testing.assert_allclose(infer(server.url), expected(1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(infer(server.url, "/v2/models/other/infer"), expected(2), rtol=1e-5, atol=1e-6)
        states = {s["version"]: s["state"] for s in tf_status_all(server)}
        assert states == {"1": "AVAILABLE", "2": "UNAVAILABLE", "3": "UNAVAILABLE", "4": "UNAVAILABLE",
                          "5": "UNAVAILABLE"}  # fmt: skip

        # The same breakage arriving while the server runs, beside a healthy new version 10.
        during_reload = _break_versions(repo, outside, staging / "b", 6, "010")
        write_artifact(staging / "c", "m", 10, mlp([4, 8, 3], seed=10))
        shutil.move(staging / "c" / "m" / "10", repo / "m" / "10")
        wait_for(lambda: httpx.get(f"{server.url}/v2/models/m").json()["versions"] == ["1", "10"])
        wait_for(lambda: _refusals_logged_once(server, during_reload))
        time.sleep(1.0)  # more scans: still each refusal once
        assert _refusals_logged_once(server, {**at_start, **during_reload})
        np.testing.assert_allclose(infer(server.url), expected(10), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(infer(server.url, "/v2/models/m/versions/1/infer"), expected(1), rtol=1e-5)
        np.testing.assert_allclose(infer(server.url, "/v2/models/other/infer"), expected(2), rtol=1e-5, atol=1e-6)
    finally:
        server.stop()
    logs = server.logs()
    assert "Traceback" not in logs
    assert not [line for line in logs.splitlines() if line.startswith((" ", "\t"))]  # every reason on one line


def tf_status_all(server: Server) -> list[dict]:
    return httpx.get(f"{server.url}/v1/models/m").json()["model_version_status"]


def test_a_version_in_a_url_must_be_ascii_digits(server: Server) -> None:
    r = httpx.get(f"{server.url}/v2/models/mlp/versions/²/ready")
    assert (
        r.status_code == 400
        and "model version must be a positive integer of at most 9 ASCII digits, got '²'" in r.json()["error"]
    )
    r = httpx.get(f"{server.url}/v1/models/mlp/versions/²")
    assert r.status_code == 404 and "has no version ²" in r.json()["error"]


def test_a_version_too_long_for_an_integer_is_a_refusal_not_a_server_error(server: Server) -> None:
    huge = "9" * 5000  # more digits than int() converts (Python's 4300-digit limit)
    r = httpx.get(f"{server.url}/v2/models/mlp/versions/{huge}/ready")
    assert r.status_code == 400 and "a positive integer of at most 9 ASCII digits, got '9999" in r.json()["error"]
    r = httpx.post(f"{server.url}/v1/models/mlp/versions/{huge}:predict", json={"instances": [[0, 0, 0, 0]]})
    assert r.status_code == 400, r.text
    r = httpx.get(f"{server.url}/v1/models/mlp/versions/{huge}")
    assert r.status_code == 404 and "has no version 9999" in r.json()["error"], r.text
