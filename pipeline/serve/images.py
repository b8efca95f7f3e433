"""Encoded pictures in inference requests -> the tensors an image input takes.

A client may send an image input (NCHW or NHWC, float or uint8) as the pictures themselves, PNG or
JPEG bytes, one per row: TF Serving's `{"b64": "..."}` values, or a V2 BYTES tensor of shape [n]
(base64 strings in JSON `data`, raw bytes in the binary extension). The protocols decode either into
an object array of one element per picture: its raw bytes, or its base64 text (V2 JSON). Here each picture is
converted as the manifest records the model was trained (`pipeline/runtime/images.py`, the same conversion
`pipe predict` uses) and the rows are stacked into the input's own tensor, before the usual check
of every input against the model; where each picture landed in its row (`Placement`) is kept with the
request, so boxes can be mapped back to the picture. A picture that cannot be read is a 400 naming it.
A version whose image record cannot be applied is refused when it loads (the manifest check), not here.
"""

from __future__ import annotations

import asyncio
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.artifact.manifest import Manifest
from pipeline.core.errors import InputError
from pipeline.runtime.images import ImageInput, Placement, image_input
from pipeline.serve.batching import Batcher
from pipeline.serve.errors import RequestError, Unavailable
from pipeline.serve.protocols.datatypes import IOSpec
from pipeline.serve.protocols.jsonvalues import decode_base64

# The first bytes of every format pipeline.runtime.images decodes (WebP: RIFF, then WEBP at byte 8).
DECODE_SLOTS = 2  # pictures of one served version decoding at once (a worker thread each)
DECODE_WAIT_S = 1.0  # how long a request waits for a free decoding slot before 503 + Retry-After
SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"RIFF")


# The feeds with pictures converted, and per input sent as pictures, where each landed in its row.
Converted = tuple[dict[str, np.ndarray], dict[str, list[Placement]]]


@dataclass(frozen=True)
class ServedImages:
    """Which inputs of a served version take encoded pictures, and how; why the others do not."""

    inputs: dict[str, ImageInput] = field(default_factory=dict)  # input name -> its conversion
    refused: dict[str, str] = field(default_factory=dict)  # input name -> why pictures cannot feed it
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)  # input name -> its preprocessing
    # pictures decoding at once; asyncio binds a semaphore to its loop on first use, not here
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(DECODE_SLOTS), repr=False, compare=False)

    @classmethod
    def of(cls, manifest: Manifest) -> ServedImages:
        inputs, refused, recorded = {}, {}, {}
        for spec in manifest.inputs:
            if spec.preprocessing:
                recorded[spec.name] = dict(spec.preprocessing)
            try:
                inputs[spec.name] = image_input(manifest, spec)
            except InputError as exc:
                refused[spec.name] = str(exc)
                continue
            recorded[spec.name] = {**recorded.get(spec.name, {}), "image": inputs[spec.name].describe()}
        return cls(inputs, refused, recorded)

    async def converted(
        self, feeds: dict[str, np.ndarray], specs: dict[str, IOSpec], queue: Batcher, arrived: float
    ) -> Converted:
        """`feeds` with every input sent as encoded pictures converted; unchanged when there is none.

        The row count is checked first (more pictures than a batch takes is a 400 before any is
        decoded). The request then takes its place in the model's queue (`queue.preparing`: counted
        against --max-queue) and its pictures decode in a worker thread (a photo takes milliseconds
        the event loop should spend elsewhere) holding one of this version's decoding slots. While
        they are all busy a request waits at most DECODE_WAIT_S, then gets 503 + Retry-After, so large
        pictures in flight cannot hold a small request for a minute; and the wait and the decoding
        count against the request's --timeout from `arrived` (loop time), as its queueing will.
        """
        encoded = [array for name, array in feeds.items() if _is_encoded(array, specs.get(name))]
        if not encoded:
            return feeds, {}
        for array in encoded:
            if array.ndim == 1:  # any other shape is refused by `decode`, naming it
                queue.check_rows(len(array))
        with queue.preparing():
            wait = min(DECODE_WAIT_S, queue.time_left(arrived))
            try:
                await asyncio.wait_for(self.slots.acquire(), wait)
            except TimeoutError:
                queue.time_left(arrived)  # the request's own timeout first, when that is what ran out
                raise Unavailable(
                    f"pictures for this model are being decoded at capacity ({DECODE_SLOTS} at a time); retry shortly"
                ) from None
            try:
                return await asyncio.to_thread(self.decode, feeds, specs)
            finally:
                self.slots.release()

    def decode(self, feeds: dict[str, np.ndarray], specs: dict[str, IOSpec]) -> Converted:
        """Each input sent as encoded pictures -> the input's tensor, [n, C, H, W] or [n, H, W, C], and
        where each picture landed in its row."""
        decoded, placements = dict(feeds), {}
        for name, array in feeds.items():
            spec = specs.get(name)
            if spec is None or not _is_encoded(array, spec):
                continue
            image = self.inputs.get(name)
            if image is None:
                raise RequestError(
                    f"input {name!r} was sent as encoded pictures (BYTES or b64), but {self.refused.get(name, '')}"
                )
            if array.ndim != 1:
                raise RequestError(
                    f"input {name!r}: encoded pictures come as a list of shape [n], one per row; got shape "
                    f"{list(array.shape)}"
                )
            try:
                rows = [image.convert(_picture(item, name, i), f"input {name!r} picture {i}") for i, item in
                        enumerate(array)]  # fmt: skip
            except InputError as exc:
                raise RequestError(str(exc)) from None
            samples = [sample for sample, _ in rows]
            decoded[name] = np.stack(samples) if rows else np.zeros((0, *image.sample_shape), image.dtype)
            placements[name] = [placement for _, placement in rows]
        return decoded, placements


def _is_encoded(array: np.ndarray, spec: IOSpec | None) -> bool:
    """An object array for an input that is not itself a string tensor: pictures to convert."""
    return spec is not None and spec.datatype != "BYTES" and array.dtype == object


def _picture(item: Any, name: str, index: int) -> bytes:
    """One element -> the picture's bytes: raw when it starts with a PNG, JPEG, GIF, BMP or WebP
    signature (V2 binary data; TF Serving's b64, already decoded), else the base64 text of one (V2 JSON
    strings). No base64 text starts with one of those signatures (the base64 of a PNG starts `iVBOR`, of
    a JPEG `/9j/`), so the two cannot be confused. Anything else is handed to Pillow as it is, which
    refuses it naming the formats it reads.
    """
    if not isinstance(item, bytes | str):
        raise RequestError(f"input {name!r} picture {index}: expected encoded picture bytes, got {type(item).__name__}")
    raw = item.encode(errors="replace") if isinstance(item, str) else item
    if raw.startswith(SIGNATURES) and (raw[:4] != b"RIFF" or raw[8:12] == b"WEBP"):
        return raw
    try:
        return decode_base64(raw)
    except (binascii.Error, ValueError):
        return raw
