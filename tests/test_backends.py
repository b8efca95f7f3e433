"""The training-backend seam: later stages find the trained model by the artifact's lineage.backend."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipeline.artifact.directory import Artifact
from pipeline.core.errors import ArtifactError
from pipeline.runtime.backends import backend_for


@pytest.mark.parametrize(
    ("backend", "needle"),
    [
        (None, "records no training backend (lineage.backend is null)"),
        ("import", "was imported, not trained"),
        ("jax", "names training backend 'jax'; this pipe has ['ort', 'torch']"),
    ],
)
def test_an_artifact_without_a_usable_backend_is_refused_by_name(
    toy_artifact: Artifact, backend: str | None, needle: str
) -> None:
    toy_artifact.manifest.lineage = dataclasses.replace(toy_artifact.manifest.lineage, backend=backend)
    with pytest.raises(ArtifactError, match=re.escape(needle)):
        backend_for(toy_artifact)


@pytest.mark.parametrize("name", ["torch", "ort"])
def test_each_backend_is_found_by_name(toy_artifact: Artifact, name: str) -> None:
    toy_artifact.manifest.lineage = dataclasses.replace(toy_artifact.manifest.lineage, backend=name)
    backend = backend_for(toy_artifact)
    assert backend.name == name and callable(backend.load_model) and callable(backend.reference)
