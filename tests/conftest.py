from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.artifact import Artifact
from pipeline.manifest import Manifest, TensorSpec


def build_artifact(root: Path, name: str = "toy", version: int = 1) -> Artifact:
    """A small but complete artifact: a manifest and two listed files."""
    manifest = Manifest(
        name=name,
        version=version,
        task="classification",
        inputs=[TensorSpec("x", "float32", ["batch", 4])],
        outputs=[TensorSpec("logits", "float32", ["batch", 3])],
        labels=["a", "b", "c"],
        metrics={"accuracy": 0.97},
    )
    artifact = Artifact(root, manifest)
    root.mkdir(parents=True, exist_ok=True)
    artifact.write_file("model.onnx", b"not really onnx, but bytes to hash" * 10)
    artifact.write_file("reports/train.json", b'{"loss": 0.1}')
    artifact.save()
    return artifact


@pytest.fixture
def toy_artifact(tmp_path: Path) -> Artifact:
    return build_artifact(tmp_path / "artifacts" / "toy" / "1")
