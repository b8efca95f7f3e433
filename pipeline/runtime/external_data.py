"""Where an ONNX file's external data lives, refusing any location outside the model's directory; and how a
model with external data is written, moved and copied without loading its weights.

An ONNX tensor may keep its bytes in another file, named by a `location` the file itself states:
`../../../../etc/passwd` is a location too. Every reader of a model file it did not write checks it
here before onnx or onnxruntime opens anything: `pipe import` (the source model), `pipe export
--target triton` (what it copies) and `pipe train --from` (the parent's model.onnx).

A model past protobuf's 2 GiB cannot be one file: its weights go to `<file>.data` beside the graph
(`model.onnx.data`, `variants/model.int8.onnx.data`). A stage that derives files from such a model works
from paths (onnxruntime, the checker and shape inference are given the path) and from the graph loaded
without its weights (`graph_only`); the weights move with `move_model`, are copied file to file into a scratch
copy (`save_beside`, `copy_model`), and are written by `save_model`, which decides inline or external once
(`external`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import onnx

from pipeline.core.errors import InputError

# protobuf cannot serialize a message past 2 GiB: a model near it keeps its weights beside the graph
INLINE_LIMIT = 1800 * 2**20
DATA_SUFFIX = ".data"  # model.onnx -> model.onnx.data
SMALL_TENSOR = 1024  # bytes: smaller tensors (shapes, scales) stay in the graph, as onnx and onnxruntime write them


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


def graph_only(path: Path) -> onnx.ModelProto:
    """The model at `path` without reading its external data: the graph, its inline tensors, and references
    (relative to `path`'s directory) for the rest. Cheap for a multi-GB model; save it only beside its data."""
    return onnx.load(str(path), load_external_data=False)


def uses_external_data(model: onnx.ModelProto | Path) -> bool:
    """Whether the model (or the file at a path) keeps any tensor in external data."""
    proto = graph_only(model) if isinstance(model, Path) else model
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _all_tensors(proto.graph))


def external(source: Path, model: onnx.ModelProto | None = None) -> bool:
    """Whether a model made from the file `source` is written with external data: when `source` is (so a
    small model saved that way takes the same path as a multi-GB one), or when `model` (weights loaded) is
    too large for one protobuf."""
    return uses_external_data(source) or (model is not None and model.ByteSize() > INLINE_LIMIT)


def data_file(path: Path) -> Path:
    """Where the model at `path` keeps its external data when pipe writes it: `<file>.data` beside it."""
    return path.with_name(path.name + DATA_SUFFIX)


def model_files(path: Path) -> list[Path]:
    """The model file and the external data files it names, data first (the order a stage moves them in)."""
    return [path.parent / rel for rel in external_files(graph_only(path), path.parent)] + [path]


def model_bytes(path: Path) -> int:
    """The size of the model at `path` with its external data."""
    return sum(f.stat().st_size for f in model_files(path))


def save_model(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Write `model` (weights loaded) to `path`; with `external`, its tensors of 1 KiB and more to
    `<file>.data`. An old data file is removed first: onnx appends to one that exists."""
    data = data_file(path)
    data.unlink(missing_ok=True)
    if not external:
        onnx.save(model, str(path))
        return
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
              size_threshold=SMALL_TENSOR)  # fmt: skip


def move_model(src: Path, dst: Path) -> None:
    """Move the model at `src` and its external data to `dst` (the data as `<dst>.data`), weights unread."""
    locations = external_files(graph_only(src), src.parent)
    if not locations:
        shutil.move(src, dst)
        return
    _relocate(src, dst, {rel: src.parent / rel for rel in locations}, shutil.move)
    src.unlink()


def copy_model(src: Path, dst: Path) -> None:
    """Copy the model at `src` to `dst`, its external data as `<dst>.data` (a file copy: disk, not memory)."""
    locations = external_files(graph_only(src), src.parent)
    if not locations:
        shutil.copyfile(src, dst)
        return
    _relocate(src, dst, {rel: src.parent / rel for rel in locations}, shutil.copyfile)


def save_beside(model: onnx.ModelProto, data_dir: Path, dst: Path) -> None:
    """Write the graph-only `model` (whose external data lies in `data_dir`) to `dst` with a copy of its data
    beside it as `<dst>.data`: a scratch copy of a multi-GB model made without reading its weights into memory.
    A copy, not a link: onnx refuses a data file with several hard links (or a symlink) as a possible attack."""
    locations = external_files(model, data_dir)
    if not locations:
        onnx.save(model, str(dst))
        return
    _relocate(model, dst, {rel: data_dir / rel for rel in locations}, shutil.copyfile)


def _relocate(
    model: onnx.ModelProto | Path, dst: Path, files: dict[str, Path], place: Callable[[Path, Path], object]
) -> None:
    """The graph written to `dst` with each data file placed (`place`: moved or copied) as `<dst>.data` (then
    `<dst>.1.data`, ...) and every tensor's location rewritten to match; offsets are unchanged."""
    proto = graph_only(model) if isinstance(model, Path) else model
    names = {}
    for index, rel in enumerate(sorted(files)):
        target = data_file(dst) if index == 0 else dst.with_name(f"{dst.name}.{index}{DATA_SUFFIX}")
        target.unlink(missing_ok=True)
        place(files[rel], target)
        names[rel] = target.name
    for tensor in _all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = names[entry.value]
    onnx.save(proto, str(dst))
