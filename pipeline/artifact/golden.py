"""golden.npz: real inputs and the reference model's outputs on them, carried by the artifact.

Every later hop (ONNX export, quantized variants, TFLite, the server) is checked against these
numbers. Keys: `in.<input name>` and `out.<output name>` (same first dimension), plus `target`
(the ground truth, when known) so a hop can report the task metric too.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.core.errors import ArtifactError

GOLDEN_NAME = "golden.npz"


@dataclass
class Golden:
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    target: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))


def save_golden(artifact: Artifact, golden: Golden) -> None:
    """Write golden.npz atomically and record it in the manifest (the caller saves the manifest)."""
    sizes = {len(a) for a in [*golden.inputs.values(), *golden.outputs.values()]}
    if golden.target is not None:
        sizes.add(len(golden.target))
    if len(sizes) != 1:
        raise ArtifactError(f"golden arrays disagree on the number of samples: {sorted(sizes)}")
    arrays = {f"in.{k}": v for k, v in golden.inputs.items()}
    arrays |= {f"out.{k}": v for k, v in golden.outputs.items()}
    if golden.target is not None:
        arrays["target"] = golden.target
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    artifact.write_file(GOLDEN_NAME, buffer.getvalue())


def load_golden(artifact: Artifact) -> Golden:
    """Read golden.npz (already verified against the manifest when the artifact was loaded)."""
    if GOLDEN_NAME not in artifact.manifest.files:
        raise ArtifactError(f"artifact {artifact.root} has no {GOLDEN_NAME}; train or import the model first")
    with np.load(artifact.path(GOLDEN_NAME), allow_pickle=False) as data:
        inputs = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
        outputs = {k[4:]: data[k] for k in data.files if k.startswith("out.")}
        target = data["target"] if "target" in data.files else None
    return Golden(inputs, outputs, target)
