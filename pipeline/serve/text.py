"""Texts in inference requests -> the token inputs of a model that carries its tokenizer.

A version whose manifest records a tokenizer (pipeline/artifact/tokens.py) takes text as well as
token ids: the protocols see one more input, `text` (V2 BYTES, shape [n] or [n, 1]: one text per row; TF
Serving `instances` of strings), listed first in the model's metadata. A request sends either the
texts (under `text`, or as strings under the ids input itself) or the token inputs, not both. The
texts are tokenized here with the `tokenizers` library (pipeline/runtime/text.py: no torch, no
transformers), cut to the recorded max length, and padded to the request's longest row; the batcher
then pads across requests to the batch's longest row (pipeline/serve/batching.py). Text that is not
UTF-8 is a 400 naming the row.

A long text must not cost the server more than the model can use of it: each text's bytes are cut
to what `TextEncoder.max_chars` characters can take (4 bytes a character) before they are decoded,
the characters are cut before they are tokenized (pipeline/runtime/text.py), and the decoding and
tokenizing run in the inference pool (`Batcher.prepare`), never on the event loop, counted in the
model's queue and within the request's timeout. A text the tokenizer fails on is a 400 naming it.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.core.errors import InputError
from pipeline.runtime.text import TextEncoder
from pipeline.serve.batching import Batcher
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.datatypes import IOSpec

TEXT_NAMES = ("text", "texts", "text_input")  # the text input's name: the first no model input already has
UTF8_MAX = 4  # bytes of one character in UTF-8, at most
CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 bytes inside a character: a cut from the end may start among them


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

    async def converted(self, feeds: dict[str, np.ndarray], queue: Batcher, arrived: float) -> dict[str, np.ndarray]:
        """`feeds` with texts tokenized into the token inputs (in the inference pool); unchanged when no text
        was sent."""
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
        queue.check_rows(len(items))
        return await queue.prepare(lambda: self.encode(items, sent), arrived)

    def encode(self, items: list[object], sent: str) -> dict[str, np.ndarray]:
        """The texts sent (str or UTF-8 bytes) -> the token inputs; run in a worker thread."""
        assert self.encoder is not None
        limit = self.encoder.max_chars
        left = self.encoder.truncation_side == "left"
        texts = [_text(item, sent, i, limit, left) for i, item in enumerate(items)]
        try:
            return self.encoder.encode(texts)
        except InputError as exc:
            raise RequestError(f"input {sent!r}: {exc}") from None


def _text(item: object, name: str, row: int, limit: int, left: bool) -> str:
    """One text as str, its bytes cut to what `limit` characters can take (from the end when `left`)."""
    if isinstance(item, str):
        return item
    if not isinstance(item, bytes):
        raise RequestError(f"input {name!r} row {row}: expected a string, got {type(item).__name__}")
    raw = item
    if len(raw) > limit * UTF8_MAX:  # a character cut in two at the edge is dropped, not refused
        if left:
            return _decoded(raw[-limit * UTF8_MAX :].lstrip(CONTINUATION), name, row, final=True)
        return _decoded(raw[: limit * UTF8_MAX], name, row, final=False)
    return _decoded(raw, name, row, final=True)


def _decoded(raw: bytes, name: str, row: int, final: bool) -> str:
    """UTF-8 -> str; `final` False: an unfinished character at the end is left out."""
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(raw, final=final)
    except UnicodeDecodeError as exc:
        raise RequestError(
            f"input {name!r} row {row}: the text is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
