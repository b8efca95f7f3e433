"""What an image input's recorded preprocessing says (`inputs[].preprocessing.image`), checked.

The record says how an encoded picture becomes one sample of the input, so `pipe serve`, `pipe
predict` and `pipe import --eval-data DIR` feed pictures the way the model was trained
(`pipeline/runtime/images.py` does the conversion). Its geometry is one of three:

- `size: [H, W]`: stretched to it (aspect not kept), optionally followed by `crop`;
- `resize_short: N` then `crop: [H, W]`: shorter side to N, aspect kept, then a center crop
  (torchvision's `Resize(N)` + `CenterCrop((H, W))`; the ImageNet pipeline is 256 then 224x224);
- `letterbox: {size: [H, W], pad: 114}`: resized to fit inside, aspect kept, the rest padded with
  the pixel value `pad`, the picture centered (Ultralytics' `LetterBox(auto=False, center=True)`).

Beside the geometry: `mode` (`L`, `RGB`, or `BGR`: RGB with the channels reversed, what every Paddle
and OpenCV-trained model takes), `resize` (Pillow's filter for every resize), `scale`
(0..255 pixel x scale = the model's units). The manifest is refused on load when a record is bad,
so every command (serve, predict, info, import) refuses it up front, with the key and the fix.
Standard library only: the manifest imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import InputError

if TYPE_CHECKING:
    from pipeline.artifact.tensors import TensorSpec

MODES = ("L", "RGB", "BGR")  # the picture modes a record may name
CHANNELS = {"L": 1, "RGB": 3, "BGR": 3}  # mode -> the channels it fills
RESIZE_FILTERS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")  # Pillow's Resampling names
KEYS = ("mode", "size", "resize_short", "crop", "letterbox", "resize", "scale")
MAX_SIDE = 65_536  # pixels: a size past this is a typo, not a model
# scale, |mean| and std past this (std: below 1/this) overflow float32 on a 0..255 pixel: a typo, not a model
MAX_FACTOR = 1e6
IMAGE_DTYPES = ("float32", "float16", "float64", "uint8")
GEOMETRY_HELP = (
    "size: [H, W] (stretch), resize_short: N with crop: [H, W] (aspect kept, center crop; ImageNet: 256 and "
    "[224, 224]) or letterbox: {size: [H, W], pad: 114} (fit, aspect kept, padded)"
)


@dataclass(frozen=True)
class Letterbox:
    """Resize to fit inside `size` keeping the aspect, pad the rest with `pad`, picture centered."""

    size: tuple[int, int]  # height, width of the model input
    pad: int  # the border's pixel value, 0..255, before `scale` (Ultralytics: 114)


@dataclass(frozen=True)
class ImageRecord:
    """One image input's `preprocessing.image`, checked, defaults filled in."""

    mode: str  # L (1 channel) or RGB (3)
    resize: str = "bilinear"  # Pillow's filter for every resize: one of RESIZE_FILTERS
    scale: float = 1 / 255  # pixel (0..255) * scale = the model's units
    size: tuple[int, int] | None = None  # stretch to [height, width]
    resize_short: int | None = None  # shorter side to this many pixels, aspect kept
    crop: tuple[int, int] | None = None  # center crop [height, width] after size or resize_short
    letterbox: Letterbox | None = None  # fit inside, pad, center

    @property
    def input_size(self) -> tuple[int, int]:
        """Height and width of the sample the conversion makes: what the model's spatial dims must be."""
        if self.letterbox is not None:
            return self.letterbox.size
        size = self.crop or self.size
        assert size is not None  # parse_image_record refuses a record that makes no fixed size
        return size

    def to_dict(self) -> dict[str, Any]:
        """The record as the manifest holds it, only the keys that apply."""
        record: dict[str, Any] = {"mode": self.mode}
        if self.size is not None:
            record["size"] = list(self.size)
        if self.resize_short is not None:
            record["resize_short"] = self.resize_short
        if self.crop is not None:
            record["crop"] = list(self.crop)
        if self.letterbox is not None:
            record["letterbox"] = {"size": list(self.letterbox.size), "pad": self.letterbox.pad}
        return record | {"resize": self.resize, "scale": self.scale}


def parse_image_record(record: Any, where: str) -> ImageRecord:
    """An image record as recorded (a dict) -> ImageRecord; an InputError naming the key, the value and the fix."""
    if not isinstance(record, dict):
        raise InputError(f"{where} must be an object with mode, a geometry ({GEOMETRY_HELP}), resize and scale, "
                         f"got {record!r:.80}")  # fmt: skip
    if unknown := sorted(set(record) - set(KEYS)):
        raise InputError(f"{where}: unknown key(s) {unknown}; valid keys are {', '.join(KEYS)}")
    problems = []
    mode, resize, scale = record.get("mode"), record.get("resize", "bilinear"), record.get("scale", 1 / 255)
    if mode not in MODES:
        problems.append(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if resize not in RESIZE_FILTERS:
        problems.append(f"resize {resize!r} is not one of {', '.join(RESIZE_FILTERS)}")
    if not (_number(scale) and 0 < scale <= MAX_FACTOR):
        problems.append(f"scale {scale!r:.40} is not a number > 0 and <= {MAX_FACTOR:g} (1/255 maps pixels to 0..1)")
    size, crop = _pair(record, "size", problems), _pair(record, "crop", problems)
    short = record.get("resize_short")
    if short is not None and not (type(short) is int and 0 < short <= MAX_SIDE):
        problems.append(f"resize_short {short!r} is not a length in pixels (the shorter side's, e.g. 256)")
        short = None
    letterbox = _letterbox(record.get("letterbox"), problems) if "letterbox" in record else None
    if problems:
        raise InputError(f"{where}: {'; '.join(problems)}")
    record_ = ImageRecord(mode, resize, float(scale), size, short, crop, letterbox)
    if problem := _geometry_problem(record_):
        raise InputError(f"{where}: {problem}")
    return record_


def _pair(record: dict[str, Any], key: str, problems: list[str], label: str = "") -> tuple[int, int] | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2 and all(type(d) is int and 0 < d <= MAX_SIDE for d in value):
        return value[0], value[1]
    problems.append(f"{label}{key} {value!r:.40} is not [height, width] in pixels")
    return None


def _letterbox(value: Any, problems: list[str]) -> Letterbox | None:
    if not isinstance(value, dict) or set(value) - {"size", "pad"}:
        problems.append(f"letterbox {value!r:.80} is not an object with size [height, width] and pad (0..255)")
        return None
    size, pad = _pair(value, "size", problems, "letterbox "), value.get("pad", 114)
    if "size" not in value:
        problems.append("letterbox lacks size [height, width]")
    if not (type(pad) is int and 0 <= pad <= 255):
        problems.append(f"letterbox pad {pad!r} is not a pixel value 0..255 (Ultralytics pads with 114)")
        return None
    return Letterbox(size, pad) if size is not None else None


def _geometry_problem(record: ImageRecord) -> str | None:
    """Why the keys do not make one fixed-size geometry (and the fix), or None."""
    size, short, crop, box = record.size, record.resize_short, record.crop, record.letterbox
    if box is not None:
        others = [k for k, v in (("size", size), ("resize_short", short), ("crop", crop)) if v is not None]
        if others:
            return (f"letterbox resizes and pads to its own size, so {' and '.join(others)} would resize twice; "
                    f"drop {' and '.join(others)}")  # fmt: skip
        return None
    if size is not None and short is not None:
        return (f"size {list(size)} (stretch) and resize_short {short} (aspect kept) both resize; keep one "
                "(ImageNet: resize_short 256 with crop [224, 224])")  # fmt: skip
    if size is None and short is None:
        if crop is not None:
            return f"crop {list(crop)} needs a resize before it; add resize_short: N (N >= {max(crop)}) or size: [H, W]"
        return f"no geometry: give {GEOMETRY_HELP}"
    if short is not None and crop is None:
        return (f"resize_short {short} without crop gives pictures of different shapes (the longer side varies); "
                f"add crop: [H, W] (at most [{short}, {short}])")  # fmt: skip
    if crop is not None and short is not None and max(crop) > short:
        return (
            f"crop {list(crop)} is larger than resize_short {short} (the shorter side after resizing), so it "
            f"would run off the picture; set resize_short >= {max(crop)} or crop at most [{short}, {short}]"
        )
    if crop is not None and size is not None and (crop[0] > size[0] or crop[1] > size[1]):
        return (f"crop {list(crop)} is larger than size {list(size)} it crops from; crop at most {list(size)} "
                "or a larger size")  # fmt: skip
    return None


def image_record(spec: TensorSpec, where: str | None = None) -> ImageRecord | None:
    """`spec`'s image record checked against the input itself (an image input of the record's channels and
    size, a dtype that holds pixels, mean/std that fit), or None when it records none."""
    record = spec.preprocessing.get("image")
    if record is None:
        return None
    where = where or f"{spec.name}.preprocessing.image"
    parsed = parse_image_record(record, where)
    what = f"input {spec.name!r} ({spec.dtype}{spec.shape} {spec.layout})"
    if spec.layout not in ("NCHW", "NHWC") or len(spec.shape) != 4:
        raise InputError(f"{where} is recorded on {what}, which is not an image input ([batch, C, H, W] NCHW or "
                         "[batch, H, W, C] NHWC); set its layout, or drop the record")  # fmt: skip
    if spec.dtype not in IMAGE_DTYPES:
        raise InputError(f"{where} is recorded on {what}, whose dtype holds no pixels ({', '.join(IMAGE_DTYPES)} do)")
    channels, height, width = spec.shape[1:4] if spec.layout == "NCHW" else (spec.shape[3], *spec.shape[1:3])
    if isinstance(channels, int) and CHANNELS[parsed.mode] != channels:
        raise InputError(f"{where}.mode is {parsed.mode!r}, but {what} takes {channels} channel(s) (L: 1, "
                         "RGB or BGR: 3); "
                         "fix the mode")  # fmt: skip
    made = parsed.input_size
    if any(isinstance(d, int) and d != s for d, s in zip((height, width), made, strict=True)):
        key = "letterbox.size" if parsed.letterbox else "crop" if parsed.crop else "size"
        raise InputError(f"{where}.{key} is {list(made)}, but {what} takes {height}x{width}; make the pictures that "
                         "size")  # fmt: skip
    normalization(spec, len(parsed.mode))
    return parsed


def normalization(spec: TensorSpec, channels: int) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """The mean/std a conversion applies after scaling: those recorded, unless the model applies them itself."""
    pre = spec.preprocessing
    if "mean" not in pre or pre.get("applied_in_model") is True:
        return None, None
    mean, std = pre["mean"], pre.get("std", 1.0)
    mean = [mean] if _number(mean) else mean
    std = [std] if _number(std) else std
    ok = all(
        isinstance(v, list) and len(v) in (1, channels) and all(_number(x) and abs(x) <= MAX_FACTOR for x in v)
        for v in (mean, std)
    ) and all(x >= 1 / MAX_FACTOR for x in std)
    if not ok:
        raise InputError(
            f"input {spec.name!r}'s preprocessing mean {pre.get('mean')!s:.80} / std {pre.get('std')!s:.80} does "
            f"not fit {channels} channel(s) (one number per channel, or one for all; |mean| <= {MAX_FACTOR:g}, "
            f"{1 / MAX_FACTOR:g} <= std <= {MAX_FACTOR:g}); fix the manifest"
        )
    return tuple(float(x) for x in mean), tuple(float(x) for x in std)


def preprocessing_problems(inputs: list[TensorSpec]) -> list[str]:
    """Every input's image record that could not be applied, one line each (the manifest's load check)."""
    problems = []
    for i, spec in enumerate(inputs):
        try:
            image_record(spec, f"inputs[{i}].preprocessing.image")
        except InputError as exc:
            problems.append(str(exc))
    return problems


def _number(value: Any) -> bool:
    """A finite int or float (an int too large for a float is not one)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
