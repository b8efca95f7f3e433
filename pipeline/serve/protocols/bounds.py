"""How many JSON values a request body may hold for a model, counted before the body is parsed.

orjson parses a body holding the GIL: 47 MB of empty strings took 1.25 s and 860 MB, during which no
other thread of the server, the event loop included, runs. Where the model bounds what it takes (its
rows by the max batch size, every other dim fixed or a token input's max length) a body holding far
more values than that can only be refused, so it is refused unparsed: its strings are counted by
their quotes, its values by their commas (`bytes.count`, about 10 ms for 50 MB). The counts are
loose upper bounds of a legitimate request's (SLACK values for names, datatypes, parameters), so
no request a model can take is refused here; the exact checks come after parsing.

Commas are not counted for a model that takes strings (a text or a BYTES tensor holds any number of
commas), nor values for a model with a free dim (a picture input [-1, 3, ?, ?] takes any size), nor
strings for one with a BYTES input with a free dim.
"""

from __future__ import annotations

import math

from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.base import ModelIO
from pipeline.serve.protocols.datatypes import IOSpec

CHECKED_FROM_BYTES = 256 * 1024  # smaller bodies parse in well under a millisecond: not counted
SLACK = 4096  # values a request holds beside its tensors' (names, datatypes, shapes, parameters, keys)
STRINGS_PER_ROW = 3  # a row of an input may come as a string (a picture's base64, a text) under a key


def check_counts(raw_json: bytes, model: ModelIO) -> None:
    """Refuse, unparsed, a JSON body holding more strings or values than any request the model takes."""
    if len(raw_json) < CHECKED_FROM_BYTES or model.max_rows is None:
        return
    rows = model.max_rows
    per_row_strings = [_bytes_per_row(s) for s in model.inputs]
    if None in per_row_strings:  # a BYTES input with a free dim takes any number of strings
        return
    strings = SLACK + sum(rows * (STRINGS_PER_ROW + n) for n in per_row_strings if n is not None)
    found = (raw_json.count(b'"') - raw_json.count(b'\\"')) // 2
    if found > strings:
        raise _refused(f"about {found} strings", strings, model)
    if any(s.datatype == "BYTES" for s in model.inputs):  # texts hold commas: values cannot be counted by them
        return
    per_row = [_values_per_row(s) for s in model.inputs]
    if None in per_row:
        return
    values = strings + sum(rows * n for n in per_row if n is not None)
    found = raw_json.count(b",") + 1
    if found > values:
        raise _refused(f"at least {found} values", values, model)


def _bytes_per_row(spec: IOSpec) -> int | None:
    """Strings one row of a BYTES input holds (its non-batch dims; none beyond STRINGS_PER_ROW for a text
    input or any other), or None when a dim is free (no bound)."""
    if spec.datatype != "BYTES" or spec.tokenized_into:
        return 0
    dims = spec.shape[1:]
    return math.prod(dims) if all(d > 0 for d in dims) else None


def _values_per_row(spec: IOSpec) -> int | None:
    """Values one row of an input holds, or None when a dim is free (no bound)."""
    dims = [spec.tokens.max_length if d == -1 and spec.tokens and spec.tokens.max_length else d for d in spec.shape[1:]]
    return math.prod(dims) if all(d > 0 for d in dims) else None


def _refused(found: str, bound: int, model: ModelIO) -> RequestError:
    return RequestError(
        f"the request holds {found}, more than any request model {model.name!r} takes can hold ({bound}: at most "
        f"{model.max_rows} rows of {', '.join(s.describe() for s in model.inputs)}); send fewer rows, or the "
        "tensors in binary (V2 binary tensor extension)"
    )
