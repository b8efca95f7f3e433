from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.records import CheckpointRecord, GoldenRecord, TrainRecord
from pipeline.artifact.tensors import TensorSpec

# A linear model in ONNX text syntax, with weights: the smallest real model to import and serve.
LINEAR = """
<ir_version: 8, opset_import: ["" : 18], producer_name: "handwritten">
linear (float[N, 4] x) => (float[N, 3] y)
<float[4, 3] W = {1.0, -1.0, 0.5, 0.5, 2.0, -1.0, -1.5, 0.0, 1.0, 0.0, 1.0, 2.0}, float[3] b = {0.1, -0.2, 0.3}>
{
    t = MatMul(x, W)
    y = Add(t, b)
}
"""


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


def train_record(settings: dict[str, Any], data: dict[str, Any], **changes: Any) -> TrainRecord:
    """A train record as `pipe train` writes it, for a model trained on 100 samples in one step."""
    fields: dict[str, Any] = {
        "settings": settings,
        "data": data,
        "checkpoint": CheckpointRecord(weights="checkpoint/model.safetensors"),
        "golden": GoldenRecord(split="test", samples=15, whole_split=True, split_size=15),
        "splits": {"train": 70, "val": 15, "test": 15},
        "device": "cpu",
        "precision": "fp32",
        "best_epoch": 1,
        "epochs_run": 1,
        "steps": 1,
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "samples_per_s": 0.0,
    }
    return TrainRecord(**{**fields, **changes})


@pytest.fixture
def toy_artifact(tmp_path: Path) -> Artifact:
    return build_artifact(tmp_path / "artifacts" / "toy" / "1")


# Modules whose tests assert wall-clock bounds (a health probe's worst wait beside an attack, a deadline that
# must fire within seconds, a picture answered within 2 s): `make test` runs them alone after the parallel run,
# so another worker's training cannot take their core (docs/testing.md).
SERIAL_MODULES = {
    "tests/serve/test_freezes.py",
    "tests/serve/test_labels_files.py",
    "tests/serve/test_operations.py",
    "tests/serve/test_images.py",
    "tests/serve/test_detection_bounds.py",
    "tests/serve/test_drain.py",
    "tests/serve/test_limits.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    for item in items:
        if Path(item.path).resolve().relative_to(root).as_posix() in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
