"""One served onnxruntime session: the model's I/O specs, and the check of every request against them.

Sessions are made by the project's one factory, `pipeline.runtime.session.create_session` (provider
choice, threads, spin). onnxruntime lists CUDA as available even where it cannot load and then
silently runs on CPU (docs/install.md, Serving on a GPU), so the provider in use is read back from
`session.get_providers()` and reported, never assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from pipeline.artifact.datatypes import ORT_TO_V2
from pipeline.artifact.generation import DECODE_IN_PLACE
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import Feature, TokenInput
from pipeline.core.errors import ArtifactError
from pipeline.runtime.session import create_session
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols.datatypes import IOSpec, v2_datatype
from pipeline.serve.protocols.keyed import SHOWN

if TYPE_CHECKING:
    from pipeline.serve.generation.served import Starter

_state = ort.capi.onnxruntime_pybind11_state
# What onnxruntime raises for an input it cannot run (none share a base); a device failure such as
# EPFail is left out on purpose: it is a server fault (500), not a bad request.
ORT_ERRORS: tuple[type[Exception], ...] = (
    _state.Fail,
    _state.InvalidArgument,
    _state.InvalidGraph,
    _state.InvalidProtobuf,
    _state.NoSuchFile,
    _state.NotImplemented,
    _state.RuntimeException,
)


@dataclass(frozen=True)
class SessionOptions:
    """How sessions are created; one per server, shared by every model."""

    provider: str = "auto"  # auto (CUDA if usable, else CPU) | cpu | cuda
    intra_op_threads: int = 0  # threads inside one operator; 0 lets onnxruntime decide
    inter_op_threads: int = 0  # threads across independent operators; 0 lets onnxruntime decide
    spin: bool = True  # idle onnxruntime threads busy-wait: lower latency, but they burn CPU the
    # event loop could use when cores are few


def _spec(arg: ort.NodeArg) -> IOSpec:
    datatype = ORT_TO_V2.get(arg.type)
    if datatype is None:
        raise ArtifactError(f"model {arg.name!r} has type {arg.type}, which the server cannot carry over HTTP")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return IOSpec(arg.name, datatype, shape)


class ModelSession:
    """An onnxruntime InferenceSession plus the facts the server needs about it."""

    def __init__(self, path: Path, options: SessionOptions, manifest: Manifest | None = None) -> None:
        # The one session factory (shared with the verifier): a load failure is an ArtifactError,
        # which refuses this version only, and a provider fallback is logged there.
        # A written decoder serves with `decode_in_place` a constant: every call writes into its cache in place
        # (generation/scheduler.py), and onnxruntime drops the If of each layer (1.4 ms of a 26 ms step).
        generating = manifest is not None and manifest.task == "text-generation"
        self.session = create_session(
            path, options.provider, options.intra_op_threads, options.inter_op_threads, options.spin,
            constants={DECODE_IN_PLACE: np.array(True)} if generating else None,
        )  # fmt: skip
        self.providers: list[str] = self.session.get_providers()
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.outputs = [_spec(a) for a in self.session.get_outputs()]
        if manifest is not None:  # what the model file does not say: class names, token limits
            self.inputs, self.outputs = _declared(self.inputs, self.outputs, manifest)
        self.input_by_name = {s.name: s for s in self.inputs}
        # inputs pinned at import are constants of the model: a request may repeat the value, never change it
        self.pinned = {p.name: np.asarray(p.value, p.dtype) for p in (manifest.pinned or [])} if manifest else {}
        # Only the inputs with categorical columns pay for their check, one vectorized test a request.
        self.categorical = {s.name: c for s in self.inputs if (c := _CategoryColumns.of(s.features)) is not None}
        # Batching concatenates requests along dim 0, so every input and output must have a dynamic
        # first dim; a model with a fixed batch, or whose batch is another axis (a state [2, batch, 128]),
        # runs each request alone.
        self.batchable = all(s.shape and s.shape[0] == -1 for s in (*self.inputs, *self.outputs))
        moved = [s.name for s in (*manifest.inputs, *manifest.outputs) if s.batch_axis] if manifest else []
        self.batch_off = f"off (the batch is not the first axis of {moved})" if moved else "off (fixed batch dim)"
        self.batchable = self.batchable and not moved
        self.padding = _padding(self.inputs, self.outputs) if self.batchable else None
        self.generator: Starter | None = None  # a text-generation model's engine starter, set on load

    def check_inputs(self, feeds: dict[str, np.ndarray]) -> int:
        """Refuse inputs that do not match the model (name, dtype, shape); return the batch size.

        BYTES inputs are decoded to `str` in place: onnxruntime turns a `bytes` object into its
        repr ("b'..'") instead of its content, so string tensors must arrive as UTF-8 text.
        """
        for name in sorted(set(feeds) & set(self.pinned)):
            self._pinned(name, feeds.pop(name))
        unknown = sorted(set(feeds) - set(self.input_by_name))
        missing = sorted(set(self.input_by_name) - set(feeds))
        if unknown or missing:
            expected = ", ".join(s.describe() for s in self.inputs)
            parts = [f"unknown input(s) {unknown}" if unknown else "", f"missing input(s) {missing}" if missing else ""]
            raise RequestError(f"{'; '.join(p for p in parts if p)}; the model expects {expected}")
        rows = set()
        for name, array in feeds.items():
            spec = self.input_by_name[name]
            if array.dtype != spec.dtype and not (spec.datatype == "BYTES" and array.dtype.kind in "OSU"):
                raise RequestError(
                    f"input {name!r} has datatype {v2_datatype(array.dtype)}, the model expects {spec.describe()}"
                )
            fits = array.ndim == len(spec.shape) and all(
                w in (-1, g) for w, g in zip(spec.shape, array.shape, strict=True)
            )
            if not fits:
                raise RequestError(
                    f"input {name!r} has shape {list(array.shape)}, the model expects {spec.describe()} (-1: any size)"
                )
            if spec.tokens is not None:
                _check_tokens(name, array, spec.tokens)
            if name in self.categorical:
                self.categorical[name].check(name, array)
            if spec.datatype == "BYTES":
                feeds[name] = _as_text(name, array)
            if array.ndim:
                rows.add(array.shape[0])
        if self.batchable and len(rows) > 1:
            raise RequestError(f"inputs disagree on the batch size (first dim): {sorted(rows)}")
        return rows.pop() if rows else 1

    def _pinned(self, name: str, sent: np.ndarray) -> None:
        """A pinned input sent anyway: the model's own value is accepted (and dropped), another refused."""
        value = self.pinned[name]
        if sent.shape != value.shape or not np.array_equal(sent.astype(value.dtype, copy=False), value):
            shown = sent.tolist() if sent.size <= 8 else f"an array of shape {list(sent.shape)}"
            raise RequestError(
                f"input {name!r} is pinned to {value.tolist()} in this model (pipe import --input-value); the request "
                f"sends {shown}: leave it out, or send {value.tolist()}"
            )

    def run(self, feeds: dict[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the model; `outputs` selects which (all when None)."""
        names = list(outputs) if outputs else [s.name for s in self.outputs]
        results = self.session.run(names, feeds)
        return dict(zip(names, results, strict=True))


def _declared(inputs: list[IOSpec], outputs: list[IOSpec], manifest: Manifest) -> tuple[list[IOSpec], list[IOSpec]]:
    """The specs with what the manifest adds: token limits per input, and a classifier's labels on the
    output they name (the manifest's first output, when its class dim fits them)."""
    tokens = {s.name: s.tokens for s in manifest.inputs if s.tokens is not None}
    inputs = [replace(s, tokens=tokens[s.name]) if s.name in tokens else s for s in inputs]
    columns = {s.name: tuple(s.features) for s in manifest.inputs if s.features is not None}
    inputs = [replace(s, features=columns[s.name]) if s.name in columns else s for s in inputs]
    labeled = manifest.outputs[0].name if manifest.task == "classification" and manifest.labels else None
    outputs = [
        replace(s, labels=tuple(manifest.labels))
        if s.name == labeled and s.shape and s.shape[-1] in (-1, len(manifest.labels))
        else s
        for s in outputs
    ]
    return inputs, outputs


@dataclass(frozen=True)
class _CategoryColumns:
    """The categorical columns of a [batch, F] input, whose value is a category's index: the model
    one-hot encodes it (train/zoo.py OneHot), so an index it has no category for (negative, too large,
    not whole) would match none and be answered as all zeros."""

    positions: np.ndarray  # [C] the columns' places among the F features
    sizes: np.ndarray  # [C] each column's number of categories
    features: tuple[Feature, ...]  # [C] the columns themselves, for the error

    @classmethod
    def of(cls, features: tuple[Feature, ...] | None) -> _CategoryColumns | None:
        found = [(i, f) for i, f in enumerate(features or ()) if f.categories]
        if not found:
            return None
        positions = np.array([i for i, _ in found], dtype=np.intp)
        # an unseen category's index, where the model takes one (data.unseen_categories: unknown), is valid too
        sizes = np.array([len(f.categories or ()) + (f.unknown_index is not None) for _, f in found])
        return cls(positions, sizes, tuple(f for _, f in found))

    def check(self, name: str, array: np.ndarray) -> None:
        """Refuse the first index outside 0..k-1 or not whole (NaN included); `array` is [batch, F]."""
        values = array[:, self.positions]  # [batch, C]
        bad = ~((values >= 0) & (values < self.sizes) & (values == np.floor(values)))
        if not bad.any():
            return
        row, column = (int(i) for i in np.argwhere(bad)[0])
        feature, k = self.features[column], int(self.sizes[column])
        categories = feature.categories or []
        shown = categories[:SHOWN] + (["..."] if k > SHOWN else [])
        raise RequestError(
            f"input {name!r}: column {feature.name!r} (feature {int(self.positions[column])}) holds category index "
            f"{values[row, column]:g} in row {row}; valid indices are the whole numbers 0..{k - 1} (categories "
            f"{shown}); a TF Serving row may name the category instead"
        )


def _padding(inputs: list[IOSpec], outputs: list[IOSpec]) -> dict[str, int] | None:
    """Token input -> the value that pads its rows, when requests of different sequence lengths can batch
    together: every token input [batch, sequence] records its padding value, every other input has no
    sequence axis to pad (its shape stays part of what a batch must share), and no output has a sequence
    axis (its rows would come back padded)."""
    tokens = [s for s in inputs if s.tokens is not None]
    if not tokens or any(s.tokens is None or s.tokens.padding_id is None or len(s.shape) != 2 for s in tokens):
        return None
    if any(len(s.shape) > 2 for s in outputs):
        return None
    return {s.name: s.tokens.padding_id for s in tokens if s.tokens is not None and s.tokens.padding_id is not None}


def _check_tokens(name: str, ids: np.ndarray, tokens: TokenInput) -> None:
    """Refuse sequences longer than the model covers and ids outside its vocabulary (a negative id
    would silently index from the end of the embedding; a long sequence fails inside onnxruntime)."""
    if tokens.max_length is not None and ids.ndim and ids.shape[-1] > tokens.max_length:
        raise RequestError(
            f"input {name!r}: sequences of {ids.shape[-1]} tokens are longer than the model's "
            f"max_sequence_length {tokens.max_length}; shorten or split them"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= tokens.vocab_size):
        where = tuple(int(i) for i in np.argwhere((ids < 0) | (ids >= tokens.vocab_size))[0])
        if tokens.role != "ids":
            what = "an attention mask holds 0 or 1" if tokens.role == "mask" else f"{tokens.vocab_size} token types"
            raise RequestError(
                f"input {name!r}: value {ids[where]} at {list(where)} is outside [0, {tokens.vocab_size}) ({what})"
            )
        raise RequestError(
            f"input {name!r}: token id {ids[where]} at {list(where)} is outside the vocabulary: ids must be in "
            f"[0, {tokens.vocab_size}) (vocab_size {tokens.vocab_size})"
        )


def _as_text(name: str, array: np.ndarray) -> np.ndarray:
    text = np.empty(array.shape, dtype=object)
    try:
        text.flat[:] = [x.decode() if isinstance(x, bytes) else str(x) for x in array.flat]
    except UnicodeDecodeError as exc:
        raise RequestError(
            f"input {name!r}: BYTES element is not UTF-8 ({exc}); onnxruntime string tensors hold UTF-8 text"
        ) from None
    return text
