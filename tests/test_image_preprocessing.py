"""The recorded image preprocessing (pipeline/runtime/images.py), held to references written here with
Pillow and numpy: torchvision's Resize(256) + CenterCrop(224) and Ultralytics' LetterBox, on pictures of
several sizes; boxes mapped back; every bad combination of keys refused up front, in one line.

Resampling: every resize is Pillow's `resize` with the recorded filter (bilinear here), antialiased when
shrinking as Pillow always is; torchvision resizes Pillow images with that same call, so the ImageNet
pipeline matches to float rounding. Ultralytics resizes with OpenCV's INTER_LINEAR (no antialias): the
reference below keeps its geometry (scale, rounding, padding) and resizes with Pillow like pipe, so the
grey levels match exactly and the geometry is what is tested.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageDraw

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import MANIFEST_NAME, Manifest
from pipeline.artifact.preprocessing import parse_image_record
from pipeline.artifact.tensors import TensorSpec
from pipeline.cli import main
from pipeline.core.errors import ArtifactError, InputError
from pipeline.runtime.images import ImageInput, image_input

IMAGENET = {"mode": "RGB", "resize_short": 256, "crop": [224, 224], "resize": "bilinear", "scale": 1 / 255}
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
YOLO = {"mode": "RGB", "letterbox": {"size": [320, 320], "pad": 114}, "scale": 1 / 255}
# width x height: landscape, portrait, square, tiny, odd, a wide strip, one already the model's size; 200x301 and
# 640x480 put a crop or pad corner on a half pixel, where round() (half to even) and round-half-up differ
SIZES = [(640, 480), (300, 500), (200, 301), (256, 256), (7, 5), (333, 101), (1000, 37), (320, 320)]


def conversion(record: dict, size: list[int], layout: str = "NCHW", **pre: object) -> ImageInput:
    shape = ["batch", 3, *size] if layout == "NCHW" else ["batch", *size, 3]
    spec = TensorSpec("image", "float32", shape, layout, preprocessing={"image": record, **pre})
    return image_input(None, spec)


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth colour gradients with noise on top: every resampling difference shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = [x / max(width - 1, 1) * 255, y / max(height - 1, 1) * 255, (x + y) % 97 * 2.6]
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def torchvision_imagenet(image: Image.Image) -> np.ndarray:
    """Resize(256) (shorter side, longer truncated by int()), CenterCrop(224) (corner by round()), ToTensor,
    Normalize: torchvision's code for Pillow images, written out."""
    w, h = image.size
    size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    resized = np.asarray(image.resize(size, Image.Resampling.BILINEAR), np.float32)
    top, left = round((size[1] - 224) / 2.0), round((size[0] - 224) / 2.0)
    tensor = resized[top : top + 224, left : left + 224] / 255.0
    return ((tensor - np.array(MEAN, np.float32)) / np.array(STD, np.float32)).transpose(2, 0, 1)


def ultralytics_letterbox(image: Image.Image, new_shape: tuple[int, int] = (320, 320)) -> np.ndarray:
    """ultralytics.data.augment.LetterBox(new_shape, auto=False, scaleup=True, center=True), written out:
    uint8 [H, W, 3]."""
    img = np.asarray(image)
    shape = img.shape[:2]  # height, width
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    new_unpad = round(shape[1] * r), round(shape[0] * r)
    dw, dh = (new_shape[1] - new_unpad[0]) / 2, (new_shape[0] - new_unpad[1]) / 2
    if shape[::-1] != new_unpad:
        img = np.asarray(Image.fromarray(img).resize(new_unpad, Image.Resampling.BILINEAR))
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    return np.pad(img, ((top, bottom), (left, right), (0, 0)), constant_values=114)


def ultralytics_scale_boxes(boxes: np.ndarray, original: tuple[int, int], new_shape=(320, 320)) -> np.ndarray:
    """ultralytics.utils.ops.scale_boxes(img1_shape, boxes, img0_shape): input pixels -> the picture's, clipped."""
    width, height = original
    gain = min(new_shape[0] / height, new_shape[1] / width)
    pad = round((new_shape[1] - width * gain) / 2 - 0.1), round((new_shape[0] - height * gain) / 2 - 0.1)
    out = boxes.astype(np.float64).copy()
    out[:, [0, 2]] -= pad[0]
    out[:, [1, 3]] -= pad[1]
    out /= gain
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, width)
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, height)
    return out


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_imagenet_resize_short_and_center_crop_equal_torchvision_written_out(size: tuple[int, int]) -> None:
    image = photo(*size)
    sample, placement = conversion(IMAGENET, [224, 224], mean=MEAN, std=STD).convert(png(image), "photo")
    reference = torchvision_imagenet(image)
    assert sample.shape == (3, 224, 224) and sample.dtype == np.float32
    np.testing.assert_allclose(sample, reference, atol=1e-5)  # float rounding; one grey level is 0.017 here
    w, h = size
    resized = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    assert placement.original == size
    assert placement.scale == pytest.approx((resized[0] / w, resized[1] / h))
    assert placement.offset == (-round((resized[0] - 224) / 2), -round((resized[1] - 224) / 2))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_letterbox_equals_ultralytics_written_out_and_its_boxes_map_back_as_scale_boxes_does(
    size: tuple[int, int],
) -> None:
    image = photo(*size, seed=1)
    sample, placement = conversion(YOLO, [320, 320]).convert(png(image), "photo")
    reference = ultralytics_letterbox(image)
    grey = np.rint(sample.transpose(1, 2, 0) * 255).astype(np.uint8)
    np.testing.assert_array_equal(grey, reference)  # every grey level, the padding's 114 included

    boxes = np.array([[0, 0, 320, 320], [100.5, 40, 200, 300], [-5, 150, 10, 400]], np.float32)
    mapped = placement.to_original(boxes)
    assert mapped.dtype == np.float32 and mapped.min() >= 0
    assert (mapped[:, [0, 2]] <= size[0]).all() and (mapped[:, [1, 3]] <= size[1]).all()
    # scale_boxes divides by the ratio LetterBox chose and recomputes the padding from the unrounded size (one
    # input pixel off the padding LetterBox applied, at 7x5); pipe uses the size and padding really applied.
    ratio = min(320 / size[1], 320 / size[0])
    np.testing.assert_allclose(mapped, ultralytics_scale_boxes(boxes, size), atol=1.5 / ratio + 1e-3)


@pytest.mark.parametrize(
    ("record", "size"),
    [(YOLO, [320, 320]), (IMAGENET, [224, 224]), ({"mode": "RGB", "size": [120, 200], "crop": [100, 150]}, [100, 150]),
     ({"mode": "RGB", "size": [90, 90]}, [90, 90])],
    ids=["letterbox", "resize_short-crop", "size-crop", "stretch"],
)  # fmt: skip
def test_a_box_drawn_on_the_picture_is_found_where_placement_maps_it_back(record: dict, size: list[int]) -> None:
    """Draw a magenta box on a grey picture, find it in the converted sample, map its extent back."""
    width, height = 403, 211
    drawn = (150, 60, 260, 170)  # x1, y1, x2, y2 in the picture, both ends inside the box
    image = Image.new("RGB", (width, height), (128, 128, 128))
    ImageDraw.Draw(image).rectangle(drawn, fill=(255, 0, 255))
    sample, placement = conversion(record, size).convert(png(image), "box")
    magenta = (sample[0] > 0.75) & (sample[1] < 0.25)  # [H, W] input pixels mostly magenta
    ys, xs = np.nonzero(magenta)
    found = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)  # pixel edges
    back = placement.to_original(found)[0]
    slack = 1.5 / min(placement.scale)  # a resampled edge pixel, in picture pixels
    np.testing.assert_allclose(back, [drawn[0], drawn[1], drawn[2] + 1, drawn[3] + 1], atol=slack)


def test_grey_and_nhwc_and_uint8_inputs_take_the_same_geometry() -> None:
    image = photo(300, 500)
    grey = {**IMAGENET, "mode": "L"}
    spec = TensorSpec("image", "uint8", ["batch", 224, 224, 1], "NHWC", preprocessing={"image": grey})
    sample, _ = image_input(None, spec).convert(png(image), "photo")
    resized = image.convert("L").resize((256, int(256 * 500 / 300)), Image.Resampling.BILINEAR)
    top = round((resized.height - 224) / 2.0)
    np.testing.assert_array_equal(sample[..., 0], np.asarray(resized)[top : top + 224, 16:240])


def test_a_sliver_whose_shorter_side_would_grow_past_the_pixel_limit_is_refused_before_decoding() -> None:
    sliver = png(Image.new("RGB", (1, 200_000)))  # resize_short 256 would make it 256 x 51,200,000
    with pytest.raises(InputError, match=r"too far from the model's 224x224 in shape: .* over the 50000000-pixel"):
        conversion(IMAGENET, [224, 224]).convert(sliver, "sliver.png")


BAD = {
    "crop past resize_short": (
        {"mode": "RGB", "resize_short": 256, "crop": [300, 300]},
        "crop [300, 300] is larger than resize_short 256 (the shorter side after resizing)",
    ),
    "crop past size": ({"mode": "RGB", "size": [200, 200], "crop": [224, 224]}, "crop [224, 224] is larger than size"),
    "letterbox with resize_short": (
        {"mode": "RGB", "resize_short": 256, "letterbox": {"size": [640, 640], "pad": 114}},
        "letterbox resizes and pads to its own size, so resize_short would resize twice; drop resize_short",
    ),
    "letterbox with crop": (
        {"mode": "RGB", "crop": [224, 224], "letterbox": {"size": [640, 640]}},
        "drop crop",
    ),
    "resize_short alone": ({"mode": "RGB", "resize_short": 256}, "without crop gives pictures of different shapes"),
    "crop alone": ({"mode": "RGB", "crop": [224, 224]}, "needs a resize before it; add resize_short"),
    "size and resize_short": (
        {"mode": "RGB", "size": [224, 224], "resize_short": 256, "crop": [224, 224]},
        "both resize; keep one",
    ),
    "no geometry": ({"mode": "RGB"}, "no geometry: give size: [H, W] (stretch), resize_short"),
    "pad past 255": ({"mode": "RGB", "letterbox": {"size": [640, 640], "pad": 300}}, "letterbox pad 300 is not"),
    "letterbox without size": ({"mode": "RGB", "letterbox": {"pad": 114}}, "letterbox lacks size"),
    "letterbox size of one": ({"mode": "RGB", "letterbox": {"size": [640]}}, "letterbox size [640] is not"),
    "resize_short zero": ({"mode": "RGB", "resize_short": 0, "crop": [2, 2]}, "resize_short 0 is not a length"),
    "unknown key": ({"mode": "RGB", "size": [2, 2], "center_crop": 2}, "unknown key(s) ['center_crop']"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_every_bad_combination_is_one_line_naming_the_key_and_the_fix(case: str) -> None:
    record, message = BAD[case]
    with pytest.raises(InputError) as refused:
        parse_image_record(record, "inputs[0].preprocessing.image")
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith("inputs[0].preprocessing.image")


@pytest.mark.parametrize("case", ["crop past resize_short", "letterbox with resize_short", "resize_short alone"])
def test_pipe_import_refuses_a_bad_image_preprocessing_before_writing_anything(tmp_path: Path, case: str) -> None:
    record, message = BAD[case]
    model = _conv_model(tmp_path / "conv.onnx")
    args = ["import", str(model), "--name", "conv", "--repository", str(tmp_path / "artifacts")]
    result = CliRunner().invoke(main, [*args, "--image-preprocessing", json.dumps(record)])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "artifacts").exists()


def _conv_model(path: Path) -> Path:
    """[batch, 3, 224, 224] -> the mean of each channel [batch, 3], in ONNX's text syntax."""
    import onnx
    import onnx.parser

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    means (float[N, 3, 224, 224] image) => (float[N, 3] y)
    <int64[2] axes = {2, 3}>
    { y = ReduceMean<keepdims = 0>(image, axes) }
    """)
    onnx.save(model, path)
    return path


def test_a_bad_record_in_a_manifest_is_refused_when_it_loads_by_every_command(tmp_path: Path) -> None:
    """A hand-edited manifest: pipe info (and serve, predict, every stage: they all load it) refuse it up front."""
    root = tmp_path / "artifacts" / "conv" / "1"
    spec = TensorSpec("image", "float32", ["batch", 3, 224, 224], "NCHW", {"image": IMAGENET})
    artifact = Artifact(root, Manifest(name="conv", version=1, task="regression", inputs=[spec],
                                       outputs=[TensorSpec("y", "float32", ["batch", 3])]))  # fmt: skip
    artifact.save()
    assert Artifact.load(root).manifest.inputs[0].preprocessing["image"] == IMAGENET  # a good record loads

    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["inputs"][0]["preprocessing"]["image"]["crop"] = [300, 300]
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"inputs\[0\]\.preprocessing\.image: crop \[300, 300\] is larger"):
        Artifact.load(root)
    result = CliRunner().invoke(main, ["info", str(root)])
    assert result.exit_code == 2 and "crop [300, 300] is larger than resize_short 256" in result.output

    manifest["inputs"][0]["preprocessing"]["image"] = {**IMAGENET, "mode": "L"}  # fine alone, not for 3 channels
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"preprocessing\.image\.mode is 'L', but input 'image' .* takes 3"):
        Artifact.load(root)


def test_pipe_info_shows_how_a_picture_becomes_the_input(tmp_path: Path) -> None:
    root = tmp_path / "artifacts" / "conv" / "1"
    spec = TensorSpec("image", "float32", ["batch", 3, 224, 224], "NCHW", {"image": IMAGENET})
    Artifact(root, Manifest(name="conv", version=1, task="regression", inputs=[spec],
                            outputs=[TensorSpec("y", "float32", ["batch", 3])])).save()  # fmt: skip
    result = CliRunner().invoke(main, ["info", str(root), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert "pictures: RGB, resize_short 256, crop 224x224, bilinear, scale 0.003922" in result.output
