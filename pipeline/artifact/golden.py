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
        raise ArtifactError(disagreement(golden))
    arrays = {f"in.{k}": v for k, v in golden.inputs.items()}
    arrays |= {f"out.{k}": v for k, v in golden.outputs.items()}
    if golden.target is not None:
        arrays["target"] = golden.target
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    artifact.write_file(GOLDEN_NAME, buffer.getvalue())


def disagreement(golden: Golden) -> str:
    """Which golden arrays do not hold one row per sample along axis 0, their shapes, and the fix."""
    counts = [len(a) for a in golden.inputs.values()]
    samples = max(set(counts), key=counts.count) if counts else 0  # the inputs' count (the most common)
    arrays = {**{f"input {k!r}": v for k, v in golden.inputs.items()},
              **{f"output {k!r}": v for k, v in golden.outputs.items()},
              **({"target": golden.target} if golden.target is not None else {})}  # fmt: skip
    odd = []
    for what, array in arrays.items():
        if len(array) == samples:
            continue
        shape = list(np.shape(array))
        axes = [axis for axis, size in enumerate(shape) if axis and size == samples]
        name = what.split(" ", 1)[-1].strip("'")
        fix = (
            f"if its axis {axes[0]} holds the samples, declare it at import with --batch-axis {name}:{axes[0]}"
            if axes
            else "no axis of it grows with the samples: the model computes this shape whatever the batch"
        )
        odd.append(f"{what} has shape {shape} ({len(array)} along axis 0; {fix})")
    return (
        f"golden arrays disagree on the number of samples: the inputs hold {samples} sample(s), but "
        + "; ".join(odd)
        + f" (counts {sorted({len(a) for a in arrays.values()})}). golden.npz keeps every array's samples on "
        "axis 0, and the shapes above are the ones the model computes (not the ones it declares)"
    )


def load_golden(artifact: Artifact) -> Golden:
    """Read golden.npz (already verified against the manifest when the artifact was loaded)."""
    if GOLDEN_NAME not in artifact.manifest.files:
        raise ArtifactError(f"artifact {artifact.root} has no {GOLDEN_NAME}; train or import the model first")
    with np.load(artifact.path(GOLDEN_NAME), allow_pickle=False) as data:
        inputs = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
        outputs = {k[4:]: data[k] for k in data.files if k.startswith("out.")}
        target = data["target"] if "target" in data.files else None
    return Golden(inputs, outputs, target)
