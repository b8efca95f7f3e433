"""A picture -> one sample for a model with one image input, converted as the model was trained.

The input spec says the layout (NCHW or NHWC), the channel count (1: grey, 3: RGB) and, where the
dims are sizes, the height and width (the picture is resized to them, bilinear, as
`pipeline/data/sources.py` resizes an image folder). What pixel values the model takes is the
manifest's to say, in this order:

1. `preprocessing.pixel_range: [low, high]` on the input spec: 0..255 maps onto low..high;
2. the train record's data source: `digits` takes raw 0..16 values (sklearn's 8x8 digits; 16 is
   ink), `images` takes 0..1 (the image-folder reader divides by 255);
3. neither: refused, naming `preprocessing.pixel_range` (feed an .npz in the model's units instead).

A uint8 input takes the pixels as they are. `mean`/`std` in the preprocessing are applied here per
channel unless it says `applied_in_model: true` (every model `pipe train` makes normalizes inside).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import InputError
from pipeline.manifest import Manifest, TensorSpec

LAYOUTS = ("NCHW", "NHWC")
MODES = {1: "L", 3: "RGB"}  # channels -> Pillow mode
SOURCE_RANGES = {"digits": (0.0, 16.0), "images": (0.0, 1.0)}  # train data source -> pixel values trained on


def image_input(path: Path, manifest: Manifest) -> tuple[TensorSpec, np.ndarray]:
    """The image input's spec and the picture at `path` as one sample ([C, H, W] or [H, W, C])."""
    from PIL import Image, UnidentifiedImageError

    spec = _image_spec(manifest, path.name)
    channel_axis = 1 if spec.layout == "NCHW" else 3
    channels = spec.shape[channel_axis]
    height, width = (spec.shape[2], spec.shape[3]) if spec.layout == "NCHW" else (spec.shape[1], spec.shape[2])
    if channels not in MODES:
        raise InputError(
            f"{path.name}: input {spec.name!r} takes {channels} channels ({spec.layout} {spec.shape}); an image gives "
            "1 (grey) or 3 (RGB): pass the input as .npz or .json"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # a bomb is refused, not decoded
            with Image.open(path) as img:
                picture = img.convert(MODES[channels])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InputError(  # Pillow's message names the size: "Image size (N pixels) exceeds limit of M pixels"
            f"{path.name} is too large to decode safely ({str(exc).split(', could')[0]}); "
            f"give a smaller picture (the model takes {spec.shape})"
        ) from None
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"{path.name} is not a readable image ({exc}); give a PNG or JPEG file") from None
    if isinstance(height, int) and isinstance(width, int) and picture.size != (width, height):
        picture = picture.resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(picture, dtype=np.float32)
    pixels = pixels[..., np.newaxis] if pixels.ndim == 2 else pixels  # [H, W, C]
    if spec.dtype == "uint8":
        values = pixels.astype(np.uint8)
    else:
        low, high = pixel_range(manifest, spec, path.name)
        values = _normalized(low + pixels / 255.0 * (high - low), spec, path.name).astype(spec.dtype)
    return spec, values.transpose(2, 0, 1) if spec.layout == "NCHW" else values


def _image_spec(manifest: Manifest, source: str) -> TensorSpec:
    specs = manifest.inputs
    if len(specs) != 1 or specs[0].layout not in LAYOUTS or len(specs[0].shape) != 4:
        found = ", ".join(f"{s.name}: {s.dtype}{s.shape} {s.layout}" for s in specs)
        raise InputError(
            f"{source}: an image feeds a model with one image input ([batch, C, H, W] NCHW or [batch, H, W, C] "
            f"NHWC); this model takes {found}: pass the inputs as .npz or .json"
        )
    spec = specs[0]
    if spec.dtype not in ("float32", "float16", "float64", "uint8"):
        raise InputError(f"{source}: input {spec.name!r} is {spec.dtype}, not pixels; pass it as .npz or .json")
    return spec


def pixel_range(manifest: Manifest, spec: TensorSpec, source: str) -> tuple[float, float]:
    """The values the model takes for black..white (see the module doc), or an error naming what is missing."""
    given = spec.preprocessing.get("pixel_range")
    if given is not None:
        ok = isinstance(given, list) and len(given) == 2 and all(_number(v) for v in given) and given[0] < given[1]
        if not ok:
            raise InputError(
                f"input {spec.name!r}: preprocessing.pixel_range is {given!r}; it must be [low, high] with low < "
                "high, e.g. [0, 1] or [0, 255]: fix the manifest"
            )
        return float(given[0]), float(given[1])
    train = manifest.stages.train
    data_source = (train.settings.get("data") or {}).get("source") if train else None
    if data_source in SOURCE_RANGES:
        return SOURCE_RANGES[data_source]
    trained = f"trained on data source {data_source!r}" if data_source else "not trained by pipe"
    raise InputError(
        f"{source}: the manifest does not say what pixel values input {spec.name!r} takes (it lacks "
        f"inputs[0].preprocessing.pixel_range, e.g. [0, 1] or [0, 255], and the model was {trained}); "
        "record pixel_range in the manifest, or pass the input as .npz in the model's own units"
    )


def _normalized(pixels: np.ndarray, spec: TensorSpec, source: str) -> np.ndarray:
    """(pixels - mean) / std per channel when the preprocessing asks for it outside the model."""
    pre = spec.preprocessing
    if "mean" not in pre or pre.get("applied_in_model") is True:
        return pixels
    channels = pixels.shape[-1]
    try:
        mean, std = np.asarray(pre["mean"], dtype=np.float64), np.asarray(pre.get("std", 1.0), dtype=np.float64)
    except (TypeError, ValueError):
        mean = std = np.zeros(0)  # not numbers: refused below
    if mean.size not in (1, channels) or std.size not in (1, channels) or not (std > 0).all():
        raise InputError(
            f"{source}: input {spec.name!r}'s preprocessing mean {pre.get('mean')} / std {pre.get('std')} does not "
            f"fit {channels} channel(s) (one value per channel, std > 0); pass the input as .npz instead"
        )
    return (pixels - mean.reshape(-1)) / std.reshape(-1)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
