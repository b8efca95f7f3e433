"""Encoded pictures (PNG, JPEG, ...) -> samples of a model's image input, as the manifest says the model
was trained. The one conversion `pipe predict --input photo.png`, `pipe serve` and `pipe import
--eval-data DIR` (pipeline/data/picture_folder.py) use.

What a model needs is recorded on its input spec, `inputs[i].preprocessing.image`, checked by
`pipeline/artifact/preprocessing.py` (`ImageRecord`): the Pillow `mode` the picture is converted to
(`L`: grey, 1 channel; `RGB`: 3); its geometry: stretched to `size`, or `resize_short` (aspect kept)
then a center `crop` (torchvision's Resize + CenterCrop), or a `letterbox` (fit inside, pad, center:
Ultralytics' LetterBox with auto=False), every resize with Pillow's `resize` filter (antialiased when
shrinking, as Pillow does; torchvision on Pillow images resizes the same way, Ultralytics uses
OpenCV's INTER_LINEAR, which does not antialias: the geometry is the same, pixels may differ a few
grey levels); and the `scale` that maps 0..255 pixels to the units the model was trained on (1/255
for 0..1, 16/255 for sklearn's digits, 1 for raw 0..255). The layout (NCHW or NHWC) is the spec's
own `layout`. After scaling, a `mean`/`std` beside it in `preprocessing` is applied per channel,
unless `applied_in_model: true` (every model `pipe train` makes normalizes inside). A uint8 input
takes the pixels as they are.

Each conversion also says where the picture landed in the sample (`Placement`: scale and offset per
axis), so a box found in the model's input pixels maps back to the picture's (`Placement.to_original`).

`pipe train` records the image record for the data sources that read pictures (pipeline/data); `pipe
import --image-preprocessing` lets the user record it. An artifact trained before the record existed
gets it from its train record's data source (`digits`, `images`).
"""

from __future__ import annotations

import dataclasses
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.preprocessing import (
    IMAGE_DTYPES,
    KEYS,
    ImageRecord,
    image_record,
    normalization,
    parse_image_record,
)
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError, first_line

# Picture modes that convert faithfully to L or RGB. An alpha channel (RGBA, LA, PA, P with transparency)
# is refused: converting drops it, so a digit drawn on a transparent canvas would silently become blank.
# 16/32-bit modes (I;16, I, F) hold values past 0..255, which `scale` is not about.
ACCEPTED_MODES = ("1", "L", "P", "RGB")
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF")  # what Pillow may decode: the common formats, nothing exotic
OPTION_KEYS = (*KEYS, "mean", "std", "layout", "input")  # --image-preprocessing: the record and what goes beside it
MAX_PIXELS = 50_000_000  # width x height decoded at most (a 20000x20000 PNG of zeros is a few KB: a bomb)
RECORD_EXAMPLE = (
    '\'{"mode": "RGB", "resize_short": 256, "crop": [224, 224], "scale": 0.00392156862745098, '
    '"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}\''
)


def digits_record() -> dict[str, Any]:
    """The image record of sklearn's 8x8 digits (values 0..16, 16 = ink): white ink on black maps onto them."""
    return {"mode": "L", "size": [8, 8], "resize": "bilinear", "scale": 16 / 255}


@dataclass(frozen=True)
class Placement:
    """Where one picture landed in the model's input: input pixel = picture pixel * scale + offset, per axis.

    Pairs are (x, y). A letterbox's offset is its padding (>= 0), a center crop's is minus the crop's
    corner (<= 0), a stretch's is 0 with a different scale per axis.
    """

    scale: tuple[float, float]  # input pixels per picture pixel, x then y
    offset: tuple[float, float]  # where the picture's top-left corner lies in input pixels, x then y
    original: tuple[int, int]  # the picture's width and height

    def to_original(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes [n, 4] as x1, y1, x2, y2 in the model's input pixels -> the picture's pixels, clipped to it."""
        boxes = np.asarray(boxes)
        out = boxes.astype(np.float64, copy=True)
        for axis in (0, 1):  # x (columns 0 and 2), then y (1 and 3)
            columns = out[..., axis::2]
            columns -= self.offset[axis]
            columns /= self.scale[axis]
            np.clip(columns, 0, self.original[axis], out=columns)
        return out.astype(boxes.dtype if boxes.dtype.kind == "f" else np.float32)


@dataclass(frozen=True)
class _Geometry:
    """What happens to a picture of one size: resized to `resized`, placed at `offset` on an `out` canvas
    (a negative offset crops, a positive one pads). All (width, height) or (x, y)."""

    resized: tuple[int, int]
    offset: tuple[int, int]
    out: tuple[int, int]


def _geometry(record: ImageRecord, width: int, height: int) -> _Geometry:
    """The record's geometry for a `width` x `height` picture, rounded as torchvision and Ultralytics round."""
    if record.letterbox is not None:  # Ultralytics LetterBox(auto=False, scaleup=True, center=True)
        out_h, out_w = record.letterbox.size
        ratio = min(out_h / height, out_w / width)
        resized = max(1, round(width * ratio)), max(1, round(height * ratio))
        left = round((out_w - resized[0]) / 2 - 0.1)
        top = round((out_h - resized[1]) / 2 - 0.1)
        return _Geometry(resized, (left, top), (out_w, out_h))
    if record.resize_short is not None:  # torchvision Resize(N): the longer side truncated, as int() does
        short = record.resize_short
        resized = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    else:
        assert record.size is not None
        resized = record.size[1], record.size[0]
    if record.crop is None:
        return _Geometry(resized, (0, 0), resized)
    crop_h, crop_w = record.crop  # torchvision CenterCrop: the corner rounded half to even, as round() does
    top, left = round((resized[1] - crop_h) / 2.0), round((resized[0] - crop_w) / 2.0)
    return _Geometry(resized, (-left, -top), (crop_w, crop_h))


@dataclass(frozen=True)
class ImageInput:
    """How an encoded picture becomes one sample of one image input of a model."""

    name: str  # the input's name
    dtype: str  # the input's numpy dtype: float32, float16, float64 or uint8
    layout: str  # NCHW or NHWC
    record: ImageRecord  # mode, geometry, resize filter, scale
    mean: tuple[float, ...] | None  # per channel (or one for all), applied here; None: not applied here
    std: tuple[float, ...] | None

    @property
    def mode(self) -> str:
        return self.record.mode

    @property
    def pillow_mode(self) -> str:
        """The Pillow mode a picture is decoded to: BGR is decoded as RGB, its channels reversed after."""
        return "RGB" if self.mode == "BGR" else self.mode

    @property
    def size(self) -> tuple[int, int]:
        """Height and width of the sample."""
        return self.record.input_size

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """One converted picture's shape: [C, H, W] (NCHW) or [H, W, C] (NHWC)."""
        (height, width), channels = self.size, len(self.mode)
        return (channels, height, width) if self.layout == "NCHW" else (height, width, channels)

    def describe(self) -> dict[str, Any]:
        """The preprocessing as a client needs to know it (shown in model metadata)."""
        described: dict[str, Any] = {"layout": self.layout, **self.record.to_dict()}
        if self.mean is not None:
            described |= {"mean": list(self.mean), "std": list(self.std or ())}
        return described

    def convert(self, data: bytes | Path, source: str) -> tuple[np.ndarray, Placement]:
        """One picture -> one sample ([C, H, W] for NCHW, [H, W, C] for NHWC) of the input's dtype, and
        where the picture lies in it.

        `source` names the picture in errors (a file name, `instances[2]`); every problem with it
        (not an image, too large, an unfaithful mode) is an InputError.
        """
        from PIL import Image

        picture, geometry = _decode(data, source, self)
        placement = Placement(
            (geometry.resized[0] / picture.width, geometry.resized[1] / picture.height),
            geometry.offset,
            picture.size,
        )
        if picture.size != geometry.resized:
            picture = picture.resize(geometry.resized, Image.Resampling[self.record.resize.upper()])
        if geometry.offset != (0, 0) or geometry.resized != geometry.out:
            if self.record.letterbox is not None:
                pad = self.record.letterbox.pad
                canvas = Image.new(self.pillow_mode, geometry.out, pad if self.mode == "L" else (pad, pad, pad))
                canvas.paste(picture, geometry.offset)
                picture = canvas
            else:
                left, top = -geometry.offset[0], -geometry.offset[1]
                picture = picture.crop((left, top, left + geometry.out[0], top + geometry.out[1]))
        pixels = np.asarray(picture, dtype=np.float32)
        pixels = pixels[..., np.newaxis] if pixels.ndim == 2 else pixels  # [H, W, C]
        if self.mode == "BGR":  # Paddle and OpenCV models: blue first
            pixels = pixels[..., ::-1]
        if self.dtype == "uint8":
            values = pixels.astype(np.uint8)
        else:
            values = pixels * np.float32(self.record.scale)
            if self.mean is not None and self.std is not None:
                values = (values - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
            values = values.astype(self.dtype)
        return np.ascontiguousarray(values.transpose(2, 0, 1) if self.layout == "NCHW" else values), placement


def image_input(manifest: Manifest | None, spec: TensorSpec) -> ImageInput:
    """How pictures feed input `spec`, from its recorded preprocessing; an InputError naming what is
    missing or wrong, and how to record it, when pictures cannot feed it."""
    where = f"input {spec.name!r} ({spec.dtype}{spec.shape} {spec.layout})"
    if spec.layout not in ("NCHW", "NHWC") or len(spec.shape) != 4:
        raise InputError(
            f"{where} is not an image input ([batch, C, H, W] NCHW or [batch, H, W, C] NHWC); send it as a tensor"
        )
    if spec.dtype not in IMAGE_DTYPES:
        raise InputError(f"{where} is {spec.dtype}, not pixels; send it as a tensor")
    if "image" not in spec.preprocessing and manifest is not None and (known := _from_train_record(manifest, spec)):
        spec = dataclasses.replace(spec, preprocessing={**spec.preprocessing, "image": known})
    record = image_record(spec)
    if record is None:
        raise InputError(
            f"the manifest does not say how a picture becomes {where}: it lacks "
            f"inputs[].preprocessing.image (mode, a geometry, resize, scale); record it with `pipe import "
            f"--image-preprocessing {RECORD_EXAMPLE}`, or send the input as a tensor in the model's own units"
        )
    mean, std = normalization(spec, len(record.mode))
    return ImageInput(spec.name, spec.dtype, spec.layout, record, mean, std)


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


def _decode(data: bytes | Path, source: str, image: ImageInput) -> tuple[Any, _Geometry]:
    """Decode a picture into a Pillow image of `image.mode`, and its geometry; refusing what would not
    convert faithfully, or would take more than MAX_PIXELS pixels on the way."""
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
            # makes width x height pixels on the way: hundreds of millions, seconds of CPU, from a 80 KB file;
            # resizing its shorter side to 256 (aspect kept) would make the picture itself that large.
            geometry = _geometry(image.record, width, height)
            wide, high = geometry.resized
            made = max(wide * height, width * high, wide * high)
            if made > limit:
                raise InputError(
                    f"{source}, {width}x{height} (width x height), is too far from the model's {image.size[1]}x"
                    f"{image.size[0]} in shape: resizing it would make {made} pixels on the way, over the "
                    f"{limit}-pixel limit; crop it closer to the model's shape ({target})"
                )
            mode = picture.mode
            if mode not in ACCEPTED_MODES or (mode == "P" and "transparency" in picture.info):
                raise InputError(
                    f"{source} is a {picture.format} picture in mode {mode}, which does not convert faithfully to "
                    f"{image.mode} (an alpha channel would be dropped; 16-bit pixels are past 0..255); send it "
                    f"as {', '.join(ACCEPTED_MODES)} (e.g. flatten it onto its background: img.convert('RGB'))"
                )
            return picture.convert(image.pillow_mode), geometry  # decodes the pixels
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's message: "Image size (N pixels) exceeds limit of M pixels, ..." with its own M
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{pixels.group(1)} pixels" if pixels else "larger than that"
        raise InputError(
            f"{source} is {size}, over the {limit}-pixel limit; give a smaller picture ({target})"
        ) from None
    except UnidentifiedImageError:
        # Pillow names the file object it was given ("<_io.BytesIO object at 0x...>"): no use to anyone
        raise InputError(
            f"{source} is not a readable picture (no {', '.join(FORMATS)} content was recognised); "
            f"send a {', '.join(FORMATS)} file"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        # A truncated or corrupt file fails while decoding: OSError ("image file is truncated"),
        # SyntaxError ("broken PNG file"), ValueError or EOFError, depending on the format.
        raise InputError(
            f"{source} is not a readable picture ({str(exc)[:200]}); send a {', '.join(FORMATS)} file"
        ) from None


def record_image_option(text: str, inputs: list[TensorSpec]) -> None:
    """`pipe import --image-preprocessing JSON`: record how pictures feed the model's image input.

    The JSON object holds the image record (`mode`, a geometry: `size`, `resize_short` and `crop`, or
    `letterbox`; `resize`, `scale`; pipeline/artifact/preprocessing.py), optionally `mean` and
    `std` the model does not apply itself (per channel, after the scale), `layout` (NCHW, the default
    import guess for 4-D inputs, or NHWC) and `input` (the input's name, needed when several inputs are
    4-D). It is checked here as pipe serve and pipe predict will read it.
    """
    import json

    try:
        given = json.loads(text)
    except (ValueError, RecursionError) as exc:  # also a 5,000-digit integer, and nesting past the parser's depth
        raise InputError(f"--image-preprocessing is not valid JSON ({first_line(exc, 120)}): {text[:80]!r}") from None
    if not isinstance(given, dict):
        raise InputError(f"--image-preprocessing must be a JSON object, got {text[:80]!r}")
    if unknown := sorted(set(given) - set(OPTION_KEYS)):
        raise InputError(f"--image-preprocessing: unknown key(s) {unknown}; valid keys are {', '.join(OPTION_KEYS)}")
    given = dict(given)
    name, layout = given.pop("input", None), given.pop("layout", None)
    outside = {k: given.pop(k) for k in ("mean", "std") if k in given}  # applied outside the model
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
    record = parse_image_record(given, "--image-preprocessing")
    spec.preprocessing = {**spec.preprocessing, **outside, "image": record.to_dict()}
    if outside:
        spec.preprocessing["applied_in_model"] = False
    image_input(None, spec)  # every problem now, not at the first request
