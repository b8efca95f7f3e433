"""The ORT training backend as later stages see it: the trained model is already ONNX.

`pipe train --backend ort` leaves the trained inference model in `checkpoint/model.onnx` (the
kept epoch's weights, as ONNX Runtime training exported it) and golden.npz holds what the training
runtime's eval model answered on the test split. `pipe export` reaches this module through
`pipeline.runtime.backends` by `lineage.backend: ort`: `onnx_model` gives it the file to gate
instead of a torch module to export, and `reference` runs that file with onnxruntime, so the gate
checks model.onnx against the trained model and against the training runtime's golden outputs.
Nothing here imports torch or the ORT training runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.core.errors import ArtifactError


def trained_model(artifact: Artifact) -> Path:
    """checkpoint/model.onnx (the train record's weights), verified as listed in the manifest."""
    record = artifact.manifest.stages.train
    if record is None:
        raise ArtifactError(f"artifact {artifact.root} has no train record (manifest stages.train); re-train it")
    weights = record.checkpoint.weights
    if weights not in artifact.manifest.files:
        raise ArtifactError(f"{weights} is not listed in {artifact.root}/manifest.json; re-train the model")
    return artifact.path(weights)


class OrtBackend:
    """`lineage.backend: ort`: the trained ONNX file, real inputs, and its onnxruntime runner."""

    name = "ort"

    def load_model(self, artifact: Artifact) -> Path:
        return trained_model(artifact)

    def onnx_model(self, artifact: Artifact) -> Path:
        """The trained model, already ONNX: export gates this file rather than exporting a module."""
        return trained_model(artifact)

    def example_inputs(self, artifact: Artifact, batch: int) -> tuple[np.ndarray, ...]:
        """`batch` real samples from golden.npz, one array per model input in manifest order."""
        from pipeline.artifact.golden import load_golden

        golden = load_golden(artifact)
        arrays = []
        for spec in artifact.manifest.inputs:
            array = golden.inputs[spec.name]
            arrays.append(np.ascontiguousarray(array[np.resize(np.arange(len(array)), batch)]))
        return tuple(arrays)

    def reference(self, artifact: Artifact, model: Any) -> Any:
        """The trained ONNX file as a runner (onnxruntime on the CPU): named numpy arrays in and out."""
        from pipeline.runtime.runners import ort_runner

        return ort_runner(model)


BACKEND = OrtBackend()
