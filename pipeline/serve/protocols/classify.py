"""Classifier outputs as clients ask for them: top-k class strings, label/score pairs, probabilities.

- `top_classes`: Triton's classification extension (`"parameters": {"classification": k}` on a
  requested output): a BYTES tensor [batch, k] of "score:index[:label]" strings, highest first.
  The score is written as Triton writes it (C++ `std::to_string`: `%f` for floats, `%d` for
  integers); a request for more classes than the output holds gets them all, as in Triton.
- `label_scores`: TF Serving's `:classify` results, `[[label, score], ...]` per example.
- `softmax`: the probabilities a request asks for (`"probabilities": true`) instead of the raw
  scores (logits) the model returns; never applied unless asked.

Each row's classes are the output's elements after the batch dim (dim 0), flattened; labels (the
manifest's class names) are used when there is one per class.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.datatypes import IOSpec

SCORED = ("FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
FLOATS = ("FP16", "FP32", "FP64")


def check_scores(spec: IOSpec, classify: bool, probabilities: bool) -> None:
    """A 400 before the model runs when the output's datatype cannot be ranked or normalized."""
    if classify and len(spec.shape) > 2:
        raise RequestError(
            f"output {spec.name!r} is {spec.datatype}{list(spec.shape)}: one prediction per position, not one "
            "[batch, classes] row per sample; classifying it would rank positions x classes as one row: ask for "
            "the output without classification (a text recognizer answers its text then)"
        )
    if classify and spec.datatype not in SCORED:
        raise RequestError(
            f"output {spec.name!r} is {spec.datatype}; classification ranks numeric scores ({', '.join(SCORED)})"
        )
    if probabilities and spec.datatype not in FLOATS:
        raise RequestError(
            f"output {spec.name!r} is {spec.datatype}; probabilities are a softmax of float scores "
            f"({', '.join(FLOATS)}): leave 'probabilities' out for this output"
        )


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, computed in float64 and returned in the scores' dtype."""
    wide = scores.astype(np.float64)
    wide = np.exp(wide - wide.max(axis=-1, keepdims=True))
    return (wide / wide.sum(axis=-1, keepdims=True)).astype(scores.dtype)


def top_classes(scores: np.ndarray, count: int, labels: tuple[str, ...]) -> np.ndarray:
    """The `count` highest classes of each row as "score:index[:label]" strings: [batch, k] ([k] for a
    1-D output). Ties keep the lower index first."""
    rows = _rows(scores)
    k = min(count, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :k]
    names = labels if len(labels) == rows.shape[1] else ()
    text = "{:f}" if rows.dtype.kind == "f" else "{:d}"
    strings = np.empty(order.shape, dtype=object)
    for r, row in enumerate(order):
        for j, index in enumerate(row.tolist()):
            entry = f"{text.format(rows[r, index].item())}:{index}"
            strings[r, j] = f"{entry}:{names[index]}" if names else entry
    return strings if scores.ndim > 1 else strings[0]


def label_scores(scores: np.ndarray, labels: tuple[str, ...]) -> list[list[list[Any]]]:
    """TF Serving's classify results: per example, `[label, score]` for every class in the model's order
    (the label is "" where the model has no class names, as in TF Serving)."""
    rows = _rows(scores)
    names = labels if len(labels) == rows.shape[1] else ("",) * rows.shape[1]
    return [[[name, score] for name, score in zip(names, row, strict=True)] for row in rows.astype(float).tolist()]


def _rows(scores: np.ndarray) -> np.ndarray:
    classes = scores.shape[1:] if scores.ndim > 1 else scores.shape
    if scores.ndim == 0 or 0 in classes:
        raise RequestError(f"an output of shape {list(scores.shape)} has no classes to rank")
    # the class count is explicit: -1 cannot be inferred for a batch of 0 rows
    return scores.reshape(1 if scores.ndim == 1 else scores.shape[0], math.prod(classes))
