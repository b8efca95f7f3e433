"""What a model's exporter recorded in its `metadata_props`, read by the conventions of known exporters.

`pipe import` records every key it finds (values verbatim, bounded) and reads these conventions:

- Ultralytics (YOLOv8 and later; recognised by `author: Ultralytics`): `names` (a Python dict
  literal `{0: 'person', 1: 'bicycle'}`) -> labels; `imgsz` (`[640, 640]`) -> the image size
  golden inputs are generated at; `stride` (the head's largest); `task` (`detect` -> detection,
  `classify` -> classification); and, for every task but classify, its letterbox preprocessing:
  resize to fit keeping the aspect, pad with 114, scale 1/255, RGB, NCHW. `description`, `date`,
  `version`, `license`, `docs`, `batch`, `args` and `channels` are kept and shown, not read.
- PaddleOCR and PaddleClas: `character`, the labels, one per line (or a list literal); every line
  is also kept verbatim as a recognizer's dictionary (`dictionary`: empty and repeated entries are
  classes too; pipeline/export/recognizer.py decides whether the model is one).
- PaddleOCR's text-direction classifier and text recognizer (a Paddle graph: producer PaddlePaddle or
  paddle2onnx's `p2o.` dims; one input [?, 3, ?, ?]), which state no size: the size PaddleOCR itself
  feeds them (its `cls_image_shape` [3, 48, 192] for a classifier with 2 outputs, `rec_img_shape`
  [3, 48, 320] for a recognizer's [batch, T, classes] output) is the size golden inputs are made at,
  said as a convention, not read.
- Hugging Face (an optimum export, or a model whose config was copied in): `id2label`, JSON
  `{"0": "NEGATIVE", "1": "POSITIVE"}` -> labels.

Any other key is kept and shown, never guessed at. Literals are parsed with `ast.literal_eval` or
`json.loads`, never evaluated; a value that is too long, malformed, or does not describe labels
(ids not 0..n-1, an empty or repeated name) is ignored with one line in `notes` saying why. Whether
the labels fit the model's outputs is judged later, against the task (pipeline/export/tasks.py).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

import onnx

from pipeline.artifact.manifest import label_problem

MAX_KEYS = 64  # metadata keys recorded in the import record; more are counted in a note
MAX_RECORDED = 2_000  # characters of each value recorded (the whole value is read when parsed)
MAX_PARSED = 1_000_000  # a value longer than this is not parsed: no exporter writes labels that long
MAX_LABELS = 100_000  # labels read from metadata at most (PaddleOCR's largest dictionaries hold ~18,000)
MAX_LABEL = 1_000  # characters in one label
MAX_SIDE = 16_384  # the largest image side `imgsz` may give
ULTRALYTICS_TASKS = {"detect": "detection", "classify": "classification"}  # the tasks pipe has for them
LETTERBOX_PAD = 114  # Ultralytics pads letterboxed pictures with this grey (LetterBox, pad_value)


@dataclass
class Found:
    """What the metadata says, as pipe reads it: each value with its source, and what was ignored and why."""

    metadata: dict[str, str] = field(default_factory=dict)  # every key (at most MAX_KEYS), values cut
    convention: str | None = None  # Ultralytics | Paddle | Hugging Face
    task: str | None = None  # a pipe task
    labels: list[str] | None = None
    dictionary: list[str] | None = None  # PaddleOCR's `character` lines verbatim, for a text recognizer
    image_size: list[int] | None = None  # [height, width]
    stride: int | None = None
    letterbox: bool = False  # Ultralytics' letterbox preprocessing applies to the image input
    sources: dict[str, str] = field(default_factory=dict)  # "task" -> "metadata_props['task'] = 'detect' (...)"
    notes: list[str] = field(default_factory=list)


def read_conventions(model: onnx.ModelProto) -> Found:
    """The metadata_props of `model`, recorded and read by the conventions above."""
    props: dict[str, str] = {}
    found = Found()
    for prop in model.metadata_props:
        if not isinstance(prop.key, str) or not isinstance(prop.value, str):  # protobuf hands bad UTF-8 as bytes
            shown = prop.key if isinstance(prop.key, str) else prop.key.decode("utf-8", "replace")
            found.notes.append(
                f"metadata_props[{_key(shown)}] is not UTF-8 text; ignored, and left out of the imported model.onnx"
            )
            continue
        if prop.key in props:
            found.notes.append(f"metadata_props[{_key(prop.key)}] appears more than once; the first value is read")
            continue
        props[prop.key] = prop.value
    for key in list(props)[:MAX_KEYS]:
        value = props[key]
        cut = f"... ({len(value):,} characters)" if len(value) > MAX_RECORDED else ""
        found.metadata[key[:200]] = value[:MAX_RECORDED] + cut
    if len(props) > MAX_KEYS:
        found.notes.append(f"{len(props)} metadata keys; the first {MAX_KEYS} are recorded")
    if props.get("author", "").strip() == "Ultralytics":
        found.convention = "Ultralytics"
        _ultralytics(props, found)
    _other_labels(props, found)
    _dictionary(props, found)
    _paddleocr(model, found)
    return found


PADDLEOCR_SIZES = {"cls": [48, 192], "rec": [48, 320]}  # PaddleOCR's cls_image_shape and rec_img_shape (H, W)


def _paddleocr(model: onnx.ModelProto, found: Found) -> None:
    """The input size PaddleOCR feeds its direction classifier and recognizer, which their graphs leave free."""
    if found.image_size is not None:
        return
    weights = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*inputs, *model.graph.output]]
    paddle = model.producer_name == "PaddlePaddle" or any(str(d).startswith("p2o.") for ds in dims for d in ds)
    if not paddle or len(inputs) != 1 or len(model.graph.output) != 1:
        return
    image, out = dims[0], dims[1]
    if len(image) != 4 or image[1] != 3 or any(isinstance(d, int) and d > 0 for d in image[2:]):
        return
    kind = "cls" if len(out) == 2 and out[1] == 2 else "rec" if len(out) == 3 else None
    if kind is None:
        return
    found.image_size = PADDLEOCR_SIZES[kind]
    what = {"cls": "cls_image_shape, a text-direction classifier", "rec": "rec_img_shape, a text recognizer"}[kind]
    found.sources["image_size"] = f"PaddleOCR's {what} (a convention: the graph states no size)"
    found.convention = found.convention or "PaddleOCR"


def _ultralytics(props: dict[str, str], found: Found) -> None:
    where = "(Ultralytics)"
    if "names" in props and (labels := _labels(props, "names", found, _ids_to_names)) is not None:
        found.labels, found.sources["labels"] = labels, f"metadata_props['names'] {where}"
    if "imgsz" in props and (size := _parsed(props, "imgsz", found, _image_size)) is not None:
        found.image_size = size
        found.sources["image_size"] = f"metadata_props['imgsz'] = {_short(props['imgsz'])} {where}"
    if "stride" in props and (stride := _parsed(props, "stride", found, _stride)) is not None:
        found.stride = stride
        found.sources["stride"] = f"metadata_props['stride'] = {_short(props['stride'])} {where}"
    task = props.get("task", "").strip()
    if task in ULTRALYTICS_TASKS:
        found.task = ULTRALYTICS_TASKS[task]
        found.sources["task"] = f"metadata_props['task'] = {_short(task)} {where}"
    elif task:
        found.notes.append(
            f"metadata_props['task'] = {task[:40]!r} (Ultralytics) has no pipe task (pipe reads detect and classify); "
            "the task is chosen as for a model without metadata"
        )
    if task and task != "classify":  # every Ultralytics task but classify letterboxes its pictures
        found.letterbox = True
        found.sources["letterbox"] = f"Ultralytics {task} preprocessing: fit, pad {LETTERBOX_PAD}, scale 1/255, RGB"
    elif task == "classify":
        found.notes.append(
            "Ultralytics classify preprocessing (shorter side to imgsz, centre crop) is not recorded; "
            "record how pictures feed the model with --image-preprocessing"
        )


def _other_labels(props: dict[str, str], found: Found) -> None:
    """Labels from the Hugging Face and Paddle keys, when no earlier convention gave them."""
    for key, convention, parse in (("id2label", "Hugging Face", _id2label), ("character", "Paddle", _characters)):
        if key not in props:
            continue
        if found.labels is not None:
            found.notes.append(f"metadata_props[{key!r}] ignored: labels were read from {found.sources['labels']}")
            continue
        if (labels := _labels(props, key, found, parse)) is not None:
            found.labels, found.sources["labels"] = labels, f"metadata_props[{key!r}] ({convention})"
            found.convention = found.convention or convention


def _dictionary(props: dict[str, str], found: Found) -> None:
    """PaddleOCR's `character` as a recognizer's dictionary: every line, verbatim (an empty or a repeated line
    is a class of its own, where class names must be distinct and not empty); not when a line holds a
    control character, or past the bounds labels are read to."""
    text = props.get("character")
    if text is None or len(text) > MAX_PARSED or text.strip().startswith("["):
        return
    entries = _characters(text)
    if entries and len(entries) <= MAX_LABELS and not any(map(label_problem, entries)):
        found.dictionary = entries
        found.sources["dictionary"] = "metadata_props['character'] (Paddle)"


def _parsed(props: dict[str, str], key: str, found: Found, parse: Any) -> Any:
    """`parse(value)` of one key, or None with a note naming the key and why it was ignored."""
    value = props[key]
    if len(value) > MAX_PARSED:
        found.notes.append(f"metadata_props[{key!r}] ignored: {len(value):,} characters, over the {MAX_PARSED:,} read")
        return None
    try:
        return parse(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        found.notes.append(f"metadata_props[{key!r}] ignored: {why} (value {_short(value)})")
        return None


def _labels(props: dict[str, str], key: str, found: Found, parse: Any) -> list[str] | None:
    labels = _parsed(props, key, found, parse)
    if labels is None:
        return None
    problem = _label_problem(labels)
    if problem:
        found.notes.append(f"metadata_props[{key!r}] ignored: {problem}")
        return None
    return labels


def _label_problem(labels: list[str]) -> str | None:
    if not labels:
        return "it names no labels"
    if len(labels) > MAX_LABELS:
        return f"{len(labels):,} labels, over the {MAX_LABELS:,} read"
    for i, label in enumerate(labels):
        if not label or len(label) > MAX_LABEL:
            return f"label {i} ({_short(label)}) is empty or longer than {MAX_LABEL} characters"
        if problem := label_problem(label):
            return f"label {i}: {problem[:200]}"
    seen: set[str] = set()
    repeated = [x for x in labels if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
    if repeated:
        return f"labels repeat ({', '.join(map(repr, repeated[:3]))}); class names must be distinct"
    return None


def _ids_to_names(text: str) -> list[str]:
    """Ultralytics `names`: a dict literal {0: 'person', ...} (or a list literal) -> names in id order."""
    return _by_id(_literal(text), "{0: 'name', 1: 'name', ...}")


def _id2label(text: str) -> list[str]:
    """Hugging Face `id2label`: JSON {"0": "NEGATIVE", ...} (or a Python dict literal) -> names in id order."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = _literal(text)
    if isinstance(value, dict):
        value = {_int_key(k): v for k, v in value.items()}
    return _by_id(value, '{"0": "name", "1": "name", ...}')


def _characters(text: str) -> list[str]:
    """Paddle `character`: one label per line (a trailing line break allowed), or a list literal."""
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        return _by_id(_literal(stripped), "['a', 'b', ...]")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _literal(text: str) -> Any:
    """A Python literal read with ast.literal_eval (nothing is evaluated); its problem as one clean ValueError."""
    try:
        return ast.literal_eval(text.strip())
    except SyntaxError as exc:
        raise ValueError(f"not a valid literal ({exc.msg.split(';')[0]})") from None
    except (MemoryError, RecursionError):
        raise ValueError("not a literal pipe can read (nested too deep)") from None
    except ValueError as exc:
        if str(exc).startswith("malformed node"):
            raise ValueError("not a plain literal (strings, numbers, lists, dicts: nothing is run)") from None
        raise ValueError(str(exc).split(";")[0]) from None


def _int_key(key: Any) -> Any:
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    return key


def _by_id(value: Any, shape: str) -> list[str]:
    """Names in id order from a list of names, or a dict whose keys are exactly the ids 0..n-1."""
    if isinstance(value, list | tuple):
        if not all(isinstance(v, str) for v in value):
            raise ValueError(f"not a list of names, expected {shape}")
        return list(value)
    if not isinstance(value, dict):
        raise ValueError(f"a {type(value).__name__}, expected {shape}")
    if not all(type(k) is int for k in value) or sorted(value) != list(range(len(value))):
        raise ValueError(f"the ids are not 0..{len(value) - 1}, expected {shape}")
    if not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"a name is not a string, expected {shape}")
    return [value[i] for i in range(len(value))]


def _image_size(text: str) -> list[int]:
    """Ultralytics `imgsz`: "[640, 640]" (height, width) or one int for both."""
    value = _literal(text)
    sides = [value, value] if type(value) is int else list(value) if isinstance(value, list | tuple) else []
    if len(sides) == 1:
        sides *= 2
    if len(sides) != 2 or not all(type(s) is int and 0 < s <= MAX_SIDE for s in sides):
        raise ValueError(f"not [height, width] in pixels (1..{MAX_SIDE})")
    return sides


def _stride(text: str) -> int:
    value = _literal(text)
    if type(value) is not int or not 0 < value <= 1024:
        raise ValueError("not a stride in pixels (1..1024)")
    return value


def _key(key: str) -> str:
    return repr(key[:40])


def _short(value: str) -> str:
    return repr(value[:60]) + (f"... ({len(value):,} characters)" if len(value) > 60 else "")
