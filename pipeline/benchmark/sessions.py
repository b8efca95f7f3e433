"""Each row loaded in its own runtime, every one with the same thread count, as a `pipeline.runtime.latency.Session`.

- ONNX rows: onnxruntime's CPU provider through `create_session` (`threads` intra-op threads, one
  inter-op thread), exactly as `pipe optimize` and `pipe check` time them; the clock covers
  `session.run`.
- The torch row: the trained module the artifact's backend rebuilds (`backend_for(artifact)`), run
  by the backend's reference runner with `torch.set_num_threads(threads)`; the clock covers one
  call: numpy in, `torch.no_grad()` forward, numpy out.
- TFLite rows: LiteRT's interpreter (`ai_edge_litert`, `num_threads=threads`) through the edge
  stage's runner, fed the same NCHW floats as the others; the clock covers one call, including
  the NCHW -> NHWC transpose and the int8 quantization of inputs and dequantization of outputs a
  program holding float images pays too.

torch and ai_edge_litert are optional here (pipe benchmark installs with the report and cpu
profiles): each is imported only when its row exists, and a missing package leaves its row
untimed with the install command, never an ImportError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.benchmark.rows import Row
from pipeline.core.arrays import Arrays
from pipeline.core.errors import PipelineError, first_line
from pipeline.runtime.backends import backend_for
from pipeline.runtime.latency import Session, batch_of
from pipeline.runtime.session import create_session


class NotTimed(Exception):
    """A row that cannot be loaded or run here; the message says why (and how to fix it when it can be)."""


@dataclass(frozen=True)
class Input:
    """An input as `pipeline.runtime.latency` reads it from a session: a name and a shape (an int first dim: fixed)."""

    name: str
    shape: tuple[Any, ...]


class RunnerSession:
    """A runner (named arrays in, named arrays out) called like an onnxruntime session, to be timed."""

    def __init__(self, runner: Callable[[Arrays], Arrays], inputs: list[Input]) -> None:
        self.runner = runner
        self.inputs = inputs

    def get_inputs(self) -> list[Input]:
        return self.inputs

    def run(self, _output_names: None, feed: dict[str, np.ndarray], /) -> Arrays:
        return self.runner(feed)


@contextlib.contextmanager
def open_rows(
    artifact: Artifact, rows: list[Row], threads: int, inputs: Arrays, batches: tuple[int, ...]
) -> Iterator[tuple[dict[str, Session], dict[str, str]]]:
    """Each row loaded and run once at each batch it will be timed at: (sessions, {row: why it is not timed}).

    A row that does not load, or fails its trial runs, is left out of the timing with its reason,
    so one broken model does not stop the others from being compared. torch's thread count is
    process-wide: it is put back when the block ends.
    """
    sessions: dict[str, Session] = {}
    untimed: dict[str, str] = {}
    torch_threads = _torch_threads() if any(row.format == "torch" for row in rows) else None
    try:
        for row in rows:
            try:
                session = _open(artifact, row, threads)
                _try_run(session, inputs, batches)
            except NotTimed as exc:
                untimed[row.name] = str(exc)
                continue
            sessions[row.name] = session
        yield sessions, untimed
    finally:
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)


def _open(artifact: Artifact, row: Row, threads: int) -> Session:
    """`row`'s model in its runtime with `threads` threads; NotTimed saying why it cannot be."""
    if row.reason and row.format == "torch":
        raise NotTimed(row.reason)
    try:
        if row.format == "torch":
            return _torch(artifact, threads)
        if row.format == "tflite":
            return _tflite(artifact, row, threads)
        return create_session(artifact.path(row.file), "cpu", intra_op_threads=threads, inter_op_threads=1)
    except PipelineError as exc:
        raise NotTimed(first_line(exc)) from exc


def _torch(artifact: Artifact, threads: int) -> Session:
    """The trained module through the artifact's backend, run by its reference runner."""
    if find_spec("torch") is None:
        raise NotTimed("torch is not installed; install the train profile: pip install -c requirements.lock '.[train]'")
    import torch

    torch.set_num_threads(threads)
    backend = backend_for(artifact)
    runner = backend.reference(artifact, backend.load_model(artifact))
    # eager torch has no fixed batch, whatever shape model.onnx declares
    return RunnerSession(runner, [Input(spec.name, ("batch", *spec.shape[1:])) for spec in artifact.manifest.inputs])


def _tflite(artifact: Artifact, row: Row, threads: int) -> Session:
    """The edge model on LiteRT, fed and read as the edge stage recorded it (layout, renamed tensors)."""
    if find_spec("ai_edge_litert") is None:
        raise NotTimed(
            "ai_edge_litert is not installed; install the edge profile: pip install -c requirements.lock '.[edge]'"
        )
    from pipeline.runtime.tflite_runner import TFLiteRunner

    edge = row.variant.edge if row.variant is not None else None
    layout = edge.layout.upper() if edge is not None else "NCHW"
    names = dict(edge.names) if edge is not None else {}
    try:
        runner = TFLiteRunner(artifact.path(row.file), threads, names, layout, runtime="ai_edge_litert")
    except (ValueError, RuntimeError, OSError) as exc:
        raise NotTimed(f"LiteRT cannot load {row.file}: {first_line(exc)}") from exc
    inputs = []
    for name, detail in runner.inputs.items():
        signature = [int(n) for n in detail.get("shape_signature", detail["shape"])]
        first = signature[0] if signature and signature[0] > 0 else "batch"  # -1: resizable
        inputs.append(Input(name, (first, *signature[1:])))
    return RunnerSession(runner, inputs)


def _try_run(session: Session, inputs: Arrays, batches: tuple[int, ...]) -> None:
    """One untimed run at each batch the row will be timed at: a model that cannot run is NotTimed, by its reason."""
    specs = list(session.get_inputs())
    missing = [spec.name for spec in specs if spec.name not in inputs]
    if missing:
        raise NotTimed(f"it takes input(s) {missing}; golden.npz holds {sorted(inputs)}")
    fixed = {spec.shape[0] for spec in specs if spec.shape and isinstance(spec.shape[0], int)}
    for batch in sorted(fixed) if fixed else batches:
        try:
            session.run(None, {spec.name: batch_of(inputs[spec.name], batch) for spec in specs})
        except Exception as exc:  # onnxruntime, torch and LiteRT share no exception base class
            raise NotTimed(f"it failed to run at batch {batch}: {first_line(exc)}") from exc


def _torch_threads() -> int | None:
    """torch's process-wide intra-op thread count now, to put back after timing (None: torch is not installed)."""
    if find_spec("torch") is None:
        return None
    import torch

    return torch.get_num_threads()


def versions() -> Mapping[str, str | None]:
    """The runtimes' package versions (None: not installed), read without importing them."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for key, packages in {
        "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
        "torch": ("torch",),
        "ai_edge_litert": ("ai-edge-litert",),
        "numpy": ("numpy",),
    }.items():
        found[key] = None
        for package in packages:
            with contextlib.suppress(metadata.PackageNotFoundError):
                found[key] = metadata.version(package)
                break
    return found
