"""Which variant a version serves: fp32 by default, --variant choices, and failed variants never served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

import pipeline.serve
from pipeline.artifact.directory import Artifact
from pipeline.core.errors import ArtifactError, InputError
from pipeline.serve.variant_choice import Choice, VariantRefused, check_choices, choose, choose_quietly
from tests.serve.serve_models import add_variant, mlp, run_reference, write_artifact
from tests.serve.serve_process import free_port, start_server

REASON = "top-1 agreement 0.912 < 0.990 on 512 golden samples"
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


@pytest.fixture()
def artifact(tmp_path: Path) -> Artifact:
    """m v1: fp32, a passed `opt` and an `int8` that failed its gate."""
    artifact = write_artifact(tmp_path, "m", 1, mlp([4, 8, 3], seed=1), variants={"opt": mlp([4, 8, 3], seed=2)})
    add_variant(artifact, "int8", mlp([4, 8, 3], seed=3), reason=REASON)
    artifact.save()
    return Artifact.load(artifact.root)


def test_fp32_by_default_and_passed_variants_on_request(artifact: Artifact) -> None:
    files = artifact.manifest.files
    assert choose(artifact, {}) == Choice("fp32", "model.onnx", files["model.onnx"].sha256)
    opt = Choice("opt", "variants/model.opt.onnx", files["variants/model.opt.onnx"].sha256)
    assert choose(artifact, {"*": "opt"}) == opt
    assert choose(artifact, {"m": "opt", "*": "nope"}) == opt  # the model's own choice wins
    assert choose(artifact, {"*": "nope"}).variant == "fp32"  # a server-wide choice it lacks: fp32
    with pytest.raises(VariantRefused, match=r"variant 'nope' does not exist; available: \['fp32', 'opt'\]"):
        choose(artifact, {"m": "nope"})  # failed int8 is not offered as available


def test_a_failed_variant_required_for_the_model_refuses_the_version_with_its_reason(artifact: Artifact) -> None:
    with pytest.raises(VariantRefused, match=rf"variant 'int8' failed optimize: {REASON}; a failed variant is never"):
        choose(artifact, {"m": "int8"})


def test_a_failed_variant_preferred_server_wide_serves_fp32_and_says_why(artifact: Artifact) -> None:
    """A failed optimize run must not take a working model offline: the server-wide choice is a preference."""
    choice, warning = choose_quietly(artifact, {"*": "int8"})
    assert choice.variant == "fp32"
    assert warning is not None and f"variant 'int8' failed optimize: {REASON}; serving fp32 instead" in warning


def test_a_stale_variant_is_not_served(artifact: Artifact) -> None:
    """opt was made from a model.onnx that has since been exported again: its gate judged another model."""
    (artifact.root / "model.onnx").write_bytes((artifact.root / "model.onnx").read_bytes() + b" ")
    artifact.add_file("model.onnx")  # what a re-export records
    with pytest.raises(VariantRefused, match=r"variant 'opt' is stale: optimize made it from a file this artifact"):
        choose(artifact, {"m": "opt"})
    choice, warning = choose_quietly(artifact, {"*": "opt"})
    assert choice.variant == "fp32" and warning is not None and "re-run pipe optimize" in warning


def test_a_failed_fp32_is_not_served_by_default(artifact: Artifact) -> None:
    artifact.manifest.variants["fp32"].status = "failed"
    artifact.manifest.variants["fp32"].reason = "parity against torch: max abs diff 0.3"
    with pytest.raises(VariantRefused, match="variant 'fp32' failed .*: parity against torch: max abs diff 0.3"):
        choose(artifact, {})
    assert choose(artifact, {"*": "opt"}).variant == "opt"


def test_a_variant_recorded_in_another_file_is_refused(artifact: Artifact) -> None:
    artifact.manifest.variants["opt"].file = "model.onnx"
    with pytest.raises(ArtifactError, match=r"records variant 'opt' in 'model.onnx', but it belongs in 'variants/"):
        choose(artifact, {"*": "opt"})


def test_an_invalid_variant_name_is_bad_usage() -> None:
    with pytest.raises(InputError, match=r"--variant m=Int 8: variant name 'Int 8' is not valid"):
        check_choices({"m": "Int 8"})


def test_serve_spells_no_variant_file_name() -> None:
    """pipeline.artifact.variants.variant_file is the one mapping from a variant name to its file."""
    root = Path(pipeline.serve.__file__).parent
    for module in root.rglob("*.py"):
        text = module.read_text()
        assert '"model.onnx"' not in text and "variants/model." not in text, module


@pytest.mark.slow
def test_server_refuses_a_failed_variant_and_serves_the_models_beside_it(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "n", 1, mlp([4, 8, 3], seed=4), variants={"int8": mlp([4, 8, 3], seed=5)})
    m = write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    add_variant(m, "int8", mlp([4, 8, 3], seed=3), reason=REASON)
    m.save()
    args = ("--variant", "m=int8", "--variant", "n=int8", "--poll", "0")  # required, not preferred
    server = start_server([repo], tmp_path / "serve.log", *args)
    try:
        r = httpx.get(f"{server.url}/v2/models/m/ready")
        assert r.status_code == 404 and f"variant 'int8' failed optimize: {REASON}" in r.json()["error"]
        status = httpx.get(f"{server.url}/v1/models/m").json()["model_version_status"][0]
        assert status["state"] == "UNAVAILABLE" and REASON in status["status"]["error_message"]
        assert f"refused m v1 from {repo / 'm' / '1'}: " in server.logs()
        meta = httpx.get(f"{server.url}/v2/models/n").json()["parameters"]
        assert (meta["variant"], meta["file"]) == ("int8", "variants/model.int8.onnx")
        body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
        out = httpx.post(f"{server.url}/v2/models/n/infer", json=body).json()["outputs"][0]["data"]
        expected = run_reference(mlp([4, 8, 3], seed=5), {"x": X})["logits"]
        np.testing.assert_allclose(np.reshape(out, (2, 3)), expected, rtol=1e-5, atol=1e-6)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("chosen", "needle"),
    [
        (("--variant", "m=int8"), f"variant 'int8' failed optimize: {REASON}"),
        (("--variant", "m=nope"), "variant 'nope' does not exist; available: ['fp32', 'opt']"),
    ],
    ids=["failed", "missing"],
)
def test_a_version_named_on_the_command_line_whose_variant_is_refused_exits_2(
    artifact: Artifact, chosen: tuple[str, str], needle: str
) -> None:
    """One version is all this server would serve: refuse it before listening, as a tampered one is."""
    port = free_port()  # were it not refused, it would serve here until the timeout fails the test
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "serve", str(artifact.root), *chosen, "--port", str(port), "--poll", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_failed_fp32_is_not_offered_as_available(artifact: Artifact) -> None:
    artifact.manifest.variants["fp32"].status = "failed"
    artifact.manifest.variants["fp32"].reason = "parity against torch: max abs diff 0.3"
    with pytest.raises(VariantRefused, match=r"choose one of \['opt'\] or re-run optimize"):
        choose(artifact, {"m": "int8"})
    with pytest.raises(VariantRefused, match=r"available: \['opt'\]"):
        choose(artifact, {"m": "nope"})
