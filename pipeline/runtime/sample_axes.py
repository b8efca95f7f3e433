"""Where a model keeps its samples, and pipe's arrays moved there and back at the runtime's door.

Every array pipe passes between its parts (golden.npz, an evaluation split, calibration samples,
the gate's batch 1/2/N) leads with the sample axis, so slicing and concatenating samples is one rule
everywhere. Most models agree. Two kinds do not, and are run through `SampleAxes`:

- a tensor whose batch is another axis: Silero VAD's state is [2, batch, 128] (axis 1); the samples
  are moved to that axis before the run and the outputs' batch axes back to the front after it;
- a model whose batch is fixed (ddddocr's recognizer takes [1, 1, 64, width]): any number of samples
  is run `fixed` at a time, so the whole evaluation data is judged, not one picture.

The import records the axes on the manifest's specs (`batch_axis`, a fixed batch as its int) and
stamps them into the model's metadata_props (`pipe.sample_axes`), so `ort_runner` on any file made
from the model reads them back (optimize's variants keep metadata_props). A model that needs neither
has no stamp and runs as is; a fixed batch is never read off a graph that has no stamp, so a batch
fixed by mistake at export still fails the gate's batch 2 and N.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError

if TYPE_CHECKING:
    from pipeline.artifact.tensors import TensorSpec

METADATA_KEY = "pipe.sample_axes"  # in model.onnx's metadata_props: {"inputs": {...}, "outputs": {...}}


@dataclass(frozen=True)
class SampleAxes:
    """The batch axis of each tensor that does not keep it first, and a fixed batch size, if any."""

    inputs: dict[str, int] = field(default_factory=dict)  # input -> its batch axis (absent: 0)
    outputs: dict[str, int] = field(default_factory=dict)  # output -> its batch axis (absent: 0)
    fixed: int | None = None  # the model takes exactly this many samples per run (its declared batch)

    @property
    def trivial(self) -> bool:
        """Nothing to move and nothing to split: the model takes pipe's arrays as they are."""
        return not self.inputs and not self.outputs and self.fixed is None

    @classmethod
    def of_specs(cls, inputs: Iterable[TensorSpec], outputs: Iterable[TensorSpec]) -> SampleAxes:
        """The axes the manifest's specs record; `fixed` when every input's batch dim is one int."""
        inputs, outputs = list(inputs), list(outputs)
        sizes = {s.shape[s.sample_axis] if s.shape else None for s in inputs}
        fixed = sizes.pop() if len(sizes) == 1 and isinstance(next(iter(sizes)), int) else None
        return cls(
            {s.name: s.batch_axis for s in inputs if s.batch_axis},
            {s.name: s.batch_axis for s in outputs if s.batch_axis},
            fixed,
        )

    def metadata(self) -> str:
        """The stamp in metadata_props. A fixed batch is stamped, never read off the graph: a batch fixed by
        mistake at export must fail the gate's batch 2 and N, not be run a sample at a time."""
        return json.dumps({"inputs": self.inputs, "outputs": self.outputs, "fixed": self.fixed}, sort_keys=True)

    @classmethod
    def read(cls, metadata: dict[str, str]) -> SampleAxes:
        """The axes stamped in a model's metadata_props (none: the model takes pipe's arrays as they are)."""
        try:
            stamped = json.loads(metadata.get(METADATA_KEY) or "{}")
            inputs = {str(k): int(v) for k, v in stamped.get("inputs", {}).items()}
            outputs = {str(k): int(v) for k, v in stamped.get("outputs", {}).items()}
            fixed = int(stamped["fixed"]) if stamped.get("fixed") else None
        except (ValueError, TypeError, AttributeError) as exc:
            why = f"metadata_props[{METADATA_KEY!r}] is not pipe's stamp ({exc}); re-import the model"
            raise InputError(why) from None
        return cls(inputs, outputs, fixed)

    def to_model(self, arrays: Arrays) -> Arrays:
        """Sample-leading inputs -> the model's own layout (samples on each input's batch axis)."""
        return {k: np.moveaxis(v, 0, self.inputs[k]) if self.inputs.get(k) else v for k, v in arrays.items()}

    def from_model(self, arrays: Arrays) -> Arrays:
        """The model's outputs -> sample-leading."""
        return {k: np.moveaxis(v, self.outputs[k], 0) if self.outputs.get(k) else v for k, v in arrays.items()}

    def wrap(self, run: Callable[[Arrays], Arrays]) -> Callable[[Arrays], Arrays]:
        """`run` (model layout) as a runner of sample-leading arrays, `fixed` samples per call."""
        if self.trivial:
            return run

        def adapted(arrays: Arrays) -> Arrays:
            count = len(next(iter(arrays.values())))
            step = self.fixed if self.fixed and count % self.fixed == 0 and count > self.fixed else count
            parts = [
                self.from_model(run(self.to_model({k: v[start : start + step] for k, v in arrays.items()})))
                for start in range(0, max(count, 1), max(step, 1))
            ]
            if len(parts) == 1:
                return parts[0]
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

        return adapted


def model_layout(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """One sample-leading array as `spec`'s tensor takes it."""
    return np.moveaxis(array, 0, spec.batch_axis) if spec.batch_axis else array


def sample_leading(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """One array in `spec`'s own layout with its samples moved to the front."""
    return np.moveaxis(array, spec.batch_axis, 0) if spec.batch_axis else array
