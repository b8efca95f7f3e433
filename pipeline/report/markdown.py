"""Markdown that renders: escaped table cells, tables with a header rule, numbers written once."""

from __future__ import annotations

import math
from collections.abc import Sequence


def cell(value: object) -> str:
    """One table cell: pipes escaped, line breaks folded, so no value can break the table."""
    text = "-" if value is None or value == "" else str(value)
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


def code(value: object) -> str:
    """Inline code; backticks inside the value are swapped for quotes so the span cannot end early."""
    return f"`{str(value).replace('`', chr(39))}`"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured Markdown table, one line per row."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def number(value: object, digits: int = 4) -> str:
    """A figure as a person reads it: 4 significant digits, '-' when absent, NaN spelled out."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return f"{value:.{digits}g}"


def size(n: object) -> str:
    """Bytes in the largest unit that keeps the number above 1."""
    if not isinstance(n, int) or isinstance(n, bool):
        return number(n)
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def shape(dims: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
