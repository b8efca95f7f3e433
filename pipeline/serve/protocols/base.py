"""The contract every wire protocol implements: decode a request body, encode the outputs back.

The app's one inference path is `decode -> check inputs -> batch infer -> select outputs ->
encode`; a protocol owns only the two ends. `decode` turns a body into named numpy arrays (not yet
checked against the model: that is the session's job, the same for every protocol) plus whatever
the protocol needs to remember for its answer; `encode` turns the outputs back into a body.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.serve.protocols.datatypes import IOSpec

if TYPE_CHECKING:
    from pipeline.runtime.images import Placement
    from pipeline.serve.detections import Asked


@dataclass(frozen=True)
class ModelIO:
    """What a protocol knows about the model version it speaks for."""

    name: str
    version: int
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    max_rows: int | None = None  # the most rows one request may hold (a batchable model's max batch size)
    # inputs pinned at import (constants of the model): a request may still name one, and the session accepts
    # the model's own value and refuses another, naming it
    pinned: frozenset[str] = frozenset()


@dataclass
class Decoded:
    """A decoded request: its inputs, the outputs it asks for, and the protocol's own options."""

    inputs: dict[str, np.ndarray]  # input name -> array, as sent (checked against the model later)
    outputs: list[str] | None  # output names asked for, in the order to answer them; None: every output
    options: Any = None  # read only by the protocol that decoded it (V2: id, binary outputs; TF: row form)
    # input name -> where each picture sent for it landed in its row (boxes map back through these)
    placements: dict[str, list[Placement]] = field(default_factory=dict)
    detections: Asked | None = None  # detections asked for instead of the raw head output (task detection)
    coordinates: str | None = None  # the answer's boxes are in "picture" or "input" pixels (set when answered)


Encoded = tuple[bytes, dict[str, str]]  # response body and its headers


class Protocol(ABC):
    """One wire format for inference requests."""

    @abstractmethod
    def decode(self, body: bytes, headers: dict[str, str], model: ModelIO) -> Decoded:
        """Body and lower-cased headers -> a Decoded request; a RequestError (4xx) for a malformed one."""

    @abstractmethod
    def encode(self, model: ModelIO, decoded: Decoded, results: dict[str, np.ndarray]) -> Encoded:
        """The outputs asked for (name -> array, in `decoded.outputs` order) -> response body and headers."""
