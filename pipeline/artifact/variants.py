"""Variants: every model file of an artifact, the fp32 `model.onnx` included, and how each was made.

`model.onnx` is the fp32 variant; every other file made from it (an optimized graph, a quantized
model, a TFLite model) is a variant too, recorded in the manifest with its parent (the sha256 of
the file it was made from), the stage and settings that made it, its status (passed, or failed
and why), its metrics, parity, size and latency. `variant_file` is the one place that maps a
variant name to its file; no other module spells those paths. A failed variant is never served
or shipped by default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

FP32 = "fp32"  # the variant name of model.onnx itself
MODEL_FILE = "model.onnx"
EDGE_PREFIX = "tflite-"  # edge variants: tflite-fp32, tflite-fp16, tflite-int8
FEEDING_FILE = "edge/feeding.json"  # beside the edge models: how to feed each one (pipeline/edge/feeding.py)
LABELS_FILE = "edge/labels.txt"  # beside the edge models: the class names, one a line
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
FORMATS = ("onnx", "tflite")
PASSED, FAILED = "passed", "failed"


RESERVED = ("best",)  # `pipe serve --variant best` means the fastest servable variant, so none may be named so


def check_variant_name(name: str) -> str | None:
    """None when `name` can name a variant (it becomes part of a file name), else the problem."""
    if name in RESERVED:
        return f"variant name {name!r} is reserved (`pipe serve --variant {name}` chooses among the variants)"
    if not isinstance(name, str) or not NAME.match(name):
        return (
            f"variant name {str(name)[:40]!r} is not valid: use 1-64 lowercase letters, digits, '_' and '-', "
            "starting with a letter or digit (e.g. int8, opt, tflite-fp16)"
        )
    return None


def variant_file(name: str) -> str:
    """The file a variant lives in, relative to the artifact: fp32 -> model.onnx, int8 -> variants/model.int8.onnx."""
    if problem := check_variant_name(name):
        raise ValueError(problem)
    if name == FP32:
        return MODEL_FILE
    if name.startswith(EDGE_PREFIX):
        return f"edge/model.{name.removeprefix(EDGE_PREFIX)}.tflite"
    return f"variants/model.{name}.onnx"


def _check_file(value: str) -> str | None:
    return None if value.endswith((".onnx", ".tflite")) else f"expected a .onnx or .tflite file, got {value[:60]!r}"


def _check_size(value: int | None) -> str | None:
    return None if value is None or value >= 0 else f"expected a size in bytes >= 0, got {value}"


@dataclass(kw_only=True)
class EdgeTensor:
    """One input or output of an edge model as a device program must feed or read it."""

    name: str
    dtype: str  # numpy name: float32, int8, uint8, int64 ...
    shape: list[int]  # as the interpreter reports it; -1 or 1 in the batch position for a resizable batch
    scale: float | None = None  # quantized tensors: real = scale * (q - zero_point)
    zero_point: int | None = None
    # an input whose leading (x - mean) / std was taken out of the edge model: the caller applies it in float
    normalize: dict[str, list[float]] | None = field(default=None, metadata={"omit_none": True})
    # a detector output whose boxes (channels 0..3: cx, cy, w, h) the edge model gives divided by [width, height]
    boxes_normalized_by: list[int] | None = field(default=None, metadata={"omit_none": True})


@dataclass(kw_only=True)
class EdgeIO:
    """How to feed an edge model, and which runtimes were seen to run it."""

    layout: str  # the image inputs' layout: NHWC or NCHW; NC (features) or NT (tokens) for a model without one
    inputs: list[EdgeTensor]
    outputs: list[EdgeTensor]
    names: dict[str, str] = field(default_factory=dict)  # model.onnx's name -> the edge model's, where renamed
    runtimes: dict[str, bool] = field(
        default_factory=dict
    )  # e.g. {"ai-edge-litert 2.3.0": true, "tflite_runtime 2.14.0": false}


@dataclass(kw_only=True)
class Variant:
    """One model file of the artifact and the evidence about it."""

    file: str = field(metadata={"check": _check_file})  # relative path, e.g. "variants/model.int8.onnx"
    precision: str  # fp32 | fp16 | int8 | mixed
    format: Literal["onnx", "tflite"]
    stage: str  # the stage that made it: export, import, optimize, edge
    parent: str | None = None  # sha256 of the file it was made from (the checkpoint weights for model.onnx)
    settings: dict[str, Any] = field(default_factory=dict)  # the settings the stage made it with
    status: Literal["passed", "failed"] = PASSED
    reason: str = ""  # why it failed (empty when it passed)
    metrics: dict[str, float] = field(default_factory=dict)  # task metrics on the evaluation set
    parity: dict[str, Any] = field(default_factory=dict)  # the verifier's report against its parent
    latency: dict[str, float] = field(default_factory=dict)  # e.g. {"p50_ms_b1": ..., "throughput_b32": ...}
    size: int | None = field(default=None, metadata={"check": _check_size})  # bytes
    edge: EdgeIO | None = field(default=None, metadata={"omit_none": True})  # edge models: how to feed them
    # what a reader must know beyond passed/failed, e.g. an int8 model smaller but not faster on this CPU, and why
    note: str | None = field(default=None, metadata={"omit_none": True})

    @property
    def passed(self) -> bool:
        return self.status == PASSED


# the command that remakes the variants of a stage
RERUN = {"optimize": "pipe optimize", "edge": "pipe export --target edge"}
ROOT_STAGES = ("export", "import")  # stages that make model.onnx itself, from outside the artifact's files


def unusable(variant: Variant, listed_digests: set[str]) -> str | None:
    """Why `variant` must not be served or shipped by default, or None when it may.

    A failed variant, and a stale one: made from a file the artifact no longer holds (its parent
    digest is no listed file's, e.g. an int8 made before model.onnx was exported again), so its
    gate judged it against another model.
    """
    if not variant.passed:
        return f"failed {variant.stage}: {variant.reason or 'no reason recorded'}"
    if variant.stage not in ROOT_STAGES and variant.parent not in listed_digests:
        return (
            f"is stale: {variant.stage} made it from a file this artifact no longer holds (parent sha256 "
            f"{str(variant.parent)[:12]}); re-run {RERUN.get(variant.stage, variant.stage)}"
        )
    return None
