"""Rows of a table as people keep them, for a model trained on one: keyed JSON objects and CSV files.

A model trained on a CSV records its columns on the input (`TensorSpec.features`: names in input
order, and the categories of a string column, whose index the model takes). `pipe predict` then
takes what the server takes, `{"mean_radius": 17.99, "site": "left", ...}` or a list of such
objects, and also a CSV file with a header row (the training file itself works: the columns the
model does not take, its label and `data.exclude_columns`, are left out and named in a note).
Category names become their indices; a number for a categorical column is its index, as the
server reads it. Every problem is one InputError naming the row, the column and the fix.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.tensors import Feature, TensorSpec
from pipeline.core.errors import InputError

SHOWN = 10  # names quoted in an error before "..."


def table_input(specs: list[TensorSpec]) -> TensorSpec | None:
    """The model's one table input (a `[batch, F]` input with recorded columns), else None."""
    return specs[0] if len(specs) == 1 and specs[0].features else None


def is_keyed(data: Any, spec: TensorSpec) -> bool:
    """A column-keyed object (or a list of them), not `{input_name: ...}`."""
    first = data[0] if isinstance(data, list) and data else data
    return isinstance(first, dict) and set(first) != {spec.name}


def keyed_rows(data: Any, spec: TensorSpec, source: str) -> np.ndarray:
    """`{column: value}` or a list of them -> [n, F] float32 in the recorded column order."""
    features = spec.features or []
    names = [f.name for f in features]
    rows = data if isinstance(data, list) else [data]
    x = np.empty((len(rows), len(features)), dtype=np.float32)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"{source}: row {i} is a JSON {type(row).__name__}; give every row as an object "
                             f"keyed by column name ({_shown(names)})")  # fmt: skip
        missing, unknown = [n for n in names if n not in row], sorted(str(k) for k in row if k not in names)
        if missing or unknown:
            parts = [f"missing column(s) {missing[:SHOWN]}" if missing else "",
                     f"unknown column(s) {unknown[:SHOWN]}" if unknown else ""]  # fmt: skip
            raise InputError(f"{source}: row {i}: {'; '.join(p for p in parts if p)}; input {spec.name!r} takes "
                             f"the columns {_shown(names)}")  # fmt: skip
        x[i] = [_value(row[f.name], f, f"{source}: row {i}") for f in features]
    return x


def csv_rows(path: Path, spec: TensorSpec) -> tuple[np.ndarray, list[str]]:
    """A CSV with a header row -> [n, F] float32, and the header's columns the model does not take."""
    from pipeline.data.csvfile import SAMPLE_BYTES, sniff_delimiter

    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            delimiter = sniff_delimiter(f.read(SAMPLE_BYTES))
            f.seek(0)
            reader = csv.reader(f, delimiter=delimiter)
            lines = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name} is not UTF-8 text ({exc.reason}); save the CSV as UTF-8") from None
    except csv.Error as exc:
        raise InputError(f"{path.name} is not a readable CSV file ({exc})") from None
    features = spec.features or []
    names = [f.name for f in features]
    if len(lines) < 2:
        raise InputError(f"{path.name} needs a header row naming the columns ({_shown(names)}) and a row per sample")
    header = [h.strip() for h in lines[0][1]]
    if missing := [n for n in names if n not in header]:
        raise InputError(f"{path.name}: the header has no column(s) {missing[:SHOWN]}; input {spec.name!r} takes "
                         f"the columns {_shown(names)} (a header row names them)")  # fmt: skip
    x = np.empty((len(lines) - 1, len(features)), dtype=np.float32)
    for i, (line, row) in enumerate(lines[1:]):
        if len(row) != len(header):
            raise InputError(f"{path.name} line {line}: {len(row)} fields, the header has {len(header)}; fix the line")
        x[i] = [_cell(row[header.index(f.name)].strip(), f, f"{path.name} line {line}") for f in features]
    return x, [h for h in header if h not in names]


def _value(value: Any, feature: Feature, where: str) -> float:
    """A JSON value: a number, or for a categorical column a category name or its index."""
    if feature.categories:
        if isinstance(value, str):
            return _category(value, feature, where)
        if _number(value) and float(value).is_integer() and 0 <= value < len(feature.categories):
            return float(value)
        if feature.unknown_index is not None:
            return float(feature.unknown_index)
        raise InputError(f"{where}: column {feature.name!r} holds {value!r:.60}, not one of its categories "
                         f"{_shown(feature.categories)} (or their index 0..{len(feature.categories) - 1})")  # fmt: skip
    if not _number(value):
        raise InputError(f"{where}: column {feature.name!r} holds {value!r:.60}; it takes a number")
    return float(value)


def _cell(cell: str, feature: Feature, where: str) -> float:
    """A CSV cell: a category name for a categorical column, else a number."""
    if feature.categories:
        return _category(cell, feature, where)
    try:
        value = float(cell)
    except ValueError:
        raise InputError(f"{where}: column {feature.name!r} holds {cell!r:.60}; it takes a number") from None
    if not np.isfinite(value):
        raise InputError(f"{where}: column {feature.name!r} holds {cell!r}; give a finite number")
    return value


def _category(value: str, feature: Feature, where: str) -> float:
    categories = feature.categories or []
    for candidate in (value, value.strip()):
        if candidate in categories:
            return float(categories.index(candidate))
    if feature.unknown_index is not None:  # data.unseen_categories: unknown, the column adds nothing
        return float(feature.unknown_index)
    raise InputError(f"{where}: column {feature.name!r} holds {value!r:.60}, a category the model was not trained "
                     f"on; its categories are {_shown(categories)}")  # fmt: skip


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(names: list[str]) -> str:
    return str(names[:SHOWN])[:-1] + (", ...]" if len(names) > SHOWN else "]")
