"""Where an ONNX file's external data lives, refusing any location outside the model's directory.

An ONNX tensor may keep its bytes in another file, named by a `location` the file itself states:
`../../../../etc/passwd` is a location too. Every reader of a model file it did not write checks it
here before onnx or onnxruntime opens anything: `pipe import` (the source model), `pipe export
--target triton` (what it copies) and `pipe train --from` (the parent's model.onnx).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import onnx

from pipeline.core.errors import InputError


def external_files(model: onnx.ModelProto, model_dir: Path) -> list[str]:
    """Relative locations of the external data files, refusing any outside the model's directory."""
    locations = set()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entry = {e.key: e.value for e in tensor.external_data}
            locations.add(entry.get("location", ""))
    real_dir = model_dir.resolve()
    for location in sorted(locations):
        rel = PurePosixPath(location)
        full = (model_dir / location).resolve()
        if not location or rel.is_absolute() or ".." in rel.parts or real_dir not in full.parents:
            raise InputError(
                f"external data location {location!r} escapes the model's directory {model_dir}; "
                "refusing to read it. Keep the weights file beside the model and re-save it with a relative location"
            )
        if not full.is_file():
            raise InputError(f"external data file {location!r} is missing from {model_dir}; copy it beside the model")
    return sorted(locations)


def _all_tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    tensors = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                tensors.append(attr.t)
            if attr.type == onnx.AttributeProto.GRAPH:
                tensors += _all_tensors(attr.g)
            for sub in attr.graphs:
                tensors += _all_tensors(sub)
    return tensors
