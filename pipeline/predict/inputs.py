"""An input file -> named arrays the model takes, checked against the manifest's input specs.

`.npz` (one array per input name; a single-input model also takes one unnamed array, `arr_0`),
`.json` (an object keyed by input name, or a bare list for a single-input model), images (see
`image.py`) and, for a model trained on a table, rows keyed by column name in `.json` and `.csv` (see
`table.py`). Values are fed as they are: no silent casts (an npz array of another dtype and a JSON
string, null or true where the model takes numbers are refused), and a file holding one sample
gets its batch dimension added. Every problem is one InputError naming the value and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError, first_line
from pipeline.predict.table import csv_rows, is_keyed, keyed_rows, table_input

if TYPE_CHECKING:
    from pipeline.runtime.images import Placement

UNNAMED = "arr_0"  # the key numpy.savez gives one array passed without a name
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SUFFIXES = (".npz", ".json", ".csv", *IMAGE_SUFFIXES)


def read_inputs(path: Path, manifest: Manifest, notes: list[str] | None = None) -> tuple[Arrays, Placement | None]:
    """The model's inputs from `path`, by its suffix, each with a leading batch axis and checked; and for a
    picture, where it lies in the model's input (None for arrays given in the model's own units). What
    the reader left out (a CSV's columns the model does not take) is said in `notes`."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(
            f"unsupported input file {path.name!r}; give one of {', '.join(SUFFIXES)} "
            "(.npz: one array per input name; .json: an object keyed by input name, or rows keyed by column "
            "name; .csv: a table's rows under a header; an image for an image model)"
        )
    if not path.is_file():
        raise InputError(f"input file {path} not found; pass an existing {suffix} file")
    specs, placement = manifest.inputs, None
    if suffix == ".npz":
        arrays = _npz(path, specs)
    elif suffix == ".json":
        arrays = _json(path, specs)
    elif suffix == ".csv":
        if (table := table_input(specs)) is None:
            raise InputError(f"{path.name}: a CSV feeds a model trained on a table (its input records its columns); "
                             f"this model takes {_describe(specs)}: give an .npz or .json")  # fmt: skip
        x, left_out = csv_rows(path, table)
        arrays = {table.name: x}
        if left_out and notes is not None:
            notes.append(f"{path.name}: column(s) the model does not take were left out: {', '.join(left_out)}")
    else:
        from pipeline.predict.image import image_input

        spec, array, placement = image_input(path, manifest)
        arrays = {spec.name: array}
    return check_inputs(arrays, specs, path.name), placement


def read_texts(root: Path, manifest: Manifest, texts: list[str]) -> Arrays:
    """Texts -> the model's token inputs, tokenized with the tokenizer the artifact carries (as `pipe serve`
    tokenizes them: cut to the recorded max length, padded to the longest), and checked."""
    from pipeline.runtime.text import TextEncoder

    encoder = TextEncoder.of(root, manifest)
    if encoder is None:
        raise InputError(
            "--text: this model carries no tokenizer, so it takes token ids only; give them with --input "
            "FILE.json, or import the model with --tokenizer DIR"
        )
    return check_inputs(encoder.encode(texts), manifest.inputs, "the texts")


def _npz(path: Path, specs: list[TensorSpec]) -> Arrays:
    from pipeline.data.sources import load_npz

    arrays = load_npz(path)
    if len(specs) == 1 and set(arrays) == {UNNAMED}:
        return {specs[0].name: arrays[UNNAMED]}
    return _named(arrays, specs, path.name, "save it with numpy.savez(FILE, **{name: array})")


def _json(path: Path, specs: list[TensorSpec]) -> Arrays:
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_not_a_number)
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path.name} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InputError(f"{path.name} nests lists too deeply to read; give each input as nested lists") from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        raise InputError(f"{path.name}: a number in it cannot be read ({first_line(exc, 120)}); give numbers the "
                         "model's dtype can hold") from None  # fmt: skip
    if (table := table_input(specs)) is not None and is_keyed(data, table):  # rows keyed by column name
        return {table.name: keyed_rows(data, table, path.name)}
    if isinstance(data, list):
        if len(specs) != 1:
            raise InputError(
                f"{path.name} holds a bare list, but the model takes {len(specs)} inputs "
                f"({_describe(specs)}); give an object keyed by input name"
            )
        data = {specs[0].name: data}
    if not isinstance(data, dict):
        raise InputError(
            f"{path.name} holds a JSON {type(data).__name__}; give an object keyed by input name "
            f"({_describe(specs)})" + (", or a bare list" if len(specs) == 1 else "")
        )
    values = _named(data, specs, path.name, 'give {"name": [...]} for each input')
    by_name = {spec.name: spec for spec in specs}
    return {name: json_array(value, by_name[name], path.name) for name, value in values.items()}


def _named(found: dict[str, Any], specs: list[TensorSpec], source: str, fix: str) -> dict[str, Any]:
    """`found` when its names are exactly the inputs', else one error naming what is missing or unknown."""
    names = [spec.name for spec in specs]
    missing = [n for n in names if n not in found]
    unknown = sorted(set(found) - set(names))
    if missing or unknown:
        parts = [f"no input(s) {missing}" if missing else "", f"unknown name(s) {unknown}" if unknown else ""]
        raise InputError(f"{source}: {'; '.join(p for p in parts if p)}; the model takes {_describe(specs)}: {fix}")
    return {n: found[n] for n in names}


def json_array(value: Any, spec: TensorSpec, source: str) -> np.ndarray:
    """JSON values (nested lists) -> an array of the spec's dtype, refusing anything that would be cast.

    numpy alone reads null as NaN and "1.5" as 1.5 for a float, true as 1, and truncates 1.5 to 1
    for an integer; here each of those is an error naming the element and its index.
    """
    shape, leaves = _shape_and_leaves(value, f"{source}: input {spec.name!r}")
    dtype = np.dtype(spec.dtype)
    accepts, expected = _ACCEPTS.get(dtype.kind, (None, f"{spec.dtype} (not readable from JSON)"))
    for i, leaf in enumerate(leaves):
        if accepts is None or not accepts(leaf):
            at = "".join(f"[{j}]" for j in np.unravel_index(i, shape)) if shape else ""
            raise InputError(
                f"{source}: input {spec.name!r}{at} is {json.dumps(leaf)[:40]}{_json_type(leaf)}; "
                f"{spec.name!r} is {spec.dtype}: give {expected}"
            )
    if dtype.kind in "OSU":
        array = np.empty(len(leaves), dtype=object)
        array[:] = leaves
        return array.reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if out := [v for v in leaves if not info.min <= v <= info.max]:
            raise InputError(
                f"{source}: input {spec.name!r} holds {out[0]}, outside {spec.dtype}'s {info.min}..{info.max}"
            )
    with np.errstate(over="ignore"):
        array = np.asarray(leaves, dtype=dtype).reshape(shape)
    if dtype.kind == "f" and not np.isfinite(array).all():
        raise InputError(f"{source}: input {spec.name!r} holds a number too large for {spec.dtype}")
    return array


def _not_a_number(constant: str) -> float:
    """JSON has no NaN or Infinity; Python's json reads them unless told otherwise."""
    raise InputError(f"{constant} is not a JSON number; give finite numbers (null, NaN and Infinity are refused)")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_ACCEPTS = {
    "f": (_number, "numbers (not strings, null or true/false)"),
    "i": (lambda v: isinstance(v, int) and not isinstance(v, bool), "integers (no fraction, not true/false)"),
    "u": (lambda v: isinstance(v, int) and not isinstance(v, bool), "integers (no fraction, not true/false)"),
    "b": (lambda v: isinstance(v, bool), "true/false"),
    "O": (lambda v: isinstance(v, str), "strings"),
    "U": (lambda v: isinstance(v, str), "strings"),
}


def _json_type(value: Any) -> str:
    """What a JSON value is, in parentheses, where its text does not say it (null speaks for itself)."""
    names = {bool: "a boolean", str: "a string", dict: "an object", int: "an integer", float: "a number"}
    return f" ({names[type(value)]})" if type(value) in names else ""


def _shape_and_leaves(value: Any, where: str) -> tuple[tuple[int, ...], list[Any]]:
    """The shape of nested lists and their values in order, refusing rows of different lengths."""
    if not isinstance(value, list):
        return (), [value]
    parts = [_shape_and_leaves(v, where) for v in value]
    shapes = {shape for shape, _ in parts}
    if len(shapes) > 1:
        raise InputError(
            f"{where}: nested lists of different shapes {sorted(shapes)[:3]}; every row must have the same length"
        )
    inner = shapes.pop() if shapes else ()
    return (len(value), *inner), [leaf for _, leaves in parts for leaf in leaves]


def check_inputs(arrays: Arrays, specs: list[TensorSpec], source: str) -> Arrays:
    """Each array of its spec's dtype and shape, one sample given a batch axis; batches must agree."""
    checked: Arrays = {}
    sizes: dict[str, tuple[int, str]] = {}  # symbolic dim name -> (size, the input that set it)
    for spec in specs:
        array = arrays[spec.name]
        if array.dtype != np.dtype(spec.dtype) and not (array.dtype.kind in "OU" and spec.dtype in ("str", "object")):
            raise InputError(
                f"{source}: input {spec.name!r} is {array.dtype}, the model takes {spec.dtype}; "
                f"save it as {spec.dtype} (array.astype('{spec.dtype}')) if that is what you mean"
            )
        if array.ndim == len(spec.shape) - 1:
            array = array[np.newaxis]  # one sample: the batch axis the model wants
        fixed = all(isinstance(d, str) or d == n for d, n in zip(spec.shape, array.shape, strict=False))
        if array.ndim != len(spec.shape) or not fixed:
            one = spec.shape[1:]
            raise InputError(
                f"{source}: input {spec.name!r} has shape {list(arrays[spec.name].shape)}, the model takes "
                f"{spec.shape}: give {one} for one sample or {['n', *one]} for n samples"
            )
        if array.shape[0] == 0:
            raise InputError(f"{source}: input {spec.name!r} holds no samples (shape {list(array.shape)})")
        for dim, size in zip(spec.shape, array.shape, strict=True):
            if isinstance(dim, str):
                seen, other = sizes.setdefault(dim, (size, spec.name))
                if seen != size:
                    raise InputError(
                        f"{source}: inputs {other!r} and {spec.name!r} disagree on {dim!r}: {seen} and {size}"
                    )
        checked[spec.name] = array
    return checked


def _describe(specs: list[TensorSpec]) -> str:
    return ", ".join(f"{s.name}: {s.dtype}{s.shape}" for s in specs)
