"""What training read, said before it starts: rows, the delimiter, each column and its kind, the classes.

A user with their own CSV sees at once whether the file was read as they meant it (a column taken as
categories that should be numbers, a label column with a class of 3 rows) before minutes of training.

    data: cancer.csv, 569 rows, split on ','; 30 feature columns: 30 numeric (radius_mean, ...)
    ...
"""

from __future__ import annotations

import numpy as np

from pipeline.data.sources import RawData

SHOWN = 6  # names listed before "..."


def summarize(raw: RawData, source: str, task: str) -> list[str]:
    """Lines that describe `raw` as read from `source` (a path or a bundled set's name)."""
    delimiter = f", split on {_shown(raw.delimiter)}" if raw.delimiter else ""
    lines = [f"data: {source}, {len(raw.y)} rows{delimiter}, {raw.kind} {list(raw.x.shape[1:])}"]
    if raw.features:
        numeric = [f["name"] for f in raw.features if not f.get("categories")]
        categorical = [f for f in raw.features if f.get("categories")]
        lines.append(
            f"  {len(raw.features)} feature columns: {len(numeric)} numeric{_names(numeric)}, "
            f"{len(categorical)} categorical"
        )
        for feature in categorical:
            categories = feature["categories"]
            lines.append(f"    {feature['name']}: {len(categories)} categories{_names(categories)}")
    if raw.excluded:
        lines.append(f"  left out (data.exclude_columns): {', '.join(raw.excluded)}")
    if raw.kind == "lm":  # y: the next-token labels, -100 where the loss skips a token
        counted, real = int((raw.y >= 0).sum()), int(raw.mask.sum()) if raw.mask is not None else raw.y.size
        lines.append(f"  {(raw.text or {}).get('format')} rows: the loss on {counted} of {real} tokens")
    elif task == "regression":
        y = raw.y.astype(np.float64)
        lines.append(f"  target: mean {y.mean():.4g}, std {y.std():.4g}, from {y.min():.4g} to {y.max():.4g}")
    elif raw.labels:
        counts = np.bincount(raw.y, minlength=len(raw.labels))
        shares = ", ".join(f"{label} {n} ({n / len(raw.y):.0%})" for label, n in zip(raw.labels, counts, strict=True))
        if len(raw.labels) <= 20:
            lines.append(f"  classes: {len(raw.labels)}: {shares}")
        else:
            lines.append(f"  classes: {len(raw.labels)}, the smallest {counts.min()} rows, the largest {counts.max()}")
    return lines


def _names(names: list[str]) -> str:
    if not names:
        return ""
    return " (" + ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "") + ")"


def _shown(delimiter: str) -> str:
    return {"\t": "tabs", ",": "','", ";": "';'", "|": "'|'"}.get(delimiter, repr(delimiter))
