"""Models and pictures shaped like the real ones pipe imports, built in the test (nothing downloaded).

- `mobilenet_like`: a MobileNet-like classifier at 224x224 (a strided stem, depthwise-separable blocks
  with hard-swish, global pooling, a linear head), exported with torch.onnx.export and a dynamic batch,
  its head fitted in closed form so it tells the colour classes of `write_pictures` apart.
- `write_pictures`: class folders of PNG and JPEG pictures of several sizes (landscape, portrait,
  square, small), each a shape in its class's colour on a grey gradient, as a photo folder would hold.
- `yolo_detector`: the layout of an Ultralytics YOLOv8 detector exported to ONNX with `dynamic=True`
  (ultralytics 8.2.x): input `images` [batch, 3, height, width], one output `output0`
  [batch, 4 + classes, anchors] from three strides (8, 16, 32; 2100 anchors at 320x320), each
  anchor's box as cx, cy, w, h in input pixels (from left/top/right/bottom distances to the
  anchor point, as the head's dist2bbox does) and sigmoid class scores; metadata_props exactly as
  Ultralytics' exporter writes them (`ultralytics_metadata`). A small torch conv net, random
  weights with a fixed seed, exported by the TorchScript exporter as Ultralytics does.
- `colour_detector`: the same head layout on a network that finds the coloured shapes `shapes_picture`
  draws, so pictures get a handful of confident boxes (labels red, green, blue).
- `reference_detections`: what a detector finds in a picture, written out plainly with Pillow, numpy and
  onnxruntime as Ultralytics does it (LetterBox, non_max_suppression, scale_boxes), nothing of pipe.
- `paddle_classifier`: a PaddleClas-style classifier as paddle2onnx writes one: input `x`
  declared [-1, 3, -1, -1] (Paddle's -1 dims), a softmax output [-1, classes], and the labels in
  `metadata_props['character']`, one per line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
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


# --- Ultralytics and Paddle layouts ------------------------------------------------------------

COCO_FIRST = ["person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck"]
STRIDES = (8, 16, 32)
IMGSZ = 320
SCORE_GAIN, SCORE_BIAS = 40.0, -3.0  # class logits spread wide: on noise, ~100 anchors per picture score > 0.25


def ultralytics_metadata(names: list[str], imgsz: tuple[int, int] = (IMGSZ, IMGSZ)) -> dict[str, str]:
    """metadata_props as ultralytics 8.2.46 writes them for a detector (every value str()'d)."""
    return {
        "description": "Ultralytics YOLOv8n model trained on coco.yaml",
        "author": "Ultralytics",
        "date": "2024-07-01T12:00:00.000000",
        "version": "8.2.46",
        "license": "AGPL-3.0 License (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
        "stride": "32",
        "task": "detect",
        "batch": "1",
        "imgsz": str(list(imgsz)),
        "names": str(dict(enumerate(names))),
    }


def set_metadata(path: Path, metadata: dict[str, str]) -> None:
    """Replace the metadata_props of the ONNX file at `path`."""
    model = onnx.load(str(path))
    del model.metadata_props[:]
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))


def anchor_points(h: int, w: int, stride: int):  # -> torch.Tensor
    """The centres of a stride's h x w cells in pixels, [1, 2, h*w] (x, y): the anchors YOLOv8's head decodes at."""
    import torch

    ys = (torch.arange(h, dtype=torch.float32) + 0.5) * stride
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) * stride
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx, gy]).reshape(1, 2, h * w)


def yolo_module(classes: int, seed: int = 0, box_scale: float = 1.0):  # -> torch.nn.Module
    """The torch detector (see the module doc); `box_scale` scales every box's distances (a perturbed box head)."""
    import torch
    from torch import nn

    class Detector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(seed)
            act = nn.SiLU()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), act, nn.Conv2d(8, 16, 3, 2, 1), act)  # stride 4
            self.down = nn.ModuleList(
                [nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1), act) for _ in STRIDES]
            )  # strides 8, 16, 32
            self.box = nn.ModuleList([nn.Conv2d(16, 4, 1) for _ in STRIDES])
            self.cls = nn.ModuleList([nn.Conv2d(16, classes, 1) for _ in STRIDES])
            with torch.no_grad():
                for conv in self.cls:  # confident scores: some anchors well above 0.25, most below
                    conv.weight.mul_(SCORE_GAIN)
                    conv.bias.fill_(SCORE_BIAS)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = self.stem(images)
            outputs = []
            for stride, down, box, cls in zip(STRIDES, self.down, self.box, self.cls, strict=True):
                x = down(x)
                batch, _, h, w = x.shape
                anchor = anchor_points(h, w, stride)
                ltrb = nn.functional.softplus(box(x)).reshape(batch, 4, -1) * (2.0 * stride * box_scale)
                lt, rb = ltrb[:, :2], ltrb[:, 2:]
                xyxy1, xyxy2 = anchor - lt, anchor + rb
                cxcy, wh = (xyxy1 + xyxy2) / 2, xyxy2 - xyxy1
                scores = cls(x).sigmoid().reshape(batch, cls.out_channels, -1)
                outputs.append(torch.cat([cxcy, wh, scores], dim=1))  # [batch, 4 + classes, h*w]
            return torch.cat(outputs, dim=2)  # [batch, 4 + classes, anchors]

    return Detector().eval()


def yolo_detector(
    path: Path, names: list[str] | None = None, seed: int = 0, box_scale: float = 1.0, metadata: bool = True
) -> Path:
    """Write the YOLOv8-layout detector to `path` (dynamic batch, height, width, anchors) and return it."""
    names = names if names is not None else COCO_FIRST[:3]
    return export_detector(yolo_module(len(names), seed, box_scale), path, names, metadata)


def export_detector(module, path: Path, names: list[str], metadata: bool = True) -> Path:  # module: torch.nn.Module
    """`module` exported as Ultralytics exports a detector (see the module doc), with its metadata_props."""
    import torch

    example = torch.zeros(1, 3, IMGSZ, IMGSZ)
    dynamic = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}}
    with warnings.catch_warnings():  # Ultralytics exports with the TorchScript exporter, which torch now flags
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=17, input_names=["images"],
                          output_names=["output0"], dynamic_axes=dynamic)  # fmt: skip
    model = onnx.load(str(path))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 4 + len(names)  # [batch, 84, anchors], as shipped
    onnx.save(model, str(path))
    set_metadata(path, ultralytics_metadata(names) if metadata else {})
    return path


# --- a detector that finds coloured shapes in pictures --------------------------------------------

SHAPE_CLASSES = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220)}  # class index = position
COLOUR_GAIN, COLOUR_BIAS = 12.0, -4.0  # a cell all of one colour scores ~0.99, a grey one ~0.02


def colour_module(seed: int = 0):  # -> torch.nn.Module
    """The YOLOv8 head layout on a network that really finds things: each stride-32 cell's mean colour
    (a strided conv, as a stem would compute it) scores a class by how much one channel stands out of
    the other two (red, green, blue; grey scores ~0.02), and its box is the cell's anchor point widened
    by about one stride each way, a little by its colour (a random 1x1 conv). Strides 8 and 16 give
    anchors that never score (as a real head's finer strides would on large objects), so the output is
    the full [batch, 4 + 3, 2100] at 320x320."""
    import torch
    from torch import nn

    class ColourDetector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.cells = nn.ModuleList()
            self.cls = nn.ModuleList()
            self.box = nn.ModuleList()
            stand_out = torch.tensor([[1.0, -0.5, -0.5], [-0.5, 1.0, -0.5], [-0.5, -0.5, 1.0]])
            for stride in STRIDES:
                mean = nn.Conv2d(3, 3, stride, stride, groups=3, bias=False)  # each cell's mean colour
                cls, box = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 4, 1)
                with torch.no_grad():
                    mean.weight.fill_(1.0 / stride**2)
                    cls.weight.copy_((stand_out * COLOUR_GAIN).reshape(3, 3, 1, 1))
                    cls.bias.fill_(COLOUR_BIAS if stride == STRIDES[-1] else -30.0)
                self.cells.append(mean)
                self.cls.append(cls)
                self.box.append(box)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            outputs = []
            for stride, mean, cls, box in zip(STRIDES, self.cells, self.cls, self.box, strict=True):
                cells = mean(images)
                batch, _, h, w = cells.shape
                anchor = anchor_points(h, w, stride)
                ltrb = (0.8 + 0.4 * box(cells).sigmoid()).reshape(batch, 4, -1) * stride
                xyxy1, xyxy2 = anchor - ltrb[:, :2], anchor + ltrb[:, 2:]
                scores = cls(cells).sigmoid().reshape(batch, 3, -1)
                outputs.append(torch.cat([(xyxy1 + xyxy2) / 2, xyxy2 - xyxy1, scores], dim=1))
            return torch.cat(outputs, dim=2)

    return ColourDetector().eval()


def colour_detector(path: Path, seed: int = 0) -> Path:
    """The colour detector (`colour_module`) exported as Ultralytics exports YOLOv8, labels red, green, blue."""
    return export_detector(colour_module(seed), path, list(SHAPE_CLASSES))


def shapes_picture(size: tuple[int, int], seed: int) -> Image.Image:
    """A grey gradient of `size` (width, height) holding two or three large shapes of SHAPE_CLASSES' colours."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(70, 180, width, dtype=np.float32)[np.newaxis, :]
    grey = np.repeat(ramp, height, axis=0).astype(np.uint8)
    image = Image.fromarray(np.stack([grey] * 3, axis=-1), "RGB")
    draw = ImageDraw.Draw(image)
    colours = list(SHAPE_CLASSES.values())
    for n in range(2 + seed % 2):
        side = int(min(width, height) * rng.uniform(0.3, 0.45))
        left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        box = (left, top, left + side - 1, top + int(side * rng.uniform(0.7, 1.0)))
        (draw.ellipse if n % 2 else draw.rectangle)(box, fill=colours[(seed + n) % len(colours)])
    return image


def letterboxed(
    image: Image.Image, size: int = IMGSZ, pad: int = 114
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """Ultralytics' LetterBox(auto=False) with Pillow's bilinear resize: the [3, size, size] float32 sample
    (0..1), the size the picture was resized to and the (left, top) padding."""
    width, height = image.size
    ratio = min(size / height, size / width)
    resized = round(width * ratio), round(height * ratio)
    left, top = round((size - resized[0]) / 2 - 0.1), round((size - resized[1]) / 2 - 0.1)
    canvas = np.full((size, size, 3), pad, np.uint8)
    pixels = np.asarray(image.convert("RGB").resize(resized, Image.Resampling.BILINEAR))
    canvas[top : top + resized[1], left : left + resized[0]] = pixels
    return (canvas.astype(np.float32) / 255).transpose(2, 0, 1), resized, (left, top)


def plain_iou(a: list[float], b: list[float]) -> float:
    """IoU of two x1, y1, x2, y2 boxes."""
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - width * height
    return width * height / union if union > 0 else 0.0


def plain_decode(head: np.ndarray, confidence: float, iou: float, max_detections: int) -> list[tuple]:
    """One picture's head [4 + k, anchors] -> [(class, score, [x1, y1, x2, y2])], best first: each anchor's
    best class above `confidence`, greedy NMS within each class, the best `max_detections`."""
    found = []
    for anchor in range(head.shape[1]):
        scores = head[4:, anchor]
        cls = int(np.argmax(scores))
        if scores[cls] > confidence:
            cx, cy, w, h = (float(v) for v in head[:4, anchor])
            found.append((cls, float(scores[cls]), [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]))
    found.sort(key=lambda box: -box[1])
    kept: list[tuple] = []
    for cls, score, box in found:
        if all(other[0] != cls or plain_iou(other[2], box) <= iou for other in kept):
            kept.append((cls, score, box))
    return kept[:max_detections]


def reference_detections(
    model: Path, image: Image.Image, confidence: float = 0.25, iou: float = 0.7, max_detections: int = 300
) -> list[tuple]:
    """The detections of the detector at `model` in `image`, in the picture's pixels: letterboxed by hand,
    run in onnxruntime, decoded plainly, mapped back (minus the padding, over the scale the picture was
    resized by on each axis, clipped to the picture). [(class, score, [x1, y1, x2, y2])], best first.

    Ultralytics' scale_boxes divides by the ratio (`min(320 / h, 320 / w)`), not by the scale the resize
    really applied (the resized size is rounded to whole pixels): for a 403x211 picture the two differ by
    0.3% vertically, half a pixel at the bottom, an IoU of 0.989 for an 80-pixel box. The resize's own
    scale is where Pillow put the pixels, so that is what this reference (and pipe) divide by.
    """
    import onnxruntime as ort

    sample, resized, (left, top) = letterboxed(image)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    head = session.run(None, {session.get_inputs()[0].name: sample[np.newaxis]})[0][0]
    width, height = image.size
    sx, sy = resized[0] / width, resized[1] / height
    mapped = []
    for cls, score, (x1, y1, x2, y2) in plain_decode(head, confidence, iou, max_detections):
        box = [(x1 - left) / sx, (y1 - top) / sy, (x2 - left) / sx, (y2 - top) / sy]
        box = [min(max(v, 0.0), width if i % 2 == 0 else height) for i, v in enumerate(box)]
        mapped.append((cls, score, box))
    return mapped


def paddle_classifier(path: Path, labels: list[str], character: str | None = None) -> Path:
    """Write a PaddleClas-style classifier (see the module doc) with `character` metadata (default: the labels)."""
    classes = len(labels)
    rng = np.random.default_rng(0)
    conv = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "conv_w")
    dense = numpy_helper.from_array(rng.standard_normal((8, classes)).astype(np.float32), "fc_w")
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c"], ["h"]),
        helper.make_node("GlobalAveragePool", ["h"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc_w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["softmax_0.tmp_0"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "pplcnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, -1])],
        [helper.make_tensor_value_info("softmax_0.tmp_0", TensorProto.FLOAT, [-1, classes])],
        [conv, dense],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="PaddlePaddle")
    model.ir_version = 8
    entry = model.metadata_props.add()
    entry.key, entry.value = "character", character if character is not None else "\n".join(labels) + "\n"
    onnx.save(model, str(path))
    return path
