"""Texts as clients want them: a text recognizer's output [batch, positions, classes] read as text.

A task `text-recognition` model (a CTC recognizer, its dictionary in the manifest: `Ctc`) answers
each picture's text and confidence by default, as a detector answers boxes when asked: the one
decoding (`pipeline/runtime/ctc.py`: greedy, repeats merged, blank dropped; the confidence the mean
probability of the characters kept, 0 for no text) turns the raw output into

- KServe V2: two outputs, `text` BYTES [batch] and `confidence` FP32 [batch] (listed first in the
  model's metadata); the raw output is answered too when the request names it in `outputs` (a
  request naming outputs gets those alone);
- TF Serving `:predict`: `{"predictions": [{"text": ..., "confidence": ...}, ...]}` in row form,
  `{"outputs": {"text": [...], "confidence": [...]}}` in columnar form.

A picture sent encoded (b64, V2 BYTES) goes through the recorded image preprocessing first; a
tensor is fed as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.runtime.ctc import characters, greedy
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.datatypes import IOSpec

OUTPUTS = ("text", "confidence")  # what a recognizer answers by default, in order


@dataclass(frozen=True)
class Recognizer:
    """How a served recognizer's output becomes text: its output, the class -> text table, the blank."""

    output: str  # [batch, positions, classes]
    table: tuple[str, ...]  # the text of each class ("" for the blank)
    blank: int

    @classmethod
    def of(cls, manifest: Manifest) -> Recognizer | None:
        """The recognizer a task `text-recognition` manifest describes; None for any other task."""
        if manifest.ctc is None:
            return None
        table = characters(manifest.labels, manifest.ctc.blank, manifest.ctc.space)
        return cls(manifest.outputs[0].name, tuple(table), manifest.ctc.blank)

    def specs(self) -> list[IOSpec]:
        """The outputs a recognizer answers beside its own, as model metadata lists them."""
        return [IOSpec("text", "BYTES", (-1,)), IOSpec("confidence", "FP32", (-1,))]

    def read(self, scores: np.ndarray) -> dict[str, np.ndarray]:
        """`text` (object array of str [batch]) and `confidence` (float32 [batch]) of the raw output."""
        try:
            reads = greedy(scores, self.blank)
        except ValueError as exc:  # the model answered another shape than its manifest declares
            raise RequestError(f"output {self.output!r} cannot be read as text: {exc}", status=500) from None
        text = np.empty(len(reads), dtype=object)
        text[:] = [r.text(self.table) for r in reads]
        return {"text": text, "confidence": np.array([r.confidence for r in reads], np.float32)}
