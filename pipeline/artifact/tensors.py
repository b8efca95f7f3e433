"""A model input or output as the outside world sees it (`TensorSpec`), and what one carries.

`TensorSpec` holds a tensor's name, dtype, shape with symbolic dims, layout and preprocessing; a
feature input (`[batch, F]`) also its columns (`Feature`), a token input what its values are
(`TokenInput`: role, vocabulary, longest sequence, padding value; the rest of token models is
pipeline/artifact/tokens.py). Below the manifest, the image record (preprocessing.py) and the
token limits (tokens.py), which all read specs. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.artifact.checks import one_of, positive, unprintable

DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "object", "str",
)  # fmt: skip
LAYOUTS = ("NC", "NCHW", "NHWC", "NT")
ROLES = ("ids", "mask", "type_ids")
Role = Literal["ids", "mask", "type_ids"]


def tensor_name_problem(name: str) -> str | None:
    """Why `name` cannot name a model input or output, or None: names go into shell lines, config.pbtxt and
    reports, quoted there, and must stay one line of printable text to be quoted safely."""
    if not name:
        return "a tensor name is empty"
    if bad := unprintable(name):
        return f"tensor name {name!r} holds {bad}: names are one line of printable text"
    return None


def _check_shape(shape: list[int | str]) -> str | None:
    bad = [d for d in shape if (isinstance(d, int) and d < 0) or (isinstance(d, str) and not d)]
    return f"dims must be sizes >= 0 or non-empty names, got {bad[:3]}" if bad else None


def _check_axis(axis: int | None) -> str | None:
    return None if axis is None or axis >= 0 else f"expected an axis >= 0, got {axis}"


def _check_categories(categories: list[str] | None) -> str | None:
    if categories is None:
        return None
    if not categories:
        return "a categorical column has at least one category"
    return "categories must be distinct" if len(set(categories)) != len(categories) else None


@dataclass(frozen=True)
class Feature:
    """One column of a feature input (`[batch, F]`), in input order: what a client may key a value by."""

    name: str  # the column's name in the training data (a CSV header, a bundled set's feature name)
    # a categorical column: the input holds the category's index here (categories[i] is sent as i)
    categories: list[str] | None = field(default=None, metadata={"omit_none": True, "check": _check_categories})
    # set by `data.unseen_categories: unknown`: a value outside `categories` is sent as this index
    # (len(categories)), which the model one-hot encodes as all zeros: the column then adds nothing
    unknown_index: int | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class TokenInput:
    """What an integer input of a token model accepts (training and import record it)."""

    vocab_size: int = field(metadata={"check": positive})  # valid values are 0 .. vocab_size - 1
    max_length: int | None = field(default=None, metadata={"check": positive})  # longest sequence; None: any
    padding_id: int | None = None  # the value that fills a short row; None: not known
    role: Role = "ids"  # ids: token ids; mask: the attention mask (1 real, 0 padding); type_ids: token types


@dataclass
class TensorSpec:
    """One model input or output as the outside world sees it."""

    name: str = field(metadata={"check": tensor_name_problem})
    dtype: str = field(metadata={"check": one_of(DTYPES)})  # numpy dtype name: "float32", "int64", ...
    shape: list[int | str] = field(metadata={"check": _check_shape})  # symbolic dims are names: ["batch", 64]
    layout: str = field(default="NC", metadata={"check": one_of(LAYOUTS)})  # NC, NCHW / NHWC, NT (tokens)
    preprocessing: dict[str, Any] = field(default_factory=dict)  # e.g. {"mean": [...], "std": [...]}
    features: list[Feature] | None = field(default=None, metadata={"omit_none": True})  # [batch, F]: F columns
    tokens: TokenInput | None = field(default=None, metadata={"omit_none": True})  # token-id inputs only
    # the axis that holds the samples when it is not the first (Silero VAD's state [2, batch, 128]: 1);
    # pipe's own arrays (golden.npz, evaluation splits) lead with the samples and are moved to it at the
    # runtime's door (pipeline/runtime/sample_axes.py); None: axis 0
    batch_axis: int | None = field(default=None, metadata={"omit_none": True, "check": _check_axis})

    @property
    def sample_axis(self) -> int:
        """The axis of this tensor that holds the samples (0 unless `batch_axis` says otherwise)."""
        return self.batch_axis or 0


def _check_value(value: Any) -> str | None:
    flat = value
    while isinstance(flat, list):
        if not flat:
            return None
        flat = flat[0]
    if isinstance(flat, int | float | bool):
        return None
    return f"expected a number or nested lists of numbers, got {value!r:.60}"


@dataclass(frozen=True)
class PinnedInput:
    """A graph input given one value at import (`--input-value sr=16000`) and written into model.onnx as
    a constant: no hop and no client feeds it; the server accepts it only with this value."""

    name: str = field(metadata={"check": tensor_name_problem})
    dtype: str = field(metadata={"check": one_of(DTYPES)})
    shape: list[int]  # the value's dims ([] for a scalar)
    value: Any = field(metadata={"check": _check_value})  # the value as JSON: a number, or nested lists
