"""JSON values -> typed numpy arrays, strictly: a value that does not fit the datatype is refused.

numpy alone converts too much: `null` becomes NaN for a float dtype, "1.5" becomes 1.5, true
becomes 1, 1.5 is truncated to 1 for an integer dtype, 300 wraps for INT8 and 1e39 becomes inf
for FP32. Every one of those would be answered 200 with a wrong result, so each is a ValueError
here naming the element's position (`[0, 3]`) and the value; the protocols turn it into a 400.

The check is numpy's own: the values are read once with numpy's type discovery (numbers come back
as a float64/int64 array, a string makes it a string array, `null` an object array) and ranges are
checked on that array, vectorized. Only `true`/`false` mixed among numbers hide in a number array,
and only as a 1 or a 0; the leaf types are gathered for them (one innermost list at a time,
`set(map(type, row))` in C) only when the array holds a 1 or a 0 (one vectorized comparison, ~2 us
for 784 values) and the request's text, where the caller has it, holds a `true` or `false` (a byte
search, ~1 us per KB: so it runs second). The walk that finds the offending element's position
runs only for a request already refused.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np

from pipeline.serve.protocols.datatypes import v2_datatype

MAX_DEPTH = 32  # deeper nesting than any tensor rank the protocols accept
_WHITESPACE = re.compile(rb"[ \t\r\n]+")
_URL_SAFE = bytes.maketrans(b"-_", b"+/")
_TAKES = {"b": (bool,), "i": (int, float), "u": (int, float), "f": (int, float), "O": (str,)}  # dtype kind -> leaves
_FOUND = {"b": "b", "i": "iuf", "u": "iuf", "f": "iuf"}  # dtype kind -> numpy's discovered kinds that can fit
_EXPECTED = {"b": "true or false", "i": "integers", "u": "integers", "f": "numbers", "O": "strings"}


def json_array(data: Any, dtype: np.dtype, text: bytes | None = None) -> np.ndarray:
    """JSON `data` (a value or nested lists) -> an array of `dtype` shaped like it, or ValueError.

    BOOL takes only true/false; integer datatypes take integers (a float without a fraction, 3.0,
    is read as 3) within the datatype's range; float datatypes take numbers within the datatype's
    range; BYTES takes strings, stored as UTF-8 bytes like binary BYTES data. `text`, the JSON text
    `data` was parsed from, lets a number array with 1s or 0s skip looking for booleans among them
    when the text holds no `true`/`false`.
    """
    kind = dtype.kind
    if kind == "O":
        _check_types(data, dtype)
        strings = _asarray(data, object)
        if not all(type(x) is str for x in strings.flat):  # numpy keeps ragged rows as list elements
            raise ValueError("the nested lists are ragged: rows hold different numbers of values")
        encoded = np.empty(strings.shape, dtype=object)
        encoded.flat[:] = [x.encode() for x in strings.flat]
        return encoded
    found = _asarray(data, None)  # numpy's type discovery: float64 / int64 / uint64 for numbers
    if found.dtype.kind not in _FOUND[kind] or (kind != "b" and _may_hide_bools(found, text)):
        _check_types(data, dtype)  # names a null, string or boolean; passes numbers numpy kept as objects
    if kind == "b":
        return found
    if kind == "f":
        return _floats(data, found, dtype)
    return _integers(data, found, dtype)


def decode_base64(text: str | bytes) -> bytes:
    """Base64 text -> bytes, as TF Serving reads it: the standard or the URL-safe alphabet, wrapped
    in lines (MIME's 76 columns, PEM's 64) or not, padded or not. Any other character is a ValueError
    (binascii.Error): a JSON string that only looks like base64 is never half-read.
    """
    raw = text.encode("ascii", errors="replace") if isinstance(text, str) else text
    compact = _WHITESPACE.sub(b"", raw)
    if b"-" in compact or b"_" in compact:
        compact = compact.translate(_URL_SAFE)
    return base64.b64decode(compact + b"=" * (-len(compact) % 4), validate=True)


def _may_hide_bools(found: np.ndarray, text: bytes | None) -> bool:
    """Whether true/false could hide in numpy's number array: only as a 1 or a 0 there, and only if
    the JSON text (when known) holds one."""
    if not ((found == 0).any() or (found == 1).any()):
        return False
    return text is None or b"true" in text or b"false" in text


def _floats(data: Any, found: np.ndarray, dtype: np.dtype) -> np.ndarray:
    limit = float(np.finfo(dtype).max)
    # kind "O": an integer too large for int64/uint64, kept as a Python int; the range is checked
    # before the cast, which makes an out-of-range value inf
    if found.dtype.kind == "O" or (found.size and (found.min() < -limit or found.max() > limit)):
        _refuse(data, lambda x: abs(x) > limit, f"out of range for {v2_datatype(dtype)} (at most {limit:.4g})")
    return found.astype(dtype)


def _integers(data: Any, found: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    low, high, rule = info.min, info.max, f"out of range for {v2_datatype(dtype)} [{info.min}, {info.max}]"
    if found.dtype.kind == "f":  # 3.0 is an integer; 3.5 is not, and a cast would truncate it silently
        if (found != np.trunc(found)).any():
            _refuse(data, lambda x: isinstance(x, float) and not x.is_integer(), f"{v2_datatype(dtype)} takes integers")
        if low < -(2**53) or high > 2**53:  # read through float64: exact only up to 2**53
            low, high = max(low, -(2**53)), min(high, 2**53)
            rule += ", and within +-2**53 when floats are sent (send larger ids as integers)"
    if found.dtype.kind == "O" or (found.size and (found.min() < low or found.max() > high)):
        _refuse(data, lambda x: not low <= x <= high, rule)
    return found.astype(dtype)


def _check_types(data: Any, dtype: np.dtype) -> None:
    allowed = _TAKES[dtype.kind]
    if not _leaf_types(data, 0) <= set(allowed):
        _refuse(data, lambda x: type(x) not in allowed, f"{v2_datatype(dtype)} takes JSON {_EXPECTED[dtype.kind]}")


def _asarray(data: Any, dtype: np.dtype | type | None) -> np.ndarray:
    """np.asarray with numpy's complaint about ragged lists said plainly."""
    try:
        return np.asarray(data, dtype=dtype)
    except ValueError:
        raise ValueError("the nested lists are ragged: rows hold different numbers of values") from None


def _leaf_types(data: Any, depth: int) -> set[type]:
    """The types of the leaves of nested lists (a list among the leaves of a row: mixed nesting)."""
    if not isinstance(data, list):
        return {type(data)}
    if depth > MAX_DEPTH:
        raise ValueError(f"the values are nested more than {MAX_DEPTH} lists deep")
    if not data or not isinstance(data[0], list):
        types = set(map(type, data))
        if list in types:
            raise ValueError("the nested lists are ragged: some rows hold lists where others hold values")
        return types
    types = set()
    for item in data:
        types |= _leaf_types(item, depth + 1)
    return types


def _refuse(data: Any, bad: Callable[[Any], bool], rule: str) -> NoReturn:
    """Raise ValueError naming the first element for which `bad` is true, its position and the rule."""
    for position, value in _leaves(data, ()):
        if bad(value):
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ValueError(f"element {list(position)} is {shown}: {rule}")
    raise ValueError(rule)  # not reached: the caller found such an element


def _leaves(data: Any, position: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], Any]]:
    if isinstance(data, list):
        for i, item in enumerate(data):
            yield from _leaves(item, (*position, i))
    else:
        yield position, data
