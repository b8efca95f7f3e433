"""A folder of pictures -> samples of a model's image input: `pipe import MODEL --eval-data DIR`.

Each picture is converted with the preprocessing the manifest records (`pipeline/runtime/images.py`,
the conversion `pipe serve` and `pipe predict` use), so the evaluation and calibration samples are
what the served model will see.

- Class folders (`DIR/cat/*.jpg`, `DIR/dog/*.png`, as torchvision's ImageFolder reads them) label
  the pictures. When the model already has labels (a flag, its metadata), each folder is matched to
  the label of the same name, never by sorted order, and a folder that matches none is refused by
  name; otherwise the labels are the folders' names, sorted (ImageFolder's classes).
- A flat folder (pictures, no sub-folders) gives unlabelled samples.
- Bounded: at most `limit` pictures (chosen with seed 0 when there are more, so a re-import picks
  the same ones), and their samples at most MAX_BYTES together; each picture at most the 50 Mpx
  the conversion allows. A file that is not a readable picture is refused by name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError
from pipeline.runtime.images import ImageInput

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
DEFAULT_LIMIT = 500  # pictures read at most (--eval-limit)
MAX_BYTES = 512 * 2**20  # the samples of all pictures together: 891 RGB 224x224 float32, 109 at 640x640
SEED = 0  # which pictures are kept when there are more than the limit: the same on every run
LABELS_SHOWN = 20


@dataclass
class PictureSet:
    """The pictures of a folder as samples, with what a report needs to say where they came from."""

    inputs: np.ndarray  # [n, C, H, W] or [n, H, W, C], the input's dtype
    target: np.ndarray | None  # [n] int64 label index; None: a flat folder, unlabelled
    labels: list[str]  # the model's labels, or the class folders' names sorted when it had none
    classes: dict[str, int]  # class folder -> label index; empty for a flat folder
    found: int  # pictures in the folder
    limit: int  # the most that were read: the caller's limit, lowered to fit MAX_BYTES
    digest: str  # sha256 over the pictures read (relative path and bytes, in order)

    def __len__(self) -> int:
        return len(self.inputs)


def read_picture_folder(
    folder: Path, image: ImageInput, labels: list[str], limit: int = DEFAULT_LIMIT, labelled: bool = True
) -> PictureSet:
    """The pictures under `folder` converted by `image`; see the module doc for labels and bounds.

    `labels`: the model's class names ([] when it has none). `labelled`: whether class folders may
    label the pictures (a classifier); when not, sub-folders are refused.
    """
    if limit < 1:
        raise InputError(f"--eval-limit {limit}: read at least 1 picture")
    folders = sorted(p.name for p in folder.iterdir() if p.is_dir() and not _hidden(p))
    loose = _pictures(folder, recursive=False)
    if folders and loose:
        raise InputError(
            f"{folder} holds both pictures ({loose[0].name}, ...) and class folders ({', '.join(folders[:5])}); "
            "put every picture in the folder of its class, or give a flat folder of pictures alone"
        )
    if folders and not labelled:
        raise InputError(
            f"{folder} holds class folders ({', '.join(folders[:5])}), which label a classifier's pictures; this "
            "model is not a classifier: give a flat folder of pictures (unlabelled samples)"
        )
    classes = _classes(folder, folders, labels)
    files = [(p, index) for name, index in classes.items() for p in _pictures(folder / name, recursive=True)]
    files = files or [(p, -1) for p in loose]
    if not files:
        raise InputError(f"{folder} holds no pictures ({', '.join(SUFFIXES)}); give a folder of pictures")
    if empty := [name for name in classes if not _pictures(folder / name, recursive=True)]:
        raise InputError(f"class folder {folder / empty[0]} holds no pictures ({', '.join(SUFFIXES)}); remove it")
    per_sample = int(np.prod(image.sample_shape)) * np.dtype(image.dtype).itemsize
    limit = max(1, min(limit, MAX_BYTES // per_sample))
    chosen = files
    if len(files) > limit:
        keep = np.sort(np.random.default_rng(SEED).permutation(len(files))[:limit])
        chosen = [files[i] for i in keep]
    digest = hashlib.sha256()
    samples = np.empty((len(chosen), *image.sample_shape), image.dtype)
    for row, (path, _) in enumerate(chosen):
        data = path.read_bytes()
        relative = path.relative_to(folder).as_posix()
        digest.update(f"{relative}\0{len(data)}\0".encode())
        digest.update(data)
        samples[row], _ = image.convert(data, str(path))
    target = np.array([index for _, index in chosen], np.int64) if classes else None
    names = labels or sorted(classes)
    return PictureSet(samples, target, names, classes, len(files), limit, digest.hexdigest())


def _classes(folder: Path, folders: list[str], labels: list[str]) -> dict[str, int]:
    """Class folder -> label index: by the model's labels' names when it has labels, else sorted (ImageFolder)."""
    if not labels:
        return {name: index for index, name in enumerate(folders)}
    if unknown := [name for name in folders if name not in labels]:
        shown = ", ".join(labels[:LABELS_SHOWN]) + (f" and {len(labels) - LABELS_SHOWN} more" if
                                                     len(labels) > LABELS_SHOWN else "")  # fmt: skip
        raise InputError(
            f"class folder {folder / unknown[0]} matches no label of the model (folders are matched to labels by "
            f"name, never by order); valid labels: {shown}; rename the folder to the label its pictures show"
        )
    return {name: labels.index(name) for name in folders}


def _pictures(folder: Path, recursive: bool) -> list[Path]:
    """Picture files under `folder` by suffix, sorted; dot files and folders (editor leftovers) skipped."""
    found = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(
        p for p in found
        if p.suffix.lower() in SUFFIXES and p.is_file() and not any(_hidden(q) for q in p.relative_to(folder).parts)
    )  # fmt: skip


def _hidden(path: Path | str) -> bool:
    return Path(path).name.startswith(".")
