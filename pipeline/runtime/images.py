"""Encoded pictures (PNG, JPEG, ...) -> samples of a model's image input, as the manifest says the model
was trained. The one conversion `pipe predict --input photo.png` and `pipe serve` both use.

What a model needs is recorded on its input spec, `inputs[i].preprocessing.image` (`ImageRecord`):
the Pillow `mode` the picture is converted to (`L`: grey, 1 channel; `RGB`: 3), the `size` it is
resized to (`[height, width]`, stretched, no crop) with the `resize` filter, and the `scale` that maps
0..255 pixels to the units the model was trained on (1/255 for 0..1, 16/255 for sklearn's digits,
1 for raw 0..255). The layout (NCHW or NHWC) is the spec's own `layout`. After scaling, a `mean`/`std`
beside it in `preprocessing` is applied per channel, unless `applied_in_model: true` (every model
`pipe train` makes normalizes inside). A uint8 input takes the pixels as they are.

`pipe train` records the image record for the data sources that read pictures (pipeline/data); `pipe
import --image-preprocessing` lets the user record it. An artifact trained before the record existed
gets it from its train record's data source (`digits`, `images`).
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.manifest import Manifest, TensorSpec
from pipeline.core.errors import InputError

MODES = {1: "L", 3: "RGB"}  # channels -> the Pillow mode a picture is converted to
RESIZE_FILTERS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")  # Pillow's Resampling names
# Picture modes that convert faithfully to L or RGB. An alpha channel (RGBA, LA, PA, P with transparency)
# is refused: converting drops it, so a digit drawn on a transparent canvas would silently become blank.
# 16/32-bit modes (I;16, I, F) hold values past 0..255, which `scale` is not about.
ACCEPTED_MODES = ("1", "L", "P", "RGB")
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF")  # what Pillow may decode: the common formats, nothing exotic
MAX_PIXELS = 50_000_000  # width x height decoded at most (a 20000x20000 PNG of zeros is a few KB: a bomb)


def digits_record() -> dict[str, Any]:
    """The image record of sklearn's 8x8 digits (values 0..16, 16 = ink): white ink on black maps onto them."""
    return {"mode": "L", "size": [8, 8], "resize": "bilinear", "scale": 16 / 255}


@dataclass(frozen=True)
class ImageInput:
    """How an encoded picture becomes one sample of one image input of a model."""

    name: str  # the input's name
    dtype: str  # the input's numpy dtype: float32, float16, float64 or uint8
    layout: str  # NCHW or NHWC
    mode: str  # L or RGB
    size: tuple[int, int]  # height, width
    resize: str  # one of RESIZE_FILTERS
    scale: float  # pixel (0..255) * scale = the model's units
    mean: tuple[float, ...] | None  # per channel (or one for all), applied here; None: not applied here
    std: tuple[float, ...] | None

    def describe(self) -> dict[str, Any]:
        """The preprocessing as a client needs to know it (shown in model metadata)."""
        described: dict[str, Any] = {
            "layout": self.layout,
            "mode": self.mode,
            "size": list(self.size),
            "resize": self.resize,
            "scale": self.scale,
        }
        if self.mean is not None:
            described |= {"mean": list(self.mean), "std": list(self.std or ())}
        return described

    def convert(self, data: bytes | Path, source: str) -> np.ndarray:
        """One picture -> one sample ([C, H, W] for NCHW, [H, W, C] for NHWC) of the input's dtype.

        `source` names the picture in errors (a file name, `instances[2]`); every problem with it
        (not an image, too large, an unfaithful mode) is an InputError.
        """
        picture = _decode(data, source, self)
        if picture.size != (self.size[1], self.size[0]):
            from PIL import Image

            picture = picture.resize((self.size[1], self.size[0]), Image.Resampling[self.resize.upper()])
        pixels = np.asarray(picture, dtype=np.float32)
        pixels = pixels[..., np.newaxis] if pixels.ndim == 2 else pixels  # [H, W, C]
        if self.dtype == "uint8":
            values = pixels.astype(np.uint8)
        else:
            values = pixels * np.float32(self.scale)
            if self.mean is not None and self.std is not None:
                values = (values - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
            values = values.astype(self.dtype)
        return np.ascontiguousarray(values.transpose(2, 0, 1) if self.layout == "NCHW" else values)


def image_input(manifest: Manifest | None, spec: TensorSpec) -> ImageInput:
    """How pictures feed input `spec`, from its recorded preprocessing; an InputError naming what is
    missing or wrong, and how to record it, when pictures cannot feed it."""
    where = f"input {spec.name!r} ({spec.dtype}{spec.shape} {spec.layout})"
    if spec.layout not in ("NCHW", "NHWC") or len(spec.shape) != 4:
        raise InputError(
            f"{where} is not an image input ([batch, C, H, W] NCHW or [batch, H, W, C] NHWC); send it as a tensor"
        )
    if spec.dtype not in ("float32", "float16", "float64", "uint8"):
        raise InputError(f"{where} is {spec.dtype}, not pixels; send it as a tensor")
    channels, height, width = (spec.shape[1:4]) if spec.layout == "NCHW" else (spec.shape[3], *spec.shape[1:3])
    record = spec.preprocessing.get("image")
    if record is None and manifest is not None:
        record = _from_train_record(manifest, spec)
    if record is None:
        raise InputError(
            f"the manifest does not say how a picture becomes {where}: it lacks "
            f"inputs[].preprocessing.image (mode, size, resize, scale); record it with `pipe import "
            f'--image-preprocessing \'{{"mode": "RGB", "size": [224, 224], "scale": 0.00392156862745098}}\'`, '
            "or send the input as a tensor in the model's own units"
        )
    image = check_record(record, f"{spec.name}.preprocessing.image")
    mode, size = image["mode"], tuple(image["size"])
    if isinstance(channels, int) and MODES.get(channels) != mode:
        raise InputError(
            f"{spec.name}.preprocessing.image.mode is {mode!r}, but {where} takes {channels} channel(s) "
            f"(L: 1, RGB: 3); fix the manifest"
        )
    if any(isinstance(d, int) and d != s for d, s in zip((height, width), size, strict=True)):
        raise InputError(
            f"{spec.name}.preprocessing.image.size is {list(size)}, but {where} takes {height}x{width}; "
            "fix the manifest"
        )
    mean, std = _normalization(spec, len(mode))
    return ImageInput(spec.name, spec.dtype, spec.layout, mode, size, image["resize"], image["scale"], mean, std)


def check_record(record: Any, where: str) -> dict[str, Any]:
    """An image record (`preprocessing.image`) with its defaults filled in, or an InputError naming the
    field, the value and the valid choices."""
    if not isinstance(record, dict):
        raise InputError(f"{where} must be an object with mode, size, resize and scale, got {record!r:.80}")
    unknown = sorted(set(record) - {"mode", "size", "resize", "scale"})
    if unknown:
        raise InputError(f"{where}: unknown key(s) {unknown}; valid keys are mode, size, resize, scale")
    mode, size = record.get("mode"), record.get("size")
    resize, scale = record.get("resize", "bilinear"), record.get("scale", 1 / 255)
    problems = []
    if mode not in MODES.values():
        problems.append(f"mode {mode!r} is not one of {', '.join(MODES.values())}")
    sized = isinstance(size, list) and len(size) == 2 and all(type(d) is int and 0 < d <= 65_536 for d in size)
    if not sized:
        problems.append(f"size {size!r} is not [height, width] in pixels")
    if resize not in RESIZE_FILTERS:
        problems.append(f"resize {resize!r} is not one of {', '.join(RESIZE_FILTERS)}")
    if not (isinstance(scale, int | float) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0):
        problems.append(f"scale {scale!r} is not a number > 0 (1/255 maps pixels to 0..1)")
    if problems:
        raise InputError(f"{where}: {'; '.join(problems)}")
    return {"mode": mode, "size": list(size), "resize": resize, "scale": float(scale)}


def _from_train_record(manifest: Manifest, spec: TensorSpec) -> dict[str, Any] | None:
    """The image record of a model pipe trained before records were written, from its data source."""
    train = manifest.stages.train
    source = (train.settings.get("data") or {}).get("source") if train else None
    if source == "digits":
        return digits_record()
    if source == "images":
        height, width = spec.shape[2:4] if spec.layout == "NCHW" else spec.shape[1:3]
        return {"mode": "RGB", "size": [height, width], "resize": "bilinear", "scale": 1 / 255}
    return None


def _normalization(spec: TensorSpec, channels: int) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """The mean/std to apply after scaling: those recorded, unless the model applies them itself."""
    pre = spec.preprocessing
    if "mean" not in pre or pre.get("applied_in_model") is True:
        return None, None
    mean, std = pre["mean"], pre.get("std", 1.0)
    mean = [mean] if isinstance(mean, int | float) else mean
    std = [std] if isinstance(std, int | float) else std
    ok = all(
        isinstance(v, list) and len(v) in (1, channels) and all(_number(x) for x in v) for v in (mean, std)
    ) and all(x > 0 for x in std)
    if not ok:
        raise InputError(
            f"input {spec.name!r}'s preprocessing mean {pre.get('mean')} / std {pre.get('std')} does not fit "
            f"{channels} channel(s) (one number per channel, or one for all; std > 0); fix the manifest"
        )
    return tuple(float(x) for x in mean), tuple(float(x) for x in std)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _decode(data: bytes | Path, source: str, image: ImageInput) -> Any:
    """Decode a picture into a Pillow image of `image.mode`, refusing what would not convert faithfully."""
    from PIL import Image, UnidentifiedImageError

    limit = min(MAX_PIXELS, Image.MAX_IMAGE_PIXELS or MAX_PIXELS)
    target = f"the model takes {image.size[0]}x{image.size[1]} {image.mode}"
    try:
        with warnings.catch_warnings():
            # Pillow only warns past its own limit; a bomb is refused, not decoded. (catch_warnings is
            # process-wide: should two threads interleave here, the explicit check below still refuses.)
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data, formats=FORMATS)
        with opened as picture:
            width, height = picture.size
            if width * height > limit:
                raise InputError(
                    f"{source} is {width}x{height} = {width * height} pixels, over the {limit}-pixel limit; "
                    f"give a smaller picture ({target})"
                )
            # Resizing goes one axis at a time, so a sliver (1 x 40 million) stretched to the model's width
            # makes width x height pixels on the way: hundreds of millions, seconds of CPU, from a 80 KB file.
            wide, high = image.size[1], image.size[0]
            if max(wide * height, width * high) > limit:
                raise InputError(
                    f"{source}, {width}x{height} (width x height), is too far from the model's {wide}x{high} in "
                    f"shape: resizing it would make {max(wide * height, width * high)} pixels on the way, over the "
                    f"{limit}-pixel limit; crop it closer to the model's shape ({target})"
                )
            mode = picture.mode
            if mode not in ACCEPTED_MODES or (mode == "P" and "transparency" in picture.info):
                raise InputError(
                    f"{source} is a {picture.format} picture in mode {mode}, which does not convert faithfully to "
                    f"{image.mode} (an alpha channel would be dropped; 16-bit pixels are past 0..255); send it "
                    f"as {', '.join(ACCEPTED_MODES)} (e.g. flatten it onto its background: img.convert('RGB'))"
                )
            return picture.convert(image.mode)  # decodes the pixels
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's message names the size: "Image size (N pixels) exceeds limit of M pixels"
        raise InputError(
            f"{source} is too large to decode safely ({str(exc).split(', could')[0]}); "
            f"give a smaller picture ({target})"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        # A truncated or corrupt file fails while decoding: OSError ("image file is truncated"),
        # SyntaxError ("broken PNG file"), ValueError or EOFError, depending on the format.
        raise InputError(
            f"{source} is not a readable picture ({str(exc)[:200]}); send a {', '.join(FORMATS)} file"
        ) from None


def record_image_option(text: str, inputs: list[TensorSpec]) -> None:
    """`pipe import --image-preprocessing JSON`: record how pictures feed the model's image input.

    The JSON object holds the image record (`mode`, `size`, `resize`, `scale`), optionally `mean` and
    `std` the model does not apply itself (per channel, after the scale), `layout` (NCHW, the default
    import guess for 4-D inputs, or NHWC) and `input` (the input's name, needed when several inputs are
    4-D). It is checked here as pipe serve and pipe predict will read it.
    """
    import json

    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--image-preprocessing is not valid JSON ({exc}): {text[:80]!r}") from None
    if not isinstance(given, dict):
        raise InputError(f"--image-preprocessing must be a JSON object, got {text[:80]!r}")
    given = dict(given)
    name, layout = given.pop("input", None), given.pop("layout", None)
    normalization = {k: given.pop(k) for k in ("mean", "std") if k in given}
    images = [s for s in inputs if len(s.shape) == 4] if name is None else [s for s in inputs if s.name == name]
    if len(images) != 1:
        shown = ", ".join(f"{s.name}: {s.dtype}{s.shape}" for s in inputs)
        why = f"has no input {name!r}" if name is not None else f"has {len(images)} four-dimensional inputs"
        raise InputError(f'--image-preprocessing: the model {why} ({shown}); name the image input with "input"')
    spec = images[0]
    if layout is not None:
        if layout not in ("NCHW", "NHWC"):
            raise InputError(f"--image-preprocessing: layout {layout!r} is not NCHW or NHWC")
        spec.layout = layout
    record = check_record(given, "--image-preprocessing")
    spec.preprocessing = {**spec.preprocessing, **normalization, "image": record}
    if normalization:
        spec.preprocessing["applied_in_model"] = False
    image_input(None, spec)  # every problem now, not at the first request
