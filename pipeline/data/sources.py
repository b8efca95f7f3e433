"""Data sources: each reads one kind of input into the same shape, a `RawData`.

A source returns every sample at once (these datasets fit in memory many times over) as numpy
arrays: float32 features `[n, F]`, float32 images `[n, C, H, W]` in 0..1 or raw pixel units, or
int64 token ids `[n, T]` with 0 as padding; and int64 class indices `[n]` with their label names.
Every problem with a file is an InputError that names the file, what was found, and the fix.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.manifest import label_problem
from pipeline.core.errors import InputError
from pipeline.data.csvfile import read_csv
from pipeline.data.text import TextBase
from pipeline.recipe.schema import BUILTIN_DATASETS, REGRESSION_DATASETS, Recipe
from pipeline.runtime.images import digits_record

KINDS = ("features", "image", "tokens", "text", "lm")  # lm: a causal LM's rows, y its labels [n, T]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class RawData:
    """All samples of a dataset before splitting."""

    x: np.ndarray  # [n, F] float32 | [n, C, H, W] float32 | [n, T] int64 tokens (0 = padding; text: padding_id)
    y: np.ndarray  # [n] int64 class index
    labels: list[str]  # class names; y indexes into this list
    kind: str  # one of KINDS
    # images: how a 0..255 picture becomes a sample in these units (pipeline/runtime/images.py's image record:
    # mode, size, resize, scale); None when the source does not say (an npz of arrays)
    image: dict[str, Any] | None = None
    # csv: each feature column's name, in x's order, and a categorical column's categories (x holds the index)
    features: list[dict[str, Any]] | None = None
    delimiter: str | None = None  # csv: what the fields were split on
    excluded: list[str] | None = None  # csv: the columns data.exclude_columns left out
    # text: the tokenizer's attention mask [n, T] (1 real token, 0 padding) and its limits (pipeline/data/text.py)
    mask: np.ndarray | None = None
    text: dict[str, Any] | None = None  # {"padding_id", "vocab_size", "max_length"}; lm: "format" too
    base: TextBase | None = None  # text: the tokenizer and the model directory's digest as the texts were tokenized


def read_source(recipe: Recipe) -> RawData:
    """Read the dataset the recipe names, checking what the recipe asks of it."""
    data = recipe.data
    if data.source in BUILTIN_DATASETS:
        raw = _builtin(data.source, data.as_image)
    else:
        path = recipe.data_path() or Path(".")  # the recipe schema requires data.path for file sources
        if not path.exists():
            raise InputError(
                f"data file {path} does not exist (data.path: {data.path!r}, relative to the recipe's "
                f"folder {recipe.base_dir}); fix data.path or create the file"
            )
        readers = {"csv": _csv, "npz": _npz, "images": _images, "tokens": _tokens, "text": _text}
        raw = readers[data.source](path, recipe)
    _check(raw, str(recipe.data_path() or data.source), recipe.task)
    return raw


def _builtin(name: str, as_image: bool) -> RawData:
    """sklearn's bundled datasets: shipped with the package, never downloaded."""
    from sklearn import datasets

    bunch = getattr(datasets, f"load_{name}")()
    x = np.asarray(bunch.data, dtype=np.float32)
    if name in REGRESSION_DATASETS:  # a number per sample (diabetes: disease progression a year on), no classes
        features = [{"name": str(n)} for n in bunch.feature_names]
        return RawData(x, np.asarray(bunch.target, dtype=np.float32), [], "features", features=features)
    if name == "digits" and as_image:
        x = x.reshape(-1, 1, 8, 8)  # 8x8 grey images, one channel, values 0..16
    labels = [str(t) for t in bunch.target_names]
    image = digits_record() if x.ndim == 4 else None  # a picture's 0..255 maps onto 0..16
    features = None if x.ndim == 4 else [{"name": str(n)} for n in bunch.feature_names]
    kind = "image" if x.ndim == 4 else "features"
    return RawData(x, np.asarray(bunch.target, dtype=np.int64), labels, kind, image, features)


def _classes(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Map raw label values (numbers or strings) to class indices 0..k-1, sorted by value."""
    classes, index = np.unique(values, return_inverse=True)
    return index.astype(np.int64), [_label_name(c) for c in classes]


def _targets(values: np.ndarray, task: str, where: str) -> tuple[np.ndarray, list[str]]:
    """Class indices and names for a classifier; float32 values and no names for regression."""
    if task != "regression":
        return _classes(values)
    try:
        y = values.astype(np.float64)
    except ValueError:
        bad = next(v for v in values.tolist() if not _is_number(v))
        raise InputError(
            f"{where} holds {bad!r}, not a number; a regression target must be numeric in every row "
            "(or set task: classification to predict it as a class)"
        ) from None
    if not np.isfinite(y).all():
        raise InputError(f"{where}: regression targets hold NaN or infinite values; clean or drop those rows")
    return y.astype(np.float32), []


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _npz_targets(arrays: dict[str, np.ndarray], path: Path, task: str) -> tuple[np.ndarray, list[str]]:
    """The `y` array as class indices (with `labels` names if given) or, for regression, as numbers."""
    y = arrays["y"].reshape(-1)
    return _targets(y, task, f"{path}: y") if task == "regression" else _npz_labels(arrays, y, path)


def _label_name(value: object) -> str:
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _csv(path: Path, recipe: Recipe) -> RawData:
    """A CSV with a header row: feature columns (numbers or categories) and one label column."""
    spec = recipe.data
    table = read_csv(
        path, spec.label_column or "", spec.feature_columns, spec.delimiter, spec.categorical_columns,
        spec.exclude_columns,
    )  # fmt: skip
    y, labels = _targets(table.labels, recipe.task, f"{path} column {spec.label_column!r}")
    if spec.unseen_categories == "unknown":  # the index past the last category: one-hot all zeros
        table.features = [{**f, "unknown_index": len(f["categories"])} if f.get("categories") else f
                          for f in table.features]  # fmt: skip
    return RawData(table.x, y, labels, "features", features=table.features, delimiter=table.delimiter,
                   excluded=table.excluded)  # fmt: skip


def load_npz(path: Path, required: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Every array in an .npz (no pickles), refusing an unreadable file and missing or empty `required` keys."""
    try:
        # opened here, not by np.load, which leaves its own handle open when the zip cannot be read
        with open(path, "rb") as handle:
            loaded = np.load(handle, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):  # a lone .npy array has no names to find inputs by
                raise InputError(
                    f"{path} holds a single unnamed array (.npy), not an .npz of named arrays; "
                    "write it with numpy.savez(path, name=array, ...)"
                )
            with loaded as f:
                for k in f.files:
                    _refuse_inflated(f.zip, f"{k}.npy", path)
                arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        # a truncated or corrupt file: zipfile's BadZipFile (also a bad CRC), zlib's error, EOFError when empty
        why = str(exc) or type(exc).__name__
        raise InputError(f"{path} is not a readable .npz file ({why}); write it with numpy.savez") from None
    missing = [k for k in required if k not in arrays]
    if missing:
        raise InputError(f"{path} lacks array(s) {missing}; it holds {sorted(arrays)}. Save it with keys {required}")
    empty = [k for k in required if arrays[k].size == 0]
    if empty:
        raise InputError(f"{path}: array(s) {empty} hold no samples; save the data into them")
    return arrays


def _refuse_inflated(archive: zipfile.ZipFile, member: str, path: Path) -> None:
    """Refuse an array whose header claims more bytes than its member holds (a header that says
    (1e9, 1, 8, 8) made numpy allocate 238 GiB before reading a byte)."""
    try:
        info = archive.getinfo(member)
    except KeyError:
        return  # a member not named NAME.npy: numpy reports it itself
    with archive.open(info) as stream:
        major, _ = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)  # the header numpy itself reads next
        stored = info.file_size - stream.tell()
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if dtype.hasobject or claimed > stored:
        raise InputError(
            f"{path}: array {member.removesuffix('.npy')!r} claims shape {tuple(shape)} of {dtype} ({claimed:,} bytes) "
            f"but holds {max(stored, 0):,} bytes; the file is corrupt or forged: write it again with numpy.savez"
        )


def _npz_labels(arrays: dict[str, np.ndarray], y: np.ndarray, path: Path) -> tuple[np.ndarray, list[str]]:
    """Integer targets 0..k-1 with optional `labels` names; anything else is mapped to classes."""
    if "labels" in arrays:
        labels = [str(v) for v in arrays["labels"]]
        if y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= len(labels):
            raise InputError(f"{path}: y must hold class indices 0..{len(labels) - 1} to match its `labels` array")
        return y.astype(np.int64), labels
    return _classes(y)


def _npz(path: Path, recipe: Recipe) -> RawData:
    """Arrays X ([n, F] features or [n, C, H, W] images) and y ([n] labels)."""
    arrays = load_npz(path, ("X", "y"))
    x = arrays["X"]
    if x.dtype.kind not in "fiub" or x.ndim not in (2, 4):
        raise InputError(
            f"{path}: X has dtype {x.dtype} and shape {list(x.shape)}; it must be numeric, [n, features] "
            "or [n, channels, height, width]"
        )
    y, labels = _npz_targets(arrays, path, recipe.task)
    return RawData(x.astype(np.float32), y, labels, "image" if x.ndim == 4 else "features")


def _images(path: Path, recipe: Recipe) -> RawData:
    """A folder with one subfolder per class, images inside; resized to data.image_size, RGB, 0..1."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_dir():
        raise InputError(f"{path} is not a folder; source 'images' needs a folder with one subfolder per class")
    classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not _hidden(p))  # not .ipynb_checkpoints
    if len(classes) < 2:
        raise InputError(f"{path} has {len(classes)} class subfolder(s); an image classifier needs at least 2")
    size = recipe.data.image_size
    images, targets = [], []
    for index, name in enumerate(classes):
        files = sorted(p for p in (path / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not _hidden(p))
        if not files:
            raise InputError(f"class folder {path / name} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        for file in files:
            try:
                with Image.open(file) as img:
                    rgb = img.convert("RGB")
            except (UnidentifiedImageError, OSError) as exc:
                raise InputError(f"{file} is not a readable image ({exc}); remove or replace it") from None
            if size is not None:
                rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            images.append(np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 255.0)  # HWC -> CHW
            targets.append(index)
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise InputError(
            f"images under {path} have different sizes {sorted(s[1:] for s in shapes)[:4]}; "
            "set data.image_size: [height, width] to resize them"
        )
    height, width = images[0].shape[1:]
    image = {"mode": "RGB", "size": [height, width], "resize": "bilinear", "scale": 1 / 255}  # as read above
    return RawData(np.stack(images), np.asarray(targets, dtype=np.int64), classes, "image", image)


def _hidden(path: Path) -> bool:
    """Dot files and folders: editor and OS leftovers (.ipynb_checkpoints, macOS ._name.png), not data."""
    return path.name.startswith(".")


def _tokens(path: Path, recipe: Recipe) -> RawData:
    """Arrays `tokens` ([n, T] integer ids, 0 = padding) and `y` ([n] labels), optional `labels`."""
    arrays = load_npz(path, ("tokens", "y"))
    tokens = arrays["tokens"]
    if tokens.dtype.kind not in "iu" or tokens.ndim != 2:
        raise InputError(
            f"{path}: tokens has dtype {tokens.dtype} and shape {list(tokens.shape)}; it must be integer "
            "ids shaped [n, sequence] (0 = padding)"
        )
    if tokens.min() < 0:
        raise InputError(f"{path}: tokens holds negative ids (min {tokens.min()}); ids start at 0 (padding)")
    y, labels = _npz_targets(arrays, path, recipe.task)
    return RawData(tokens.astype(np.int64), y, labels, "tokens")


def _text(path: Path, recipe: Recipe) -> RawData:
    """Texts and labels from a .csv or .jsonl file, tokenized with the model directory's tokenizer."""
    from pipeline.data.text import DEFAULT_LABEL_COLUMN, DEFAULT_TEXT_COLUMN, read_texts, tokenize

    spec = recipe.data
    if recipe.task == "text-generation":
        return _lm(path, recipe)
    texts, labels = read_texts(path, spec.text_column or DEFAULT_TEXT_COLUMN, spec.label_column or DEFAULT_LABEL_COLUMN)
    model_dir = recipe.model_dir()
    if model_dir is None or not model_dir.is_dir():
        raise InputError(
            f"source 'text' is tokenized with the model directory's tokenizer, and {model_dir} is not a directory "
            "(model.path, relative to the recipe's folder); point model.path at a save_pretrained directory"
        )
    tokens = tokenize(texts, model_dir, spec.max_length)
    y, names = _classes(np.asarray(labels))
    limits = {"padding_id": tokens.padding_id, "vocab_size": tokens.vocab_size, "max_length": tokens.max_length}
    return RawData(tokens.ids, y, names, "text", mask=tokens.mask, text=limits, base=tokens.base)


def _lm(path: Path, recipe: Recipe) -> RawData:
    """A causal LM's rows (pipeline/data/lm_tokens.py): ids and mask, and as y the labels [n, T] (IGNORE where
    the loss skips a token: instruction data's prompts, padding)."""
    from pipeline.artifact.generation import read_generation
    from pipeline.artifact.tokens import hf_limits, read_tokenizer
    from pipeline.data.lm_tokens import lm_rows
    from pipeline.data.text import TextBase, base_digest

    model_dir = recipe.model_dir()
    if model_dir is None or not model_dir.is_dir():
        raise InputError(
            f"task text-generation trains the causal LM in model.path, and {model_dir} is not a directory; point "
            "model.path at a directory with config.json and a tokenizer (and weights, to fine-tune)"
        )
    rows, fmt = lm_rows(path, recipe.data.format, model_dir, recipe.data.max_length)
    source = read_tokenizer(model_dir)
    limits = hf_limits(model_dir, ["input_ids", "attention_mask"], source)
    if rows.ids.max() >= limits.vocab_size:
        raise InputError(
            f"{model_dir}: the tokenizer made id {int(rows.ids.max())} but the model embeds {limits.vocab_size} ids "
            "(config.json vocab_size): the tokenizer is not the model's"
        )
    text = {"vocab_size": limits.vocab_size, "max_length": limits.max_length or rows.ids.shape[1], "format": fmt}
    eos = read_generation(model_dir).eos_token_ids  # refused here, before training, when the model names none
    text["padding_id"] = limits.padding_id if limits.padding_id is not None else eos[0]  # transformers' choice
    base = TextBase(source, base_digest(model_dir, source.contents))  # what LoRA builds on, as it was read
    return RawData(rows.ids, rows.labels, [], "lm", mask=rows.mask, text=text, base=base)


def _check(raw: RawData, source: str, task: str) -> None:
    if len(raw.x) != len(raw.y):
        raise InputError(f"{source}: {len(raw.x)} samples but {len(raw.y)} labels; they must match one to one")
    if raw.x.dtype.kind == "f" and not np.isfinite(raw.x).all():
        raise InputError(f"{source}: features hold NaN or infinite values; clean or impute them first")
    if task == "classification" and len(raw.labels) < 2:
        raise InputError(f"{source}: only {len(raw.labels)} class found ({raw.labels}); a classifier needs 2 or more")
    # The manifest refuses these class names: refused here, before a version is trained that no later stage opens
    if problem := next(filter(None, map(label_problem, raw.labels)), None):
        raise InputError(f"{source}: {problem}; fix the label in the data")
    if len(set(raw.labels)) != len(raw.labels):
        repeated = sorted({n for n in raw.labels if raw.labels.count(n) > 1})
        raise InputError(f"{source}: class names {repeated[:5]} are given more than once; each class needs its own")
