"""The model `pipe train --backend ort` starts from, and which of its parameters it trains.

- a zoo model (`model.arch` mlp, cnn, ...): built with the recipe's seed, as the torch backend
  builds it, and exported to ONNX by torch's dynamo exporter at the recipe's `export.opset`, with
  the batch axis dynamic, as `pipe export` does; its trainable parameters are the module's
  parameters (not its buffers: the normalization statistics stay fixed);
- an existing artifact (`model.arch: onnx`, `pipe train --from ARTIFACT`): its model.onnx as it
  is, whatever framework made it; the parameters are the float initializers that match
  `train.trainable` (glob patterns), all of them when it is empty. The data's classes become the
  parent's: each is the parent's label of the same name, else (an integer) its class of that index,
  so a model fine-tuned on digits 3 and 7 still answers "3" and "7" (`in_parent_classes`).

Either way the model is written with IR version <= 10, the newest onnxruntime-training 1.19 loads.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import MODEL_FILE
from pipeline.core.errors import InputError
from pipeline.data import Split, Splits
from pipeline.recipe.schema import Recipe
from pipeline.runtime.external_data import external_files
from pipeline.train.ort_worker import MAX_IR_VERSION  # what the worker's onnxruntime-training loads

FLOAT_TYPES = (1, 10, 11, 16)  # onnx TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16: what a gradient can update


@dataclass
class Start:
    """The starting model written to `path`, the parameters to train, its input and output, and the data
    it trains on, its targets numbered as the model's classes."""

    path: Path
    trainable: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    labels: list[str]
    splits: Splits
    parent: Artifact | None = None  # model.arch onnx: the artifact it continues


def candidate_parameters(model_path: Path) -> list[str]:
    """The float initializers of an ONNX model, in graph order: the names `train.trainable` chooses from."""
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    return [i.name for i in graph.initializer if i.data_type in FLOAT_TYPES and len(i.dims) > 0]


def choose(candidates: list[str], patterns: list[str], where: str) -> list[str]:
    """The candidates matching any of the glob patterns (all with none); a pattern matching nothing is refused."""
    if not patterns:
        return list(candidates)
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in candidates):
            shown = ", ".join(candidates[:40]) + (f" ... ({len(candidates)} in all)" if len(candidates) > 40 else "")
            raise InputError(
                f"train.trainable pattern {pattern!r} matches no parameter of {where}; its parameters are: {shown} "
                "(glob patterns, e.g. 'fc.*'; `pipe info ARTIFACT --trainable` lists them)"
            )
    return [name for name in candidates if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


def start_model(recipe: Recipe, splits: Splits, path: Path) -> Start:
    """Write the starting inference model to `path` and say what to train."""
    if recipe.model.arch == "onnx":
        return _from_artifact(recipe, splits, path)
    return _from_zoo(recipe, splits, path)


def _from_zoo(recipe: Recipe, splits: Splits, path: Path) -> Start:
    import onnx
    import torch

    from pipeline.train.finish import input_spec, output_spec
    from pipeline.train.zoo import build_model

    info = splits.info
    torch.manual_seed(recipe.train.seed)  # the torch backend's initial weights
    model = build_model(recipe.model, info).eval()
    inputs, outputs = [input_spec(info, recipe.model)], [output_spec(recipe.task, info)]
    example = torch.from_numpy(splits.train.inputs[info.input_name][:2])
    path.parent.mkdir(parents=True, exist_ok=True)
    _export(model, example, inputs, outputs, path, recipe.export.opset)
    graph = onnx.load(path)
    graph.ir_version = min(graph.ir_version, MAX_IR_VERSION)
    onnx.save(graph, path)
    parameters = {name for name, _ in model.named_parameters()}
    found = [name for name in candidate_parameters(path) if name in parameters]
    missing = sorted(parameters - set(found))
    if missing:  # the exporter renamed or folded them: nothing would train them
        raise InputError(
            f"the ONNX export of model arch {recipe.model.arch!r} holds no initializer for parameters {missing[:5]}; "
            "train it with train.backend: torch"
        )
    trainable = choose(found, recipe.train.trainable, f"model arch {recipe.model.arch!r}")
    return Start(path, trainable, inputs, outputs, info.labels, splits)


def _export(
    model: Any, example: Any, inputs: list[TensorSpec], outputs: list[TensorSpec], path: Path, opset: int
) -> None:
    """torch's dynamo exporter with `pipe export`'s settings (pipeline/export/onnx_export.py): dynamic dims by
    name, the requested opset, weights inside the file; its notes about its own internals are not shown."""
    import logging
    import warnings

    import torch

    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)  # 'torchvision is not installed' and the like
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model, (example,), input_names=[inputs[0].name], output_names=[outputs[0].name], opset_version=opset,
                dynamo=True, dynamic_shapes=({i: d for i, d in enumerate(inputs[0].shape) if isinstance(d, str)},),
                external_data=False, optimize=True, verbose=False,
            )  # fmt: skip
            program.save(str(path), external_data=False)
    finally:
        logger.setLevel(level)


def _from_artifact(recipe: Recipe, splits: Splits, path: Path) -> Start:
    import onnx

    root = resolve_artifact(recipe.base_dir / recipe.model.artifact)
    parent = Artifact.load(root)  # verified: a tampered parent is refused
    if MODEL_FILE not in parent.manifest.files:
        raise InputError(
            f"model.artifact {root} holds no model.onnx; export it first (pipe export {root}), or pass a version "
            "that has one"
        )
    m = parent.manifest
    if m.task != "classification" or len(m.inputs) != 1 or len(m.outputs) != 1:
        raise InputError(
            f"model.artifact {root} is a {m.task} model with {len(m.inputs)} input(s) and {len(m.outputs)} "
            "output(s); the ORT backend continues training classifiers with one input and one output of logits"
        )
    _check_data_fits(m.inputs[0], splits, root)
    splits = in_parent_classes(splits, list(m.labels), m.outputs[0].shape[-1], root)
    graph = _parent_graph(parent)
    graph.ir_version = min(graph.ir_version, MAX_IR_VERSION)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(graph, path)
    trainable = choose(candidate_parameters(path), recipe.train.trainable, str(root))
    return Start(path, trainable, list(m.inputs), list(m.outputs), list(m.labels), splits, parent)


def _parent_graph(parent: Artifact) -> Any:
    """The parent's model.onnx with its weights, its external data read only from files of the parent: a
    location outside the version directory (`../../../../etc/passwd`) or a file the manifest does not list
    (so not verified) is refused by name before anything is read."""
    import onnx

    graph = onnx.load(parent.path(MODEL_FILE), load_external_data=False)
    for location in external_files(graph, parent.root):
        if location not in parent.manifest.files:
            raise InputError(
                f"{parent.root / MODEL_FILE} keeps weights in {location!r}, which its manifest does not list, so "
                "they cannot be verified; re-export or re-import the parent"
            )
    onnx.load_external_data_for_model(graph, str(parent.root))
    return graph


def _check_data_fits(spec: TensorSpec, splits: Splits, root: Path) -> None:
    """The data's samples fit the parent's input."""
    sample = splits.train.inputs[splits.info.input_name]
    fixed = [(i, d) for i, d in enumerate(spec.shape[1:]) if isinstance(d, int)]
    if len(sample.shape) - 1 != len(spec.shape) - 1 or any(sample.shape[1 + i] != d for i, d in fixed):
        raise InputError(
            f"the data's samples are {list(sample.shape[1:])}, but {root} takes {spec.name!r} shaped {spec.shape}; "
            "pass data shaped as the model's input (an NPZ's X: [n, ...])"
        )
    if spec.dtype != str(sample.dtype):
        raise InputError(f"the data is {sample.dtype}, but {root} takes {spec.dtype}; convert X to {spec.dtype}")


def in_parent_classes(splits: Splits, labels: list[str], classes: int | str, root: Path) -> Splits:
    """`splits` with each target a class index of the parent, which answers `classes` classes named `labels`.

    The data's classes were numbered 0..k-1 in the order of their values (`y` of 3 and 7 became 0 and
    1, named "3" and "7"); each is mapped back to the parent's class it names: the parent's label of
    that name, else, when the name is an integer, the parent's class of that index. A class that
    names neither is refused, with the parent's labels.
    """
    width = classes if isinstance(classes, int) else len(labels)
    mapping = []
    for name in splits.info.labels:
        if name in labels:
            mapping.append(labels.index(name))
        elif name.lstrip("-").isdigit() and len(name) < 12 and 0 <= int(name) < width:
            mapping.append(int(name))
        else:
            known = f"its labels are {labels[:20]}" + (f" ... ({len(labels)} in all)" if len(labels) > 20 else "")
            raise InputError(
                f"the data's class {name!r} is not a class of {root}: it answers {width} classes, "
                f"{known if labels else 'unnamed'}; label the data with those names or with indices 0..{width - 1}"
            )
    table = np.asarray(mapping, dtype=np.int64)

    def renumbered(split: Split) -> Split:
        return Split(split.inputs, table[split.target])

    names = list(labels) or [str(i) for i in range(width)]
    info = replace(splits.info, labels=names, num_classes=width)
    return replace(
        splits, train=renumbered(splits.train), val=renumbered(splits.val), test=renumbered(splits.test), info=info
    )
