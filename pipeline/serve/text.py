"""Texts in inference requests -> the token inputs of a model that carries its tokenizer.

A version whose manifest records a tokenizer (pipeline/artifact/tokens.py) takes text as well as
token ids: the protocols see one more input, `text` (V2 BYTES, shape [n] or [n, 1]: one text per row; TF
Serving `instances` of strings), listed first in the model's metadata. A request sends either the
texts (under `text`, or as strings under the ids input itself) or the token inputs, not both. The
texts are tokenized here with the `tokenizers` library (pipeline/runtime/text.py: no torch, no
transformers), cut to the recorded max length, and padded to the request's longest row; the batcher
then pads across requests to the batch's longest row (pipeline/serve/batching.py). Text that is not
UTF-8 is a 400 naming the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.runtime.text import TextEncoder
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.datatypes import IOSpec

TEXT_NAMES = ("text", "texts", "text_input")  # the text input's name: the first no model input already has


@dataclass(frozen=True)
class ServedText:
    """How a served version takes text; `encoder` None: token ids only."""

    encoder: TextEncoder | None = None
    name: str = TEXT_NAMES[0]  # the text input as the protocols see it

    @classmethod
    def of(cls, root: Path, manifest: Manifest) -> ServedText:
        encoder = TextEncoder.of(root, manifest)
        taken = {s.name for s in manifest.inputs}
        return cls(encoder, next(n for n in TEXT_NAMES if n not in taken)) if encoder else cls()

    def spec(self) -> IOSpec | None:
        """The text input for the protocols and the metadata, or None."""
        if self.encoder is None:
            return None
        return IOSpec(self.name, "BYTES", (-1,), tokenized_into=tuple(self.encoder.limits.names.values()))

    def converted(self, feeds: dict[str, np.ndarray], check_rows: Callable[[int], None]) -> dict[str, np.ndarray]:
        """`feeds` with texts tokenized into the token inputs; unchanged when no text was sent."""
        if self.encoder is None:
            return feeds
        ids = self.encoder.limits.names["ids"]
        if self.name in feeds:
            sent = self.name
        elif ids in feeds and feeds[ids].dtype == object:  # strings sent under the ids input itself
            sent = ids
        else:
            return feeds
        if others := sorted(set(feeds) - {sent}):
            raise RequestError(
                f"the request sends text ({sent!r}) and also {others}; send the texts alone (they are tokenized "
                f"here), or the token inputs alone"
            )
        texts = feeds[sent]
        if texts.ndim == 2 and texts.shape[1] == 1:  # [n, 1], as Triton's text models often declare it
            texts = texts[:, 0]
        if texts.ndim > 1 or (texts.ndim == 1 and not len(texts)):
            raise RequestError(f"input {sent!r}: texts come as a list of shape [n], one per row, got shape "
                               f"{list(texts.shape)}")  # fmt: skip
        items = [texts.item()] if texts.ndim == 0 else list(texts)
        check_rows(len(items))
        return self.encoder.encode([_text(item, sent, i) for i, item in enumerate(items)])


def _text(item: object, name: str, row: int) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, bytes):
        try:
            return item.decode()
        except UnicodeDecodeError as exc:
            raise RequestError(
                f"input {name!r} row {row}: the text is not UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    raise RequestError(f"input {name!r} row {row}: expected a string, got {type(item).__name__}")
