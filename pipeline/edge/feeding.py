"""What a device program needs beside the .tflite files: `edge/feeding.json`, `edge/labels.txt`, and the
same description inside each .tflite as TFLite metadata.

`feeding.json` says, for each edge model by file name, how to feed it: the layout of its image
inputs, the tensors the converter renamed, and per input and output its name (model.onnx's), the
tensor's own name, dtype, shape (-1: resizable), scale and zero point (quantized tensors: real =
scale * (q - zero_point)) and, for an input, its preprocessing as recorded (an image's mode,
geometry, letterbox, resize filter, scale, mean/std; pipe's own models normalize inside the graph,
so the raw units are what the record says). The stand-alone runner (pipeline/runtime/tflite_runner.py)
reads it when it lies beside the model, so a device program needs no --layout or --name.

`labels.txt` holds the class names, one a line, index order, for a model with labels
(classifiers, detectors).

TFLite metadata: the flatbuffer's `Model.metadata` is a list of named buffers. Each .tflite gets
one more, `pipe_feeding`, holding the model's own feeding entry with the labels and the
preprocessing, as JSON; it is written through the TFLite schema's object API that ai-edge-litert
ships (`ai_edge_litert.schema_py_generated`, with `flatbuffers`), before the model is judged, so
the file shipped is the file verified. The standard `TFLITE_METADATA` entry that Android's Task
Library and Model Maker read (NormalizationOptions, TENSOR_AXIS_LABELS associated files) is not
written: its schema and populator live only in tflite-support, whose last release (0.4.4, 2023)
pins protobuf<4, which tensorflow 2.21 and onnx 1.23 in the same environment cannot share
(docs/edge.md, "TFLite metadata").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import FEEDING_FILE, LABELS_FILE
from pipeline.core.errors import InputError
from pipeline.edge.convert import Converted

METADATA_NAME = "pipe_feeding"  # the Model.metadata entry in each .tflite
FORMAT = "pipe-edge-feeding/1"
QUANTIZATION = "real = scale * (q - zero_point); q = clip(round(real / scale) + zero_point) to the dtype's range"


def feeding_entry(variant: str, c: Converted, manifest: Manifest) -> dict[str, Any]:
    """How to feed the converted model `c` (variant name `variant`): one entry of feeding.json."""
    specs = {s.name: s for s in manifest.inputs}

    def tensor(t: dict[str, Any], spec: TensorSpec | None) -> dict[str, Any]:
        entry = {"name": t["name"], "tensor": c.names.get(t["name"], t["name"]), "dtype": t["dtype"],
                 "shape": t["shape"], "scale": t["scale"], "zero_point": t["zero_point"]}  # fmt: skip
        for key in ("normalize", "boxes_normalized_by"):  # pipeline/edge/scaling.py: the caller's part, in float
            if t.get(key):
                entry[key] = t[key]
        if spec is not None:
            image = len(spec.shape) == 4 and spec.layout in ("NCHW", "NHWC")
            entry["layout"] = c.input_layout if image else spec.layout
            entry["preprocessing"] = _preprocessing(manifest, spec)
            if t.get("normalize"):  # taken out of the edge model (scaling.py): the device program applies it
                entry["preprocessing"] = {**entry["preprocessing"], **t["normalize"], "applied_in_model": False}
        return entry

    return {
        "variant": variant,
        "precision": c.precision,
        "layout": c.input_layout,
        "names": dict(c.names),
        "inputs": [tensor(t, specs.get(t["name"])) for t in c.inputs],
        "outputs": [tensor(t, None) for t in c.outputs],
    }


def feeding_document(manifest: Manifest, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """feeding.json: the artifact's identity, its labels file, and one entry per .tflite file name."""
    return {
        "format": FORMAT,
        "model": manifest.name,
        "version": manifest.version,
        "task": manifest.task,
        "labels": Path(LABELS_FILE).name if manifest.labels else None,
        "quantization": QUANTIZATION,
        "models": models,
    }


def write_feeding(directory: Path, manifest: Manifest, models: dict[str, dict[str, Any]]) -> list[str]:
    """Write feeding.json (and labels.txt when the model has labels) into `directory` (the scratch edge/);
    returns their paths relative to the artifact, for StageWrite to move into place and hash."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / Path(FEEDING_FILE).name).write_text(json.dumps(feeding_document(manifest, models), indent=1) + "\n")
    written = [FEEDING_FILE]
    if manifest.labels:
        (directory / Path(LABELS_FILE).name).write_text("".join(f"{label}\n" for label in manifest.labels))
        written.append(LABELS_FILE)
    return written


def stamp_metadata(path: Path, entry: dict[str, Any], manifest: Manifest) -> bool:
    """Add (or replace) the `pipe_feeding` metadata entry of the .tflite at `path`: `entry` with the labels.

    False, and the file untouched, for a model that keeps its weights outside the flatbuffer (past 2 GB).
    """
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    document = {key: value for key, value in feeding_document(manifest, {}).items() if key != "models"}
    payload = json.dumps({**document, "labels": list(manifest.labels), "feeding": entry}, separators=(",", ":"))
    model = schema.ModelT.InitFromPackedBuf(bytearray(path.read_bytes()), 0)
    if any(b.offset for b in model.buffers or []):  # re-packing would drop the weights stored after the flatbuffer
        return False
    model.metadata = model.metadata or []
    ours = next((m for m in model.metadata if m.name in (METADATA_NAME, METADATA_NAME.encode())), None)
    if ours is None:  # a new buffer and an entry naming it; a second stamp rewrites that buffer in place
        model.buffers = [*(model.buffers or []), schema.BufferT()]
        ours = schema.MetadataT()
        ours.name, ours.buffer = METADATA_NAME, len(model.buffers) - 1
        model.metadata.append(ours)
    model.buffers[ours.buffer].data = np.frombuffer(payload.encode(), np.uint8)  # packed as one vector
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))
    return True


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The `pipe_feeding` metadata of the .tflite at `path`, or None."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(bytearray(path.read_bytes()), 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() in (METADATA_NAME.encode(), METADATA_NAME):
            return json.loads(model.Buffers(entry.Buffer()).DataAsNumpy().tobytes())
    return None


def _preprocessing(manifest: Manifest, spec: TensorSpec) -> dict[str, Any]:
    """The input's preprocessing as a client needs it: an image's record (runtime.images) or what is recorded."""
    from pipeline.runtime.images import image_input

    if len(spec.shape) == 4 and spec.layout in ("NCHW", "NHWC"):
        try:
            described = image_input(manifest, spec).describe()
        except InputError:
            described = None
        if described is not None:
            described.pop("layout", None)  # the edge tensor's layout is the entry's own
            return {"image": described}
    return dict(spec.preprocessing)
