"""Tensor specs and datatypes: V2 datatypes <-> numpy dtypes <-> onnxruntime types <-> TF Serving names."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.manifest import Feature, TokenInput
from pipeline.serve.errors import RequestError

# KServe V2 datatype -> numpy dtype. BYTES tensors are numpy object arrays of `bytes`.
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}


@dataclass(frozen=True)
class IOSpec:
    """A model input or output as the protocols expose it. Dynamic dims are -1."""

    name: str
    datatype: str  # V2 datatype: FP32, INT64, ...
    shape: tuple[int, ...]
    labels: tuple[str, ...] = ()  # an output's class names (the manifest's labels), index = class
    tokens: TokenInput | None = None  # a token-id input's vocabulary, longest sequence, padding id
    features: tuple[Feature, ...] | None = None  # a [batch, F] input's columns by name (a model trained on a table)

    @property
    def dtype(self) -> np.dtype:
        return V2_TO_NUMPY[self.datatype]

    def describe(self) -> str:
        return f"{self.name}: {self.datatype}{list(self.shape)}"

    def token_limits(self) -> dict[str, int | None]:
        """A token input's limits as model metadata shows them (empty for any other tensor)."""
        if self.tokens is None:
            return {}
        t = self.tokens
        return {"vocab_size": t.vocab_size, "max_sequence_length": t.max_length, "padding_id": t.padding_id}


# onnxruntime's NodeArg.type string -> V2 datatype.
ORT_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

# V2 datatype -> TF Serving's DataType enum name (used in model metadata).
V2_TO_TF: dict[str, str] = {
    "BOOL": "DT_BOOL",
    "UINT8": "DT_UINT8",
    "UINT16": "DT_UINT16",
    "UINT32": "DT_UINT32",
    "UINT64": "DT_UINT64",
    "INT8": "DT_INT8",
    "INT16": "DT_INT16",
    "INT32": "DT_INT32",
    "INT64": "DT_INT64",
    "FP16": "DT_HALF",
    "FP32": "DT_FLOAT",
    "FP64": "DT_DOUBLE",
    "BYTES": "DT_STRING",
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype for a V2 datatype, or a 400 naming the valid ones."""
    try:
        return V2_TO_NUMPY[datatype]
    except (KeyError, TypeError):
        raise RequestError(
            f"unsupported datatype {datatype!r}; valid V2 datatypes are {', '.join(V2_TO_NUMPY)}"
        ) from None


def v2_datatype(dtype: np.dtype) -> str:
    """The V2 datatype of a numpy array's dtype (strings and bytes are BYTES)."""
    if dtype.kind in "OSU":
        return "BYTES"
    for name, candidate in V2_TO_NUMPY.items():
        if candidate == dtype:
            return name
    raise RequestError(f"numpy dtype {dtype} has no V2 datatype", status=500)


def json_text(array: np.ndarray) -> np.ndarray:
    """A BYTES output -> an object array of str for a JSON body (undecodable bytes become U+FFFD)."""
    text = np.empty(array.shape, dtype=object)
    text.flat[:] = [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in array.flat]
    return text
