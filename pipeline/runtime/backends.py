"""Training backends behind one seam: later stages get the trained model through the artifact's backend.

`lineage.backend` names the framework that trained the model: torch, or ort (ONNX Runtime
training, whose trained model is already ONNX: `trained_onnx` gives export that file to gate as it
is). `pipe export` asks `backend_for(artifact)` for the trained model, real inputs to trace it
with, and a reference runner (named numpy arrays in and out) to verify the export against, and so
never imports a trainer's internals. A backend is a module path in `BACKENDS`, imported only when
an artifact needs it: `pipe serve` and `pipe info` never load a training framework.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

from pipeline.artifact.directory import Artifact
from pipeline.core.errors import ArtifactError

# lineage.backend -> the module whose BACKEND object serves it
BACKENDS = {"torch": "pipeline.train.restore", "ort": "pipeline.train.ort_restore"}


class Backend(Protocol):
    """What a training backend gives the stages after training."""

    name: str

    def load_model(self, artifact: Artifact) -> Any:
        """The trained model in the backend's framework, in eval mode, on the CPU."""

    def example_inputs(self, artifact: Artifact, batch: int) -> tuple[Any, ...]:
        """`batch` real samples, one tensor per model input in manifest order (for tracing)."""

    def reference(self, artifact: Artifact, model: Any) -> Any:
        """`model` as a runner: named numpy arrays in, named numpy arrays out."""


def trained_onnx(backend: Backend, artifact: Artifact) -> Path | None:
    """The trained model when the backend already holds it as ONNX (ort), else None (torch: export it)."""
    onnx_model = getattr(backend, "onnx_model", None)
    return None if onnx_model is None else onnx_model(artifact)


def backend_for(artifact: Artifact) -> Backend:
    """The backend that trained `artifact`, or an error saying why it has none."""
    name = artifact.manifest.lineage.backend
    if name == "import":
        raise ArtifactError(
            f"artifact {artifact.root} was imported, not trained: its model.onnx is already the artifact, so there "
            "is nothing to export (serve it, or run the later stages on it)"
        )
    if name is None:
        raise ArtifactError(
            f"artifact {artifact.root} records no training backend (lineage.backend is null), so there is no trained "
            f"model to export; re-train it (backends: {sorted(BACKENDS)})"
        )
    if name not in BACKENDS:
        raise ArtifactError(
            f"artifact {artifact.root} names training backend {name!r}; this pipe has {sorted(BACKENDS)}. "
            "Re-train it, or upgrade pipe"
        )
    try:
        module = importlib.import_module(BACKENDS[name])
    except ImportError as exc:
        raise ArtifactError(
            f"the {name} training backend is not installed ({exc}); install pipe's train extra: pip install '.[train]'"
        ) from None
    return module.BACKEND
