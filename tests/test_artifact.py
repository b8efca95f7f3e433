from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.artifact.directory import Artifact, allocate_version, resolve_artifact, versions
from pipeline.artifact.manifest import MANIFEST_NAME, Manifest
from pipeline.artifact.records import ExportRecord
from pipeline.artifact.variants import Variant
from pipeline.core.errors import ArtifactError
from tests.conftest import build_artifact

EXPORT = ExportRecord(exporter="dynamo", opset=18, requested_opset=18, external_data=False)
EXPORT_JSON = {"exporter": "dynamo", "opset": 18, "requested_opset": 18, "external_data": False}


def test_round_trip(toy_artifact: Artifact) -> None:
    toy_artifact.manifest.stages.export = EXPORT
    toy_artifact.save()
    loaded = Artifact.load(toy_artifact.root)
    assert loaded.manifest == toy_artifact.manifest
    assert loaded.manifest.inputs[0].shape == ["batch", 4]
    assert loaded.manifest.files["model.onnx"].size == 340


def test_variant_is_recorded_with_its_size(toy_artifact: Artifact) -> None:
    (toy_artifact.root / "variants").mkdir()
    (toy_artifact.root / "variants" / "model.int8.onnx").write_bytes(b"q" * 100)
    toy_artifact.add_variant(
        "int8",
        Variant(
            file="variants/model.int8.onnx",
            precision="int8",
            format="onnx",
            stage="optimize",
            metrics={"accuracy": 0.96},
        ),
    )
    toy_artifact.save()
    loaded = Artifact.load(toy_artifact.root)
    assert loaded.manifest.variants["int8"].size == 100
    assert "variants/model.int8.onnx" in loaded.manifest.files


def test_tampered_file_is_refused_by_name(toy_artifact: Artifact) -> None:
    path = toy_artifact.root / "model.onnx"
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"model\.onnx: sha256 does not match"):
        Artifact.load(toy_artifact.root)


def test_truncated_file_is_refused_by_name(toy_artifact: Artifact) -> None:
    path = toy_artifact.root / "reports" / "train.json"
    path.write_bytes(path.read_bytes()[:4])
    with pytest.raises(ArtifactError, match=r"reports/train\.json: size 4 bytes, manifest says 13"):
        Artifact.load(toy_artifact.root)


def test_missing_file_and_every_problem_listed(toy_artifact: Artifact) -> None:
    (toy_artifact.root / "model.onnx").unlink()
    (toy_artifact.root / "reports" / "train.json").write_bytes(b"x")
    with pytest.raises(ArtifactError) as err:
        Artifact.load(toy_artifact.root)
    assert "model.onnx: missing" in str(err.value)
    assert "reports/train.json: size" in str(err.value)


@pytest.mark.parametrize("bad", ["../outside.bin", "/etc/passwd", "reports/../../x"])
def test_path_escape_in_manifest_is_refused(toy_artifact: Artifact, bad: str) -> None:
    data = json.loads((toy_artifact.root / MANIFEST_NAME).read_text())
    data["files"][bad] = {"sha256": "0" * 64, "size": 1}
    (toy_artifact.root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="escapes the artifact directory"):
        Artifact.load(toy_artifact.root)


def test_symlink_out_of_the_artifact_is_refused(toy_artifact: Artifact, tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"outside")
    (toy_artifact.root / "link.bin").symlink_to(secret)
    with pytest.raises(ArtifactError, match="outside the artifact"):
        toy_artifact.add_file("link.bin")
    data = json.loads((toy_artifact.root / MANIFEST_NAME).read_text())
    data["files"]["link.bin"] = {"sha256": "0" * 64, "size": 7}
    (toy_artifact.root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"link\.bin.*outside the artifact"):
        Artifact.load(toy_artifact.root)


def test_unknown_and_missing_manifest_keys_are_named(toy_artifact: Artifact) -> None:
    path = toy_artifact.root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["colour"] = "blue"
    del data["task"]
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"unknown key\(s\) \['colour'\]; missing key\(s\) \['task'\]"):
        Artifact.load(toy_artifact.root)


def test_newer_schema_is_refused(toy_artifact: Artifact) -> None:
    path = toy_artifact.root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="schema_version 99 is not supported"):
        Artifact.load(toy_artifact.root)


def test_corrupt_json_is_refused(toy_artifact: Artifact) -> None:
    (toy_artifact.root / MANIFEST_NAME).write_text('{"name": ')
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Artifact.load(toy_artifact.root)


CRASH_DURING_SAVE = """
import os, signal, sys
from pipeline.artifact.directory import Artifact
artifact = Artifact.load(sys.argv[1])
artifact.manifest.metrics["accuracy"] = 0.5
def die(fd):
    # The new manifest is written to its temp file but not yet renamed: the worst moment.
    os.kill(os.getpid(), signal.SIGKILL)
os.fsync = die
artifact.save()
"""


def test_crash_during_save_keeps_the_previous_manifest(toy_artifact: Artifact) -> None:
    before = (toy_artifact.root / MANIFEST_NAME).read_bytes()
    proc = subprocess.run([sys.executable, "-c", CRASH_DURING_SAVE, str(toy_artifact.root)], check=False)
    assert proc.returncode == -9
    assert (toy_artifact.root / MANIFEST_NAME).read_bytes() == before
    assert Artifact.load(toy_artifact.root).manifest.metrics["accuracy"] == 0.97
    leftovers = [p.name for p in toy_artifact.root.iterdir() if p.name.endswith(".tmp")]
    assert leftovers  # the killed writer's temp file is there, and loading ignores it


def test_written_files_get_the_usual_permissions(toy_artifact: Artifact) -> None:
    # a server or a Triton container running as another user reads these: not mkstemp's 0600
    umask = os.umask(0)
    os.umask(umask)
    for rel in (MANIFEST_NAME, "model.onnx"):
        assert (toy_artifact.root / rel).stat().st_mode & 0o777 == 0o666 & ~umask


def test_identity_digest_ignores_what_later_stages_add(toy_artifact: Artifact) -> None:
    before = toy_artifact.manifest.identity_digest()
    toy_artifact.manifest.metrics["latency_ms"] = 1.0
    toy_artifact.manifest.stages.export = EXPORT
    assert toy_artifact.manifest.identity_digest() == before
    toy_artifact.manifest.labels = ["x", "y", "z"]
    assert toy_artifact.manifest.identity_digest() != before


def test_versions_allocate_and_resolve(tmp_path: Path) -> None:
    root = tmp_path / "m"
    first = allocate_version(root)
    second = allocate_version(root)
    assert (first.name, second.name) == ("1", "2")
    build_artifact(first, "m", 1)
    build_artifact(second, "m", 2)
    os.mkdir(root / "3")  # a version still being written has no manifest: not listed
    assert versions(root) == [1, 2]
    assert resolve_artifact(root) == second
    assert resolve_artifact(first) == first
    with pytest.raises(ArtifactError, match="does not exist"):
        resolve_artifact(tmp_path / "nope")


def test_manifest_from_dict_requires_an_object() -> None:
    with pytest.raises(ArtifactError, match="expected a JSON object"):
        Manifest.from_dict([], "m.json")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("version", "1", "version: expected an integer, got '1'"),
        ("version", True, "version: expected an integer, got True"),
        ("name", 7, "name: expected a string, got 7"),
        ("labels", ["a", 2], r"labels\[1\]: expected a string, got 2"),
        ("metrics", {"accuracy": "high"}, "metrics.accuracy: expected a number, got 'high'"),
    ],
)
def test_mistyped_scalars_are_named(toy_artifact: Artifact, key: str, value: object, needle: str) -> None:
    path = toy_artifact.root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=needle):
        Artifact.load(toy_artifact.root)


def _int8_variant(**changes: object) -> dict[str, object]:
    variant = {"file": "variants/model.int8.onnx", "precision": "int8", "format": "onnx", "stage": "optimize"}
    return {"int8": {**variant, **changes}}


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("metrics", {"accuracy": float("nan")}, "metrics.accuracy: expected a finite number, got nan"),
        ("metrics", {"accuracy": float("inf")}, "metrics.accuracy: expected a finite number, got inf"),
        ("metrics", {"accuracy": 10**400}, "metrics.accuracy: expected a finite number"),
        ("outputs", [], "outputs: empty; a model has at least one"),
        ("inputs", [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}] * 2, r"inputs: names must be distinct"),
        ("labels", ["a", "b"], "labels: 2 class names, but output 'logits' has 3 classes"),
        ("variants", _int8_variant(), r"variants.int8.file: 'variants/model.int8.onnx' is not listed in files"),
        ("variants", _int8_variant(file="model.onnx"), r"variants.int8.file: 'model.onnx', but variant 'int8' lives"),
        ("variants", _int8_variant(file="../x.onnx"), r"variants.int8.file: '../x.onnx', but variant 'int8' lives"),
        ("variants", _int8_variant(status="failed", format="tflite"), r"variants.int8.format: 'tflite', but"),
        ("variants", _int8_variant(status="failed", size=-5), r"variants.int8.size: expected a size in bytes >= 0"),
        ("stages", {"export": {**EXPORT_JSON, "opset": "18"}}, "stages.export.opset: expected an integer, got '18'"),
        ("detection", {"confidence": 0.25}, "detection: recorded for task 'classification'; it belongs to task 'det"),
        ("detection", {"confidence": 1.5}, "detection.confidence: expected a number from 0 to 1, got 1.5"),
        ("detection", {"max_detections": 0}, "detection.max_detections: expected a number >= 1, got 0"),
        ("task", "detection", "detection: missing; a task 'detection' model records how its output becomes boxes"),
        ("task", "segmentation", "task: expected one of .*'detection', 'tensor'.*got 'segmentation'"),
    ],
)
def test_a_manifest_contradicting_itself_is_refused_by_field(
    toy_artifact: Artifact, key: str, value: object, needle: str
) -> None:
    """Each field valid alone is not enough: a variant must live in its own file, listed and verified."""
    path = toy_artifact.root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=needle) as err:
        Artifact.load(toy_artifact.root)
    assert "\n" not in str(err.value)


def test_a_failed_variant_need_not_keep_its_file(toy_artifact: Artifact) -> None:
    path = toy_artifact.root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["variants"] = _int8_variant(status="failed", reason="agreement 0.91 < 0.99")
    path.write_text(json.dumps(data))
    assert not Artifact.load(toy_artifact.root).manifest.variants["int8"].passed
