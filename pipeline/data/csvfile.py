"""A CSV as people have it: the delimiter found from the file, string columns kept as categories.

`read_csv` turns a table with a header row into float32 features, one column each, and the label
column into class names. Rules a file must meet, each refused with one line naming the line and the
column and the fix:

- the delimiter is `,`, `;`, a tab or `|`: `csv.Sniffer` decides from the first 64 KiB, or the
  recipe's `data.delimiter` says. With `;`, a tab or `|` between fields, a decimal comma (`13,2`)
  reads as a number;
- no cell of a used column is empty (`NA`, `NaN`, `null`, `?` count as empty): fill or drop it;
- a feature column whose every value is text is categorical (and so is any column listed in
  `data.categorical_columns`): its sorted distinct values are the categories and each cell becomes
  its index, which the model one-hot encodes itself (`pipeline/train/zoo.py`, `OneHot`). A column
  that mixes numbers and text is refused at its first text cell, and so is a number written with
  thousands separators (`1,234.5`), which would otherwise become a category;
- a text column taken by default (no `data.feature_columns`) whose values are distinct on more than
  half the rows is an identifier (`patient_id`) or free text, not a category: one-hot encoded, it
  teaches the model nothing that carries to a new row, and every new row would be refused. It is
  refused with the fix, `data.exclude_columns` (or naming it in `data.categorical_columns` keeps it);
- each used column has a name of its own in the header;
- no line is longer than 16 Mi characters (`pipeline/data/lines.py`: read no further than that), and
  no cell longer than the csv module's field limit (131,072 characters).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.data.lines import MAX_LINE_CHARS, bounded_lines

DELIMITERS = (",", ";", "\t", "|")
SAMPLE_BYTES = 64 * 1024  # what the sniffer reads
MISSING = frozenset({"", "na", "n/a", "nan", "null", "none", "?"})  # lower-cased cells that mean "no value"
MAX_CATEGORIES = 1000  # more distinct strings than this is an identifier or free text, not a category
ID_MIN_ROWS = 20  # below this many rows, distinct values on most rows say nothing about a column
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the features are float32: a larger number would be inf
# a number with thousands grouped by ',', '.', a space or an apostrophe (1,234.5  1.234,5  1 234  12'345):
# text to float(), so without this check such a column would silently become categories
_GROUPED = re.compile(r"[-+]?\d{1,3}(?:([,. '\u00a0\u202f])\d{3})(?:\1\d{3})*(?:[.,]\d+)?")


@dataclass
class Table:
    """The features, the raw label values, and each feature column's name and categories."""

    x: np.ndarray  # [n, F] float32; a categorical column holds category indices 0..k-1
    labels: np.ndarray  # [n] label values as read (float64 when every one is a number, else str)
    features: list[dict[str, Any]]  # per column, in x's order: {"name"} or {"name", "categories": [...]}
    delimiter: str = ","  # what the fields were split on (found or given)
    excluded: list[str] = field(default_factory=list)  # header columns left out by data.exclude_columns


def read_csv(
    path: Path,
    label_column: str,
    feature_columns: list[str] | None = None,
    delimiter: str | None = None,
    categorical: list[str] | None = None,
    exclude: list[str] | None = None,
    max_line: int = MAX_LINE_CHARS,
) -> Table:
    """Read `path` (UTF-8, a header row) into features and labels; every problem is an InputError.

    `max_line`: the longest line read, in characters (a longer one is refused, not read whole).
    """
    delimiter, rows = _rows(path, delimiter, max_line)
    header, body = [h.strip() for h in rows[0][1]], rows[1:]
    shown = _shown(delimiter)
    exclude = exclude or []
    features = feature_columns or [h for h in header if h != label_column and h not in exclude]
    _check_header(path, header, label_column, features, categorical or [], exclude, shown)
    cells = _cells(path, header, body, [*features, label_column], shown)
    decimal_comma = delimiter != ","
    x = np.empty((len(body), len(features)), dtype=np.float32)
    described = []
    for j, name in enumerate(features):
        values, categories = _column(path, name, cells[name], decimal_comma, name in (categorical or []))
        if categories is not None and feature_columns is None and name not in (categorical or []):
            _refuse_identifier(path, name, cells[name], len(categories))
        x[:, j] = values
        described.append({"name": name, "categories": categories} if categories is not None else {"name": name})
    labels = np.array([cell for _, cell in cells[label_column]])
    try:
        labels = labels.astype(np.float64)  # numeric labels sort numerically
    except ValueError:
        pass
    return Table(x, labels, described, delimiter, [c for c in header if c in exclude])


def _rows(path: Path, delimiter: str | None, max_line: int) -> tuple[str, list[tuple[int, list[str]]]]:
    """The delimiter (given, or found from the file's start) and the non-blank rows with their line numbers,
    the header first; a file that is not UTF-8 text, not a CSV, or empty is refused."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
            delimiter = delimiter or sniff_delimiter(f.read(SAMPLE_BYTES))
            f.seek(0)
            reader = csv.reader(bounded_lines(f, path, max_line), delimiter=delimiter)
            rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]  # blank lines
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc}); save the CSV as UTF-8") from None
    except (csv.Error, OSError) as exc:
        raise InputError(f"{path} is not a readable CSV file ({exc}); data.path must name a text file") from None
    if not rows:
        raise InputError(f"{path} is empty; a CSV needs a header row and data rows")
    return delimiter, rows


def _check_header(
    path: Path,
    header: list[str],
    label_column: str,
    features: list[str],
    categorical: list[str],
    exclude: list[str],
    shown: str,
) -> None:
    """Refuse columns the data section names that the header lacks, names twice, or leaves unnamed, and a label
    column also used as a feature or excluded."""
    if label_column not in header:
        raise InputError(
            f"label column {label_column!r} is not in {path}; its columns are {header}. Set data.label_column "
            f"to one of them (columns split on {shown}: set data.delimiter if the file uses another)"
        )
    unknown = [c for c in [*features, *categorical, *exclude] if c not in header]
    if unknown:
        raise InputError(f"column(s) {unknown} named in data are not in {path}; its columns are {header}")
    if label_column in features:
        raise InputError(f"data.feature_columns includes the label column {label_column!r}; remove it")
    if label_column in exclude:
        raise InputError(f"data.exclude_columns includes the label column {label_column!r}; remove it")
    for name in [*features, label_column]:
        if header.count(name) > 1:  # the column read would be the first of them, the others silently lost
            raise InputError(
                f"{path}: the header names column {name!r} {header.count(name)} times; rename the copies "
                "so each column has its own name"
            )
    if "" in features:
        raise InputError(
            f"{path}: header column {header.index('') + 1} has no name; name it in the header, or list the "
            "columns to use in data.feature_columns"
        )


def _cells(
    path: Path, header: list[str], body: list[tuple[int, list[str]]], names: list[str], shown: str
) -> dict[str, list[tuple[int, str]]]:
    """Each named column's stripped cells with their line numbers; a file with no data rows, a row with another
    number of fields than the header, or an empty cell is refused."""
    if not body:
        raise InputError(f"{path} has a header but no data rows")
    for line, row in body:
        if len(row) != len(header):
            raise InputError(
                f"{path} line {line}: {len(row)} fields split on {shown}, the header has {len(header)}; "
                "fix the line (a field holding the delimiter must be quoted)"
            )
    cells = {name: [(line, row[header.index(name)].strip()) for line, row in body] for name in names}
    for name, column in cells.items():
        for line, cell in column:
            if cell.lower() in MISSING:
                raise InputError(
                    f"{path} line {line}: column {name!r} is empty ({cell!r}); fill it (e.g. with the column's "
                    "mean or most common value) or drop the row"
                )
    return cells


def sniff_delimiter(sample: str) -> str:
    """The delimiter of a CSV from its start: `csv.Sniffer` limited to DELIMITERS; `,` for one column."""
    lines = [line for line in sample.splitlines() if line.strip()]
    if len(sample) == SAMPLE_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the sample may end inside a line
    try:
        return csv.Sniffer().sniff("\n".join(lines), delimiters="".join(DELIMITERS)).delimiter
    except csv.Error:
        # the sniffer wants the same count of a character on every line; a header alone, or quoted fields
        # holding delimiters, defeat it: take the candidate the header line holds most of
        header = lines[0] if lines else ""
        counts = {d: header.count(d) for d in DELIMITERS}
        best = max(counts, key=lambda d: counts[d])
        return best if counts[best] else ","


def _column(
    path: Path, name: str, cells: list[tuple[int, str]], decimal_comma: bool, categorical: bool
) -> tuple[np.ndarray, list[str] | None]:
    """One feature column as float32: numbers, or category indices with the sorted categories."""
    numbers = [_number(cell, decimal_comma) for _, cell in cells]
    if not categorical and all(n is not None for n in numbers):
        for (line, cell), n in zip(cells, numbers, strict=True):
            if not math.isfinite(n):  # type: ignore[arg-type]
                raise InputError(
                    f"{path} line {line}: column {name!r} holds {cell!r}, not a finite number; "
                    "replace it with a real value or drop the row"
                )
            if abs(n) > FLOAT32_MAX:  # type: ignore[arg-type]
                raise InputError(
                    f"{path} line {line}: column {name!r} holds {cell!r}, beyond float32's range "
                    f"(±{FLOAT32_MAX:.3g}), which the model computes in; rescale the column or drop the row"
                )
        return np.asarray(numbers, dtype=np.float32), None
    texts = [c for c, n in zip(cells, numbers, strict=True) if n is None]
    if not categorical and (grouped := next((c for c in texts if _GROUPED.fullmatch(c[1])), None)):
        line, cell = grouped
        raise InputError(
            f"{path} line {line}: column {name!r} holds {cell!r}, a number written with thousands separators; "
            f"write the numbers without them, or list {name!r} in data.categorical_columns if these are codes"
        )
    if not categorical and any(n is not None for n in numbers):
        line, cell = next(c for c, n in zip(cells, numbers, strict=True) if n is None)
        raise InputError(
            f"{path} line {line}: column {name!r} holds {cell!r}, not a number, where other lines hold numbers; "
            f"fix the value, or list {name!r} in data.categorical_columns to treat every value as a category"
        )
    categories, index = np.unique(np.array([cell for _, cell in cells]), return_inverse=True)
    if len(categories) > MAX_CATEGORIES:
        raise InputError(
            f"{path}: column {name!r} holds {len(categories)} distinct strings, more than the {MAX_CATEGORIES} "
            "categories a one-hot input takes (an identifier or free text?); leave it out with "
            f"data.exclude_columns: [{name}]"
        )
    return index.astype(np.float32), [str(c) for c in categories]


def _refuse_identifier(path: Path, name: str, cells: list[tuple[int, str]], distinct: int) -> None:
    """Refuse a text column taken by default whose values are distinct on most rows: an ID, not a category."""
    rows = len(cells)
    if rows < ID_MIN_ROWS or distinct * 2 <= rows:
        return
    every = "a different value on every row" if distinct == rows else f"{distinct} distinct values in {rows} rows"
    example = ", ".join(repr(cell) for _, cell in cells[:2])
    raise InputError(
        f"{path}: column {name!r} holds {every} ({example}, ...): an identifier or free text, not a feature. "
        f"One-hot encoded it would teach the model nothing that carries to a new row, and a new value is refused "
        f"at serving. Leave it out with data.exclude_columns: [{name}] (or list the columns to use in "
        f"data.feature_columns; listing it in data.categorical_columns keeps it as categories)"
    )


def _number(cell: str, decimal_comma: bool) -> float | None:
    try:
        return float(cell)
    except ValueError:
        pass
    if decimal_comma and cell.count(",") == 1:
        try:
            return float(cell.replace(",", "."))
        except ValueError:
            return None
    return None


def _shown(delimiter: str) -> str:
    return {"\t": "tabs", ",": "','", ";": "';'", "|": "'|'"}.get(delimiter, repr(delimiter))
