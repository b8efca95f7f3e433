"""A picture file -> one sample for a model with one image input, converted as the model was trained.

The conversion itself (channels, size and resize filter, scale, mean/std, layout, all as the
manifest records them) is `pipeline/runtime/images.py`, the same one `pipe serve` applies to encoded
images; this module only picks the model's image input and reads the file, keeping where the picture
landed in the sample (`Placement`), so a detector's boxes map back to the picture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError
from pipeline.runtime.images import Placement
from pipeline.runtime.images import image_input as image_conversion

LAYOUTS = ("NCHW", "NHWC")


def image_input(path: Path, manifest: Manifest) -> tuple[TensorSpec, np.ndarray, Placement]:
    """The image input's spec, the picture at `path` as one sample ([C, H, W] or [H, W, C]), and where
    the picture lies in it."""
    spec = _image_spec(manifest, path.name)
    try:
        conversion = image_conversion(manifest, spec)
    except InputError as exc:
        raise InputError(f"{path.name}: {exc}") from None
    sample, placement = conversion.convert(path, path.name)
    return spec, sample, placement


def _image_spec(manifest: Manifest, source: str) -> TensorSpec:
    specs = manifest.inputs
    if len(specs) != 1 or specs[0].layout not in LAYOUTS or len(specs[0].shape) != 4:
        found = ", ".join(f"{s.name}: {s.dtype}{s.shape} {s.layout}" for s in specs)
        raise InputError(
            f"{source}: an image feeds a model with one image input ([batch, C, H, W] NCHW or [batch, H, W, C] "
            f"NHWC); this model takes {found}: pass the inputs as .npz or .json"
        )
    return specs[0]
