"""Calibration samples as onnxruntime's static quantizer reads them: checked against the graph, batched.

The caller brings real inputs (pipeline/samples/calibration.py); this module checks they fit the graph's
inputs (names, dtypes, fixed dims, equal counts) and feeds them in batches of equal size where
onnxruntime's histogram calibrators need that, reporting progress per batch.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader

from pipeline.core.errors import InputError

BATCH = 16  # calibration samples per session run: small, so large models calibrate in bounded memory
Progress = Callable[[int, int], None]  # (samples calibrated so far, samples in all)


class SampleReader(CalibrationDataReader):
    """The calibration samples in batches of `batch`, reporting progress per batch."""

    def __init__(self, arrays: dict[str, np.ndarray], batch: int, samples: int, progress: Progress | None) -> None:
        self.arrays, self.batch, self.samples, self.progress, self.start = arrays, batch, samples, progress, 0
        self.stdout = sys.stdout  # the caller's: calibration runs with stdout muted, progress must still show

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.start >= self.samples:
            return None
        stop = min(self.start + self.batch, self.samples)
        batch = {name: array[self.start : stop] for name, array in self.arrays.items()}
        self.start = stop
        if self.progress is not None:
            with contextlib.redirect_stdout(self.stdout):
                self.progress(stop, self.samples)
        return batch

    def __len__(self) -> int:
        return math.ceil(self.samples / self.batch)

    def rewind(self) -> None:
        self.start = 0


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def sample_reader(
    model: onnx.ModelProto,
    calibration: dict[str, np.ndarray],
    samples: int,
    method: str,
    progress: Progress | None,
    warnings: list[str],
) -> SampleReader:
    batch, used = _batching(model, samples, method)
    if used == 0:
        raise InputError(f"the model takes batches of exactly {batch}; give at least {batch} calibration samples")
    if used < samples:
        warnings.append(
            f"calibrated on {used} of {samples} samples: {method} calibration needs equal batches of {batch}"
        )
    return SampleReader(calibration, batch, used, progress)


def _batching(model: onnx.ModelProto, samples: int, method: str) -> tuple[int, int]:
    """(samples per run, samples used) for calibrating `model` on `samples` samples with `method`.

    A graph with a fixed batch size takes exactly that many a run. onnxruntime's histogram
    calibrators (entropy, percentile) stack the batches into one array, so their batches must be
    equal too: the largest divisor of `samples` up to BATCH, or BATCH and the remainder left out
    when that divisor is small (a prime count).
    """
    fixed = {_dims(value)[0] for value in _graph_inputs(model) if _dims(value)} - {None}
    if fixed:
        batch = min(fixed)
    elif method == "minmax":
        return BATCH, samples
    else:
        batch = max(d for d in range(1, BATCH + 1) if samples % d == 0)
        batch = batch if batch > BATCH // 4 or samples < BATCH else BATCH
    return batch, samples - samples % batch


def check_calibration(model: onnx.ModelProto, calibration: dict[str, np.ndarray]) -> int:
    """The number of samples, after checking they fit the graph's inputs by name, dtype and fixed dims."""
    inputs = {value.name: value for value in _graph_inputs(model)}
    if set(calibration) != set(inputs):
        raise InputError(
            f"calibration samples are for inputs {sorted(calibration)} but the model's inputs are "
            f"{sorted(inputs)}; give one array per model input, named as the model names it"
        )
    problems, counts = [], set()
    for name, value in inputs.items():
        array = np.asarray(calibration[name])
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        if array.dtype != dtype:
            problems.append(f"{name} is {array.dtype} but the model takes {dtype} (cast it, e.g. .astype('{dtype}'))")
        dims = _dims(value)
        if array.ndim != len(dims) or any(
            d is not None and d != s for d, s in zip(dims[1:], array.shape[1:], strict=False)
        ):
            problems.append(
                f"{name} has shape {list(array.shape)} but the model takes "
                f"{[d if d is not None else '?' for d in dims]} (samples along axis 0, in the "
                "model's own layout)"
            )
        counts.add(len(array) if array.ndim else 0)
    if not problems and (len(counts) != 1 or 0 in counts):
        problems.append(f"each input needs the same number of samples, at least 1; got {sorted(counts)}")
    if problems:
        raise InputError("calibration samples do not fit the model: " + "; ".join(problems))
    return counts.pop()
