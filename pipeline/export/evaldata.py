"""`pipe import --eval-data`: the real inputs golden.npz, the evaluation split and the calibration samples
of an imported model come from. Either an NPZ of arrays in the model's own units and layout (one per
input name, the samples on each input's batch axis, which may be a fixed batch's: a model taking
[1, 1, 64, W] is given [N, 1, 64, W] and run one sample at a time; optional `target`), or a folder
of pictures converted with the recorded image preprocessing
(`pipeline/data/picture_folder.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.artifact.records import PictureFolder
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError
from pipeline.core.fsutil import sha256_file
from pipeline.data.picture_folder import DEFAULT_LIMIT, read_picture_folder
from pipeline.data.sources import load_npz
from pipeline.runtime.images import image_input
from pipeline.runtime.sample_axes import sample_leading


@dataclass
class EvalData:
    """What `--eval-data` gave."""

    inputs: Arrays  # one array per model input, the same number of samples each
    target: np.ndarray | None  # ground truth per sample; None: unlabelled
    digest: str  # sha256 of the NPZ, or of the pictures read (their paths and bytes)
    labels: list[str]  # the model's labels; for pictures in class folders and a model without labels, theirs
    pictures: PictureFolder | None = None  # for a folder of pictures: what was read


def read_eval_data(
    path: Path, specs: list[TensorSpec], labels: list[str], task: str, limit: int = DEFAULT_LIMIT
) -> EvalData:
    """`--eval-data PATH`: a folder of pictures or an NPZ, checked against the model's input specs."""
    path = Path(path)
    if path.is_dir():
        return _pictures(path, specs, labels, task, limit)
    inputs, target = read_npz(path, specs)
    return EvalData(inputs, target, sha256_file(path), labels)


def _pictures(folder: Path, specs: list[TensorSpec], labels: list[str], task: str, limit: int) -> EvalData:
    """A folder of pictures for a model whose one input takes pictures as recorded."""
    shown = ", ".join(f"{s.name}: {s.dtype}{s.shape} {s.layout}" for s in specs)
    if len(specs) != 1:
        raise InputError(
            f"--eval-data {folder} is a folder of pictures, which feed a model with one image input; this model "
            f"takes {shown}: give an .npz with one array per input instead"
        )
    try:
        image = image_input(None, specs[0])
    except InputError as exc:
        raise InputError(f"--eval-data {folder} is a folder of pictures, but {exc}") from None
    read = read_picture_folder(folder, image, labels, limit, labelled=task == "classification")
    record = PictureFolder(found=read.found, used=len(read), limit=read.limit, classes=read.classes)
    return EvalData({specs[0].name: read.inputs}, read.target, read.digest, read.labels, record)


def read_npz(path: Path, specs: list[TensorSpec]) -> tuple[Arrays, np.ndarray | None]:
    """Evaluation inputs from an NPZ (keys = input names, optional `target`), checked against the specs."""
    if not path.is_file():
        raise InputError(
            f"evaluation data {path} not found; pass an .npz with one array per model input, or a folder of pictures"
        )
    arrays = load_npz(path)
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise InputError(f"{path} lacks arrays for model inputs {missing}; it has {sorted(arrays)}")
    inputs = {}
    for spec in specs:
        array = arrays[spec.name]  # in the model's own layout: the samples on the input's batch axis
        fixed = [(i, d) for i, d in enumerate(spec.shape) if isinstance(d, int) and i != spec.sample_axis]
        if array.ndim != len(spec.shape) or any(array.shape[i] != d for i, d in fixed):
            raise InputError(f"{path}: {spec.name!r} has shape {list(array.shape)}, the model expects {spec.shape}")
        if not array.ndim:
            raise InputError(f"{path}: {spec.name!r} is a scalar; golden data needs a leading sample axis")
        if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
            raise InputError(f"{path}: {spec.name!r} is {array.dtype}, the model expects {spec.dtype}")
        inputs[spec.name] = sample_leading(spec, array.astype(spec.dtype))  # pipe's arrays lead with the samples
    counts = {len(a) for a in inputs.values()}
    target = arrays.get("target")
    if target is not None:
        if not target.ndim:
            raise InputError(f"{path}: 'target' is a scalar; give one target per sample (shape [samples, ...])")
        counts.add(len(target))
    if len(counts) != 1:
        raise InputError(f"{path}: arrays disagree on the number of samples: {sorted(counts)}")
    if counts == {0}:
        raise InputError(f"{path} holds no samples; the golden outputs and the gate need at least one")
    return inputs, target
