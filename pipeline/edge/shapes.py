"""The shapes an edge model is converted at: the batch left free, every other free dim fixed.

Devices run fixed shapes: tflite-runtime 2.14 aborts (SIGABRT, heap corruption) on a model converted
with free spatial dims that LiteRT runs, and onnx2tf converts a YOLOv8 head only with its image size
fixed (docs/edge.md, The conversion). So every free dim of model.onnx's inputs but the batch is fixed
before conversion, at a size the artifact knows, in this order:

1. `--input-shape NAME:d0,d1,...` (the recipe's `edge.input_shapes`), the syntax of `pipe import`;
2. the recorded image preprocessing (the size pictures are made: a crop, a letterbox, a stretch);
3. the image size the exporter recorded (Ultralytics' `imgsz`, read at import);
4. the golden inputs' shape (the size the model was judged at when it was made or imported): a
   guess when they were generated (a model imported without --eval-data or --input-shape, whose
   free dims the importer filled), said as one (`FixedDim.guessed`) in the progress, the record
   and every failure, with the flag that gives the real size (`guessed_advice`);
5. a token input's recorded `max_length`.

The batch (an input's leading free dim, and every axis sharing its name) stays free: onnx2tf keeps
it dynamic, and the gate runs batch 1, 2 and 16. Each fixed dim is recorded with where its size came
from (`FixedDim`). Serving is unchanged: model.onnx keeps its free dims.

When a fixed size differs from the evaluation samples' (an `--input-shape` other than the golden
size), image inputs are resampled to it (nearest pixel) and the recorded outputs are left out, since
the reference runs on the resampled inputs; any other input is refused, naming the size that fits.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np

from pipeline.artifact.dims import Shapes, apply_input_shapes
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.preprocessing import image_record
from pipeline.artifact.records import FixedDim
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError
from pipeline.samples.evaluation import EvaluationSet

IMAGE_LAYOUTS = ("NCHW", "NHWC")
GUESSED = "guessed"  # how a FixedDim's source begins when nothing real gave the size


def guessed_advice(fixed: list[FixedDim], inputs: list[TensorSpec]) -> str | None:
    """One line naming the guessed sizes and the `--input-shape` that gives the real ones; None when none was
    guessed. Every failure of an edge run at a guessed size carries it."""
    guessed = [f for f in fixed if f.guessed]
    if not guessed:
        return None
    shapes = {s.name: s.shape for s in inputs}
    sizes = ", ".join(f"{f.input} axis {f.axis} ({f.dim}) = {f.size}" for f in guessed)
    flags = []
    for name in dict.fromkeys(f.input for f in guessed):
        at = {f.axis: f.dim for f in guessed if f.input == name}
        dims = ["?" if a == 0 else (f"<{at[a]}>" if a in at else str(d)) for a, d in enumerate(shapes.get(name, []))]
        flags.append(f"--input-shape {name}:{','.join(dims)}")
    return (f"the edge models were made at a guessed size ({sizes}: golden.npz's generated inputs, the model was "
            f"imported without --eval-data); give the size the model takes with {' '.join(flags)} (each <dim> its "
            "real size), here or at pipe import")  # fmt: skip


def spatial_axes(spec: TensorSpec) -> tuple[int, ...]:
    """Height and width of an image input; () for any other input."""
    if len(spec.shape) != 4 or spec.layout not in IMAGE_LAYOUTS:
        return ()
    return (2, 3) if spec.layout == "NCHW" else (1, 2)


def is_picture(spec: TensorSpec) -> bool:
    """An input that takes pictures: a 4-D NCHW/NHWC image or one with a recorded image preprocessing."""
    return bool(spatial_axes(spec)) or "image" in spec.preprocessing


def device_specs(
    manifest: Manifest, samples: Arrays, given: Shapes
) -> tuple[list[TensorSpec], list[TensorSpec], list[FixedDim]]:
    """model.onnx's inputs and outputs with every free non-batch dim fixed (see the module doc), and the dims fixed."""
    inputs, outputs = copy.deepcopy(manifest.inputs), copy.deepcopy(manifest.outputs)
    fixed: list[FixedDim] = []
    if given:
        declared = {spec.name: list(spec.shape) for spec in inputs}
        apply_input_shapes(given, inputs, outputs)
        for spec in inputs:
            for axis, (old, new) in enumerate(zip(declared[spec.name], spec.shape, strict=True)):
                if isinstance(old, str) and isinstance(new, int):
                    fixed.append(FixedDim(input=spec.name, axis=axis, dim=old, size=new, source="--input-shape"))
    batch = {spec.shape[0] for spec in inputs if spec.shape and isinstance(spec.shape[0], str)}
    chosen: dict[str, tuple[int, str]] = {}
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if axis == 0 or not isinstance(dim, str) or dim in batch:
                continue
            if dim not in chosen:
                chosen[dim] = _known_size(manifest, spec, axis, samples)
            size, source = chosen[dim]
            guessed = source.startswith(GUESSED)
            fixed.append(FixedDim(input=spec.name, axis=axis, dim=dim, size=size, source=source, guessed=guessed))
    for spec in [*inputs, *outputs]:
        spec.shape = [chosen[d][0] if isinstance(d, str) and d in chosen else d for d in spec.shape]
    return inputs, outputs, fixed


def _known_size(manifest: Manifest, spec: TensorSpec, axis: int, samples: Arrays) -> tuple[int, str]:
    spatial = spatial_axes(spec)
    if axis in spatial:
        side = spatial.index(axis)
        if record := image_record(spec):
            height, width = record.input_size
            return record.input_size[side], f"the recorded image preprocessing ({height}x{width})"
        imported = manifest.stages.import_
        reading = imported.read.get("image_size") if imported is not None else None
        if reading is not None and isinstance(reading.value, list) and len(reading.value) == 2:
            return int(reading.value[side]), f"the recorded image size: {reading.source}"
    if spec.name in samples and samples[spec.name].ndim == len(spec.shape):
        shape = list(samples[spec.name].shape)
        imported = manifest.stages.import_
        if imported is not None and imported.judged_on_generated:
            return int(shape[axis]), f"{GUESSED}: golden.npz's generated inputs (in.{spec.name} is {shape})"
        return int(shape[axis]), f"golden.npz's inputs (in.{spec.name} is {shape})"
    if spec.tokens is not None and spec.tokens.max_length:
        return spec.tokens.max_length, f"the recorded max_length of {spec.name!r}"
    raise InputError(
        f"input {spec.name!r} {spec.shape}: no size is known for axis {axis} ({spec.shape[axis]!r}), and devices "
        f"run fixed shapes; give it with --input-shape {spec.name}:d0,d1,..."
    )


def fitted_evaluation(evaluation: EvaluationSet, inputs: list[TensorSpec]) -> tuple[EvaluationSet, bool]:
    """`evaluation` with image inputs resampled to the fixed sizes of `inputs`; True when anything was resampled.

    Any other input whose samples differ from a fixed size is refused (InputError) naming the size they have.
    """
    samples, data = dict(evaluation.samples), dict(evaluation.data) if evaluation.data is not None else None
    changed = False
    for spec in inputs:
        if spec.name not in samples:
            continue
        have = samples[spec.name].shape
        wrong = [a for a, d in enumerate(spec.shape) if a and isinstance(d, int) and have[a] != d]
        if not wrong:
            continue
        if not set(wrong) <= set(spatial_axes(spec)):
            raise InputError(
                f"--input-shape {spec.name}: the edge model would take {spec.shape}, but the artifact's "
                f"evaluation inputs are {list(have)}; give the dims they have (or ? to keep them)"
            )
        samples[spec.name] = _resampled(samples[spec.name], spec)
        if data is not None and spec.name in data:
            data[spec.name] = _resampled(data[spec.name], spec)
        changed = True
    if not changed:
        return evaluation, False
    return replace(evaluation, samples=samples, data=data, recorded=None), True


def _resampled(x: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Nearest-pixel resampling of an image batch's height and width to `spec`'s fixed sizes."""
    for axis in spatial_axes(spec):
        size = int(spec.shape[axis])
        x = np.take(x, np.arange(size) * x.shape[axis] // size, axis=axis)
    return np.ascontiguousarray(x)
