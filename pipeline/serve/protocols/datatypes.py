"""Tensor specs as the protocols expose them, and a V2 datatype read from a request or given to a response.

The datatype tables themselves are the spine's (pipeline/artifact/datatypes.py): the reports use them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.artifact.datatypes import V2_TO_NUMPY
from pipeline.artifact.tensors import Feature, TokenInput
from pipeline.serve.errors import RequestError


@dataclass(frozen=True)
class IOSpec:
    """A model input or output as the protocols expose it. Dynamic dims are -1."""

    name: str
    datatype: str  # V2 datatype: FP32, INT64, ...
    shape: tuple[int, ...]
    labels: tuple[str, ...] = ()  # an output's class names (the manifest's labels), index = class
    tokens: TokenInput | None = None  # a token-id input's vocabulary, longest sequence, padding id
    features: tuple[Feature, ...] | None = None  # a [batch, F] input's columns by name (a model trained on a table)
    tokenized_into: tuple[str, ...] = ()  # the text input of a model with a tokenizer: the token inputs it fills

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
