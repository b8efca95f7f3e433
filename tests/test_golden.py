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
    with pytest.raises(ArtifactError, match=r"disagree on the number of samples: .*counts \[3, 5\]"):
        save_golden(toy_artifact, Golden({"x": np.zeros((5, 4))}, {"y": np.zeros((3, 1))}))


def test_golden_disagreement_names_the_output_and_the_fix(toy_artifact: Artifact) -> None:
    """A time-major output [T, 1, C] of a fixed-batch model: before, `... samples: [1, 8]`, naming nothing."""
    golden = Golden({"x": np.zeros((1, 3, 32, 64))}, {"logits": np.zeros((8, 1, 5)), "ok": np.zeros((1, 2))})
    with pytest.raises(ArtifactError) as caught:
        save_golden(toy_artifact, golden)
    said = str(caught.value)
    assert "the inputs hold 1 sample(s), but output 'logits' has shape [8, 1, 5] (8 along axis 0" in said
    assert "--batch-axis logits:1" in said and "'ok'" not in said


def test_missing_golden_is_named(toy_artifact: Artifact) -> None:
    with pytest.raises(ArtifactError, match="has no golden.npz"):
        load_golden(toy_artifact)
