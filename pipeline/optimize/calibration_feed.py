"""Calibration samples as onnxruntime's static quantizer reads them: checked against the graph, batched.

The caller brings real inputs (pipeline/samples/calibration.py); this module checks they fit the graph's
inputs (names, dtypes, fixed dims, equal counts) and feeds them one batch per calibration pass
(`CalibStridedMinMax`, which despite its name strides every calibrator): onnxruntime's histogram
calibrators (entropy, percentile) hold every activation of a pass in memory, which for a conv net
at 224x224 is tens of MB per sample, so one batch at a time keeps calibration bounded, and the
histograms merge across passes. Every calibrator also runs the model with every intermediate tensor
as an output: a batch's activations all at once (a PP-OCRv4 recognizer at 48x320: about 0.2 GB a
sample, 7.1 GB peak at 16 a pass). So a batch is as many samples as ACTIVATIONS holds, measured on
one sample first (`activation_bytes`), and never more than BATCH.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader

from pipeline.core.errors import InputError, first_line
from pipeline.runtime.session import create_session

BATCH = 16  # calibration samples per session run and per calibration pass: bounded memory on large inputs
ACTIVATIONS = 256 * 2**20  # bytes of intermediate tensors one calibration pass may hold (its batch's)
STRIDE = {"CalibStridedMinMax": 1}  # quantize_static's extra option: one reader item (one batch) per pass
Progress = Callable[[int, int], None]  # (samples calibrated so far, samples in all)


class SampleReader(CalibrationDataReader):
    """The calibration samples in batches of `batch`, reporting progress per batch.

    onnxruntime's strided calibration calls `set_range` with batch indices, then reads that range.
    """

    def __init__(self, arrays: dict[str, np.ndarray], batch: int, samples: int, progress: Progress | None) -> None:
        self.arrays, self.batch, self.samples, self.progress = arrays, batch, samples, progress
        self.start, self.stop = 0, samples
        self.stdout = sys.stdout  # the caller's: calibration runs with stdout muted, progress must still show

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.start >= self.stop:
            return None
        stop = min(self.start + self.batch, self.stop)
        batch = {name: array[self.start : stop] for name, array in self.arrays.items()}
        self.start = stop
        if self.progress is not None:
            with contextlib.redirect_stdout(self.stdout):
                self.progress(stop, self.samples)
        return batch

    def __len__(self) -> int:
        return math.ceil(self.samples / self.batch)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Read batches `start_index` to `end_index` (exclusive) next."""
        self.start, self.stop = start_index * self.batch, min(end_index * self.batch, self.samples)

    def rewind(self) -> None:
        self.start, self.stop = 0, self.samples


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def sample_reader(
    model: onnx.ModelProto,
    calibration: dict[str, np.ndarray],
    samples: int,
    progress: Progress | None,
    warnings: list[str],
    scratch: Path | None = None,
) -> SampleReader:
    """A reader of `samples` calibration samples for `model`: the batch its inputs fix, else as many a run as
    ACTIVATIONS holds (measured on one sample when `scratch` is given), at most BATCH."""
    fixed = {_dims(value)[0] for value in _graph_inputs(model) if _dims(value)} - {None}
    batch = min(fixed) if fixed else BATCH
    if not fixed and scratch is not None and samples > 1:
        try:
            each = activation_bytes(model, {name: array[:1] for name, array in calibration.items()}, scratch)
        except InputError as exc:
            each = 0
            warnings.append(f"calibrated {BATCH} samples a pass, unmeasured: {exc}")
        batch = max(1, min(BATCH, ACTIVATIONS // max(each, 1)))
        if batch < BATCH:
            warnings.append(f"calibrated {batch} sample(s) a pass: one sample's intermediate tensors take "
                            f"{each / 2**20:.0f} MB (bound {ACTIVATIONS / 2**20:.0f} MB a pass)")  # fmt: skip
    used = samples - samples % batch if fixed else samples  # a fixed batch takes exactly that many a run
    if used == 0:
        raise InputError(f"the model takes batches of exactly {batch}; give at least {batch} calibration samples")
    if used < samples:
        warnings.append(f"calibrated on {used} of {samples} samples: the model takes batches of exactly {batch}")
    return SampleReader(calibration, batch, used, progress)


def activation_bytes(model: onnx.ModelProto, sample: dict[str, np.ndarray], scratch: Path) -> int:
    """Bytes of every float intermediate tensor of `model` on `sample` (one sample): what a calibrator holds."""
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    probe.graph.ClearField("value_info")
    inferred = onnx.shape_inference.infer_shapes(probe)
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}
    named = {v.name for v in (*probe.graph.input, *probe.graph.output)}
    extra = [v for v in inferred.graph.value_info if v.type.tensor_type.elem_type in floats and v.name not in named]
    probe.graph.output.extend(extra)
    del inferred
    path = scratch / "activations.onnx"
    scratch.mkdir(parents=True, exist_ok=True)
    onnx.save(probe, str(path))
    del probe
    try:
        outputs = create_session(path, intra_op_threads=1).run(None, sample)
    except Exception as exc:  # onnxruntime's errors share no base: the caller keeps BATCH and says why
        raise InputError(f"cannot measure the activations of one calibration sample: {first_line(exc)}") from exc
    finally:
        path.unlink(missing_ok=True)
    return int(sum(np.asarray(o).nbytes for o in outputs))


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
