from __future__ import annotations

import numpy as np
import pytest

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import Golden, load_golden, save_golden
from pipeline.core.errors import ArtifactError


def test_golden_round_trip_through_the_manifest(toy_artifact: Artifact) -> None:
    rng = np.random.default_rng(0)
    golden = Golden(
        {"x": rng.normal(size=(5, 4)).astype(np.float32)}, {"logits": rng.normal(size=(5, 3))}, np.arange(5)
    )
    save_golden(toy_artifact, golden)
    toy_artifact.save()
    loaded = load_golden(Artifact.load(toy_artifact.root))
    np.testing.assert_array_equal(loaded.inputs["x"], golden.inputs["x"])
    np.testing.assert_array_equal(loaded.outputs["logits"], golden.outputs["logits"])
    np.testing.assert_array_equal(loaded.target, np.arange(5))
    assert len(loaded) == 5


def test_golden_sample_counts_must_agree(toy_artifact: Artifact) -> None:
    with pytest.raises(ArtifactError, match=r"disagree on the number of samples: \[3, 5\]"):
        save_golden(toy_artifact, Golden({"x": np.zeros((5, 4))}, {"y": np.zeros((3, 1))}))


def test_missing_golden_is_named(toy_artifact: Artifact) -> None:
    with pytest.raises(ArtifactError, match="has no golden.npz"):
        load_golden(toy_artifact)
