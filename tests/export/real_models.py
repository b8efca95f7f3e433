"""Models and pictures shaped like the real ones pipe imports, built in the test (nothing downloaded).

- `mobilenet_like`: a MobileNet-like classifier at 224x224 (a strided stem, depthwise-separable blocks
  with hard-swish, global pooling, a linear head), exported with torch.onnx.export and a dynamic batch,
  its head fitted in closed form so it tells the colour classes of `write_pictures` apart.
- `write_pictures`: class folders of PNG and JPEG pictures of several sizes (landscape, portrait,
  square, small), each a shape in its class's colour on a grey gradient, as a photo folder would hold.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# Class name -> the colour its shapes are drawn in. Sorted names (blue, green, red, yellow) differ from
# this order, so a test can tell labels matched by name from labels matched by sorted order.
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 210, 20)}
SIZES = [(320, 240), (180, 300), (256, 256), (97, 61), (403, 211)]  # width, height: odd and small ones too
IMAGENET = {
    "mode": "RGB", "resize_short": 256, "crop": [224, 224], "resize": "bilinear", "scale": 1 / 255,
    "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
}  # fmt: skip
MEAN, STD = np.array(IMAGENET["mean"], np.float32), np.array(IMAGENET["std"], np.float32)


def picture(colour: tuple[int, int, int], size: tuple[int, int], seed: int) -> Image.Image:
    """A shape in `colour` on a grey gradient, placed and sized by `seed`."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(60, 190, width, dtype=np.float32)[np.newaxis, :] + rng.uniform(-20, 20)
    grey = np.clip(np.repeat(ramp, height, axis=0), 0, 255).astype(np.uint8)
    image = Image.fromarray(np.stack([grey] * 3, axis=-1), "RGB")
    draw = ImageDraw.Draw(image)
    side = max(4, int(min(width, height) * rng.uniform(0.5, 0.8)))
    left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
    box = (left, top, left + side - 1, top + side - 1)
    (draw.ellipse if seed % 2 else draw.rectangle)(box, fill=colour)
    return image


def write_pictures(root: Path, per_class: int = 5, classes: dict[str, tuple[int, int, int]] | None = None) -> Path:
    """root/<class>/<n>.png|jpg: `per_class` pictures of each class, cycling through SIZES; returns root."""
    for index, (name, colour) in enumerate((classes or COLOURS).items()):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            suffix = ".jpg" if n % 3 == 2 else ".png"
            picture(colour, SIZES[n % len(SIZES)], seed=100 * index + n).save(folder / f"{n}{suffix}")
    return root


def imagenet_sample(image: Image.Image) -> np.ndarray:
    """torchvision's Resize(256) + CenterCrop(224) + ToTensor + Normalize(ImageNet), written out with Pillow
    and numpy: [3, 224, 224] float32."""
    width, height = image.size
    if width <= height:
        size = 256, int(256 * height / width)
    else:
        size = int(256 * width / height), 256
    resized = np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR), np.float32)
    top, left = round((size[1] - 224) / 2.0), round((size[0] - 224) / 2.0)
    crop = resized[top : top + 224, left : left + 224] / 255.0
    return ((crop - MEAN) / STD).transpose(2, 0, 1).astype(np.float32)


def mobilenet_like(path: Path, classes: int = len(COLOURS), pictures: Path | None = None) -> Path:
    """A MobileNet-like classifier [batch, 3, 224, 224] -> [batch, classes] saved at `path` (ONNX, dynamic
    batch). With `pictures` (a folder of class folders in COLOURS order), the head is fitted to them by
    least squares on the pooled features, so the model names each picture's colour."""
    import torch
    from torch import nn

    def block(inp: int, out: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), nn.BatchNorm2d(inp), nn.Hardswish(),
            nn.Conv2d(inp, out, 1, bias=False), nn.BatchNorm2d(out), nn.Hardswish(),
        )  # fmt: skip

    torch.manual_seed(0)
    features = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        block(16, 24, 2), block(24, 32, 2), block(32, 48, 2), block(48, 64, 2), block(64, 96, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    ).eval()  # fmt: skip
    head = nn.Linear(96, classes)
    if pictures is not None:
        names = [name for name in COLOURS if (pictures / name).is_dir()]
        samples, target = [], []
        for index, name in enumerate(names):
            for file in sorted((pictures / name).iterdir()):
                samples.append(imagenet_sample(Image.open(file)))
                target.append(index)
        with torch.no_grad():
            pooled = features(torch.from_numpy(np.stack(samples))).numpy().astype(np.float64)
        pooled = np.concatenate([pooled, np.ones((len(pooled), 1))], axis=1)
        onehot = np.eye(classes)[target] * 10.0  # fewer pictures than features: fitted exactly
        solved = np.linalg.lstsq(pooled, onehot, rcond=None)[0]
        with torch.no_grad():
            head.weight.copy_(torch.from_numpy(solved[:-1].T.astype(np.float32)))
            head.bias.copy_(torch.from_numpy(solved[-1].astype(np.float32)))
    model = nn.Sequential(features, head).eval()
    with warnings.catch_warnings():  # the exporter's own deprecations; the project runs warnings as errors
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.zeros(2, 3, 224, 224),), str(path), input_names=["image"], output_names=["logits"],
            dynamo=True, external_data=False, dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False,
        )  # fmt: skip
    return path
