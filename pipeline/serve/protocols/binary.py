"""The V2 binary tensor data extension's codec: raw little-endian tensors after a JSON header.

A request or response body is `JSON header + tensor bytes`; the `Inference-Header-Content-Length`
header gives the JSON part's size, and each binary tensor declares its byte size in
`parameters.binary_data_size`, in the order the tensors appear. BYTES elements are each a 4-byte
little-endian length followed by the bytes. Spec: triton-inference-server/server
docs/protocol/extension_binary_data.md.

This module frames bodies and converts tensors; which tensors travel binary is the V2 protocol's
choice (`v2.py`), made per input and per output, so a JSON request may get binary outputs back.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from pipeline.serve.errors import RequestError

HEADER = "inference-header-content-length"


def split_body(body: bytes, headers: dict[str, str]) -> tuple[bytes, memoryview]:
    """Split a body into its JSON header and the binary tensor bytes that follow it (none without HEADER)."""
    if HEADER not in headers:
        return body, memoryview(b"")
    header_length = headers[HEADER]
    try:
        size = int(header_length)
    except ValueError:
        raise RequestError(
            f"Inference-Header-Content-Length must be an integer byte count, got {header_length[:40]!r}"
        ) from None
    if not 0 <= size <= len(body):
        raise RequestError(
            f"Inference-Header-Content-Length is {size} but the body holds {len(body)} bytes; "
            "it must be the size of the JSON header at the start of the body"
        )
    view = memoryview(body)
    return bytes(view[:size]), view[size:]


def join_body(header: bytes, tensors: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """A JSON header and binary tensors -> the response body and its headers (plain JSON when none)."""
    if not tensors:
        return header, {"content-type": "application/json"}
    return b"".join([header, *tensors]), {"content-type": "application/octet-stream", HEADER: str(len(header))}


def decode_tensor(data: memoryview, name: str, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """Raw bytes -> array of `shape`; the byte count must match the shape exactly."""
    count = math.prod(shape)
    if dtype.kind == "O":
        elements = _split_bytes(data, name, count)
        array = np.empty(count, dtype=object)
        array[:] = elements
        return array.reshape(shape)
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise RequestError(
            f"input {name!r}: binary_data_size is {len(data)} bytes but shape {shape} of "
            f"{dtype} needs {expected} ({count} elements x {dtype.itemsize} bytes)"
        )
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).reshape(shape)


def encode_tensor(array: np.ndarray) -> bytes:
    """Array -> raw little-endian bytes (BYTES: length-prefixed elements)."""
    if array.dtype.kind in "OSU":
        parts = []
        for item in array.ravel():
            raw = item.encode() if isinstance(item, str) else bytes(item)
            parts += [struct.pack("<I", len(raw)), raw]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _split_bytes(data: memoryview, name: str, count: int) -> list[bytes]:
    """The `count` length-prefixed elements of `data`, or a 400 when it holds more or fewer.

    Each element's place depends on every length before it, so this is a loop; the caller bounds
    `count` (the declared shape, checked against the model first), and the loop stops at it: a body of
    millions of empty elements costs no more than the shape admits. Elements of one length (what a
    client batching fixed-size records sends) are checked and cut without the loop.
    """
    if count and len(data) >= 4:
        (first,) = struct.unpack_from("<I", data, 0)
        if (first + 4) * count == len(data):
            rows = np.frombuffer(data, dtype=np.uint8).reshape(count, first + 4)
            if (rows[:, :4].copy().view("<u4") == first).all():
                raw = bytes(data)
                return [raw[i * (first + 4) + 4 : (i + 1) * (first + 4)] for i in range(count)]
    elements, offset = [], 0
    while offset < len(data):
        if len(elements) == count:
            raise RequestError(
                f"input {name!r}: its shape needs {count} BYTES elements, the data holds more (bytes left at "
                f"offset {offset} of {len(data)})"
            )
        if offset + 4 > len(data):
            raise RequestError(f"input {name!r}: BYTES data ends inside a 4-byte length prefix at offset {offset}")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise RequestError(
                f"input {name!r}: a BYTES element claims {length} bytes at offset {offset}, "
                f"past the end of its {len(data)}-byte data"
            )
        elements.append(bytes(data[offset : offset + length]))
        offset += length
    if len(elements) != count:
        raise RequestError(f"input {name!r}: its shape needs {count} BYTES elements, the data holds {len(elements)}")
    return elements
