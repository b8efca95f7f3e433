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
        ("ort", "names training backend 'ort'; this pipe has ['torch']"),
    ],
)
def test_an_artifact_without_a_usable_backend_is_refused_by_name(
    toy_artifact: Artifact, backend: str | None, needle: str
) -> None:
    toy_artifact.manifest.lineage = dataclasses.replace(toy_artifact.manifest.lineage, backend=backend)
    with pytest.raises(ArtifactError, match=re.escape(needle)):
        backend_for(toy_artifact)


def test_the_torch_backend_is_found_by_name(toy_artifact: Artifact) -> None:
    toy_artifact.manifest.lineage = dataclasses.replace(toy_artifact.manifest.lineage, backend="torch")
    backend = backend_for(toy_artifact)
    assert backend.name == "torch" and callable(backend.load_model) and callable(backend.reference)
