"""Datatype tables: KServe V2 datatypes <-> numpy dtypes <-> onnxruntime types <-> TF Serving names.

Leaf constants of the spine: the server's protocols read requests and write responses with them, and
the model card writes its request examples with them.
"""

from __future__ import annotations

import numpy as np

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

# numpy dtype name -> V2 datatype (BYTES has no single numpy dtype: it is left out).
NUMPY_TO_V2: dict[str, str] = {dtype.name: v2 for v2, dtype in V2_TO_NUMPY.items() if v2 != "BYTES"}

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
