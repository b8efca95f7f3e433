"""What one `pipe export --target edge` makes, and at which shapes: decided before onnx2tf runs.

`plan_edge` reads the opened artifact and its `edge:` settings once: the precisions to make (int8
left out, with a note, for an artifact imported without real samples to calibrate on; refused when
asked for by name), int8's calibration samples, the device shapes (every free dim but the batch
fixed, pipeline/edge/shapes.py) with the evaluation set fitted to them, and the settings onnx2tf
converts with (int8's I/O, and what the conversion takes out of int8's one scale per tensor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline.artifact.manifest import ModelSpec
from pipeline.artifact.records import FixedDim
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError
from pipeline.edge.convert import EdgeSettings
from pipeline.edge.shapes import device_specs, fitted_evaluation, guessed_advice, is_picture
from pipeline.recipe.schema import EdgeSpec
from pipeline.samples.calibration import calibration_set, has_real_samples
from pipeline.samples.evaluation import EvaluationSet
from pipeline.stagekit.contract import Overrides, Progress
from pipeline.stagekit.opening import Opened


@dataclass
class EdgePlan:
    """The edge models one run makes, what int8 calibrates on, and the device shapes they take."""

    precisions: list[str]  # fp32, fp16, int8: those asked for, int8 left out without real samples
    calibration: dict[str, np.ndarray] | None  # int8's real training samples; None without int8
    spec: ModelSpec  # model.onnx's inputs and outputs at the device shapes: what the gate checks
    fixed: list[FixedDim]  # the free dims fixed for devices, and where each size came from
    evaluation: EvaluationSet  # the evaluation set at the device shapes
    resampled: bool  # the evaluation's pictures were resampled to the device shapes (golden.npz does not fit)
    convert: EdgeSettings  # what onnx2tf makes, and how

    @property
    def fixed_rows(self) -> list[dict[str, Any]]:
        """The fixed dims as the convert reports write them."""
        return [asdict(f) for f in self.fixed]


def plan_edge(opened: Opened[EdgeSpec], overrides: Overrides | None, progress: Progress) -> EdgePlan:
    """The plan for `opened` with `overrides` (see the module doc); notes go to `opened.notes`."""
    artifact, settings, notes = opened.artifact, opened.settings, opened.notes
    precisions = _precisions(opened, overrides)
    calibration = None
    if "int8" in precisions:
        calibration = calibration_set(artifact, opened.recipe, settings.calibration_samples).inputs
    # Devices run fixed shapes: every free dim but the batch is fixed at a size the artifact knows (shapes.py)
    inputs, outputs, fixed = device_specs(artifact.manifest, opened.evaluation.samples, settings.input_shapes)
    evaluation, resampled = fitted_evaluation(opened.evaluation, inputs)
    for f in fixed:
        progress(f"[edge] {f.input} axis {f.axis} ({f.dim}) fixed at {f.size}" + (f", {f.source}" if f.guessed else
                                                                                  f": from {f.source}"))  # fmt: skip
    if advice := guessed_advice(fixed, inputs):
        notes.append(advice)
    int8_io = "integer" if all(is_picture(s) for s in inputs) else "float"  # q = pixel - 128 style only for pictures
    if "int8" in precisions and int8_io == "float" and all(np.dtype(s.dtype).kind == "f" for s in inputs):
        notes.append("int8 has float inputs and outputs (weights and activations int8 inside): the inputs are not "
                     "pictures, and one int8 scale per input would crush columns of different ranges")  # fmt: skip
        progress(f"[edge] note: {notes[-1]}")
    convert = EdgeSettings(tuple(precisions), settings.layout, timeout_s=settings.timeout_s,
                           input_dims={s.name: s.shape for s in inputs}, int8_io=int8_io,
                           **_scaling(artifact.manifest.task, inputs, outputs))  # fmt: skip
    spec = ModelSpec(inputs, outputs, artifact.manifest.task)
    return EdgePlan(precisions, calibration, spec, fixed, evaluation, resampled, convert)


def _precisions(opened: Opened[EdgeSpec], overrides: Overrides | None) -> list[str]:
    """The precisions to make, in the settings' order; int8 needs real samples to calibrate on."""
    precisions = list(dict.fromkeys(opened.settings.precisions))
    if "int8" not in precisions or has_real_samples(opened.artifact):
        return precisions
    opened.notes.append("int8 skipped: the artifact was imported without --eval-data, so there are no real samples")
    precisions.remove("int8")
    if "int8" in ((overrides or {}).get("precisions") or []) or not precisions:  # asked for by name
        raise InputError(
            "int8 edge models calibrate on real samples, and this artifact was imported without --eval-data; "
            "re-import it with --eval-data FILE, or ask for --precision fp32 / fp16"
        )
    return precisions


def _scaling(task: str, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> dict[str, Any]:
    """What the conversion takes out of int8's one scale per tensor (pipeline/edge/scaling.py), every precision alike:
    a detector's boxes divided by the image size; a leading (x - mean) / std of each [batch, F] float input that is
    not a picture, applied by the caller in float."""
    tabular = tuple(s.name for s in inputs if not is_picture(s) and np.dtype(s.dtype).kind == "f" and len(s.shape) == 2)
    images = [
        s for s in inputs if s.layout == "NCHW" and len(s.shape) == 4 and all(isinstance(d, int) for d in s.shape[2:])
    ]
    boxes = {}
    if task == "detection" and len(images) == 1 and outputs:
        height, width = images[0].shape[2:]
        boxes = {outputs[0].name: (int(width), int(height))}
    return {"normalize_inputs": tabular, "boxes": boxes}
