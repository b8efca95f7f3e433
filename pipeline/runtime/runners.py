"""Runners: every model the verifier compares, called one way, named numpy arrays in -> named arrays out.

A runner is any callable `Runner`: the torch module a model was trained as (`torch_runner`), an
onnxruntime session (`OrtRunner`), a .tflite model (`tflite_candidate`, on LiteRT), a numpy
function in a test. `run_chunked` runs one over a split too large for a single call.

torch is imported inside `torch_runner` only: the server imports this package. The TFLite runner
is pipeline/runtime/tflite_runner.py, imported inside `tflite_candidate` only: that file is the stand-alone
runner a device copies (numpy and an interpreter, nothing of pipe), so the verifier uses it
rather than a second copy, and import-linter allows this one import from verify into edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError, InputError, first_line
from pipeline.runtime.sample_axes import SampleAxes
from pipeline.runtime.session import create_session

if TYPE_CHECKING:
    import onnxruntime as ort
    import torch

    from pipeline.artifact.tensors import TensorSpec

EVAL_CHUNK = 256  # samples per call over a whole split: bounded memory, few calls
# ... and at most this many bytes of one sample's inputs and outputs per call, measured on the first sample:
# a model's intermediate tensors grow with both. 256 pictures of 224x224 are 154 MB of inputs, and a conv
# net's activations for them several GB; PP-OCRv4's recognizer gives 1.06 MB of softmax per 184 KB picture,
# and 64 of them in one call took onnxruntime ~1 GB. 16 MB is 13 such pictures, or all 256 of a small input
CHUNK_BYTES = 16 << 20
FIRST_CALL = 8  # samples of the first call, whose outputs' size sizes the others


class Runner(Protocol):
    """Named inputs (each with a leading sample axis) -> named outputs for the same samples."""

    def __call__(self, inputs: Arrays, /) -> Arrays: ...


class OrtRunner:
    """An onnxruntime session as a Runner; `providers` says where it really runs.

    `axes`: how pipe's sample-leading arrays reach the model (pipeline/runtime/sample_axes.py); None
    feeds them as they are, in the model's own layout (pipe predict's inputs are).
    """

    def __init__(self, session: ort.InferenceSession, axes: SampleAxes | None = None) -> None:
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]
        self.providers: list[str] = session.get_providers()
        self.axes = axes
        self._run = axes.wrap(self._raw) if axes is not None else self._raw

    def _raw(self, inputs: Arrays) -> Arrays:
        return dict(zip(self.output_names, self.session.run(self.output_names, inputs), strict=True))

    def __call__(self, inputs: Arrays, /) -> Arrays:
        return self._run(inputs)


def ort_runner(model: str | Path | ort.InferenceSession, axes: SampleAxes | None = None) -> OrtRunner:
    """An OrtRunner for an ONNX file (CPU, one thread: the setting parity is defined on) or a session,
    fed pipe's sample-leading arrays.

    `axes`: where the model keeps its samples; None reads them from the model itself (its
    `pipe.sample_axes` stamp and its declared batch: a fixed batch runs that many samples a call).
    A session made here has onnxruntime's memory arena off (`create_session(arena=False)`): the gate
    runs a split in a few large chunks, and an arena would keep the largest chunk's intermediate
    tensors reserved for as long as the runner lives, once per session held. Pass a session already
    held to avoid loading a large model twice. A file onnxruntime cannot
    load raises ArtifactError.
    """
    if isinstance(model, str | Path):  # no arena: a gate's few large runs give their memory back
        model = create_session(model, "cpu", intra_op_threads=1, inter_op_threads=1, arena=False)
    return OrtRunner(model, axes if axes is not None else session_axes(model))


def session_axes(session: ort.InferenceSession) -> SampleAxes:
    """Where a loaded model keeps its samples: the `pipe.sample_axes` stamp pipe import wrote (none: as is)."""
    return SampleAxes.read(session.get_modelmeta().custom_metadata_map)


def torch_runner(module: torch.nn.Module, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> Runner:
    """A torch module as a Runner: inputs passed positionally in spec order, eval mode, no grad.

    Float outputs come back as float32 (a bf16/fp16 module is compared in fp32); the module must
    return one tensor per output spec, in order.
    """
    import torch

    module.eval()

    def run(arrays: Arrays, /) -> Arrays:
        with torch.no_grad():
            result = module(*(torch.from_numpy(np.ascontiguousarray(arrays[s.name])) for s in inputs))
        if isinstance(result, torch.Tensor):
            result = (result,)
        if len(result) != len(outputs):
            raise InputError(
                f"the module returned {len(result)} outputs, the manifest lists {len(outputs)} "
                f"({[s.name for s in outputs]}); make forward() return one tensor per output, in that order"
            )
        return {
            s.name: t.detach().float().numpy() if t.is_floating_point() else t.numpy()
            for s, t in zip(outputs, result, strict=True)
        }

    return run


@dataclass(frozen=True)
class Candidate:
    """What the gate checks: how to run it, what the table calls it, and its file when it is ONNX."""

    run: Runner
    name: str = "candidate"  # "ONNX", "TFLite": named in the rows; lowercased, the metric's key
    runtime: str = "the runtime"  # who refuses an input it cannot take: "onnxruntime", "LiteRT"
    onnx_path: Path | None = None  # an ONNX file: checker and strict shape inference run on it


def onnx_candidate(path: str | Path, session: ort.InferenceSession | None = None) -> Candidate:
    """The ONNX file at `path` as a candidate, run by `session` if given (else a CPU session of its own).

    Raises ArtifactError when onnxruntime cannot load the file.
    """
    return Candidate(ort_runner(session if session is not None else path), "ONNX", "onnxruntime", Path(path))


def tflite_candidate(
    path: str | Path,
    names: Mapping[str, str] | None = None,
    layout: str | Mapping[str, str] = "NCHW",
    num_threads: int = 1,
    runtime: str | None = None,
    normalize: Mapping[str, Mapping[str, Any]] | None = None,
    boxes: Mapping[str, Any] | None = None,
    batch: int | None = None,
) -> Candidate:
    """The .tflite file at `path` as a gate candidate ("TFLite", run by "LiteRT", else tflite-runtime).

    `names` maps pipe's tensor names to the model's where the converter renamed them; `layout`
    "NHWC" (or per tensor) when the model takes channels-last images and the caller gives NCHW;
    int8 inputs and outputs are quantized and dequantized with the model's own parameters, so the
    gate compares floats. `normalize` (input -> {"mean", "std"}) is applied to inputs whose normalization was
    taken out of the edge model, and `boxes` (output -> [width, height]) multiplies normalized boxes back to
    pixels, so the gate compares with model.onnx in its own units (None: as `feeding.json` beside the
    model says, like `names` and `layout`). `batch`: the model was converted at this fixed batch on purpose
    (onnx2tf converts a ConvTranspose only so), and is fed that many samples a call, as a device program
    feeds it; None feeds every call whole, so a batch a converter fixed unasked is refused at batch 2. A
    file no interpreter can load, or no interpreter installed, raises ArtifactError.
    """
    from pipeline.runtime.tflite_runner import TFLiteRunner

    try:
        runner = TFLiteRunner(path, num_threads=num_threads, names=names, layout=layout, runtime=runtime,
                              normalize=normalize, boxes=boxes)  # fmt: skip
    except (ValueError, RuntimeError, OSError, ImportError) as exc:
        raise ArtifactError(f"cannot load {path} as a TFLite model: {first_line(exc)}") from exc
    runtime = "LiteRT" if runner.runtime == "ai_edge_litert" else "tflite-runtime"
    if batch is not None and fixed_batch(runner.inputs.values()) != batch:
        raise ArtifactError(f"{path} was to take {batch} sample(s) a call, but its batch is "
                            f"{fixed_batch(runner.inputs.values()) or 'free'}")  # fmt: skip
    return Candidate(in_fixed_batches(runner, batch), "TFLite", runtime, None)


def fixed_batch(inputs: Iterable[Mapping[str, Any]]) -> int | None:
    """The batch a TFLite model was saved with when it is fixed (its first input's leading dim), else None."""
    first = next(iter(inputs), None)
    if first is None:
        return None
    signature = first.get("shape_signature", first["shape"])
    return int(signature[0]) if len(signature) and int(signature[0]) > 0 else None


def in_fixed_batches(run: Runner, batch: int | None) -> Runner:
    """`run` fed `batch` samples a call, outputs concatenated (as is when `batch` is None): the gate's batch
    1, 2 and 16 and the split reach a fixed-batch model as its device program would feed them."""
    if batch is None:
        return run

    def stepped(inputs: Arrays, /) -> Arrays:
        count = len(next(iter(inputs.values())))
        if count == batch:
            return run(inputs)
        if count % batch:
            raise InputError(f"{count} samples do not fill batches of {batch}, the batch the model was saved with")
        parts = [run({k: v[i : i + batch] for k, v in inputs.items()}) for i in range(0, count, batch)]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]} if parts else run(inputs)

    return stepped


def run_chunked(run: Runner, inputs: Arrays, names: Sequence[str] | None = None, chunk: int = EVAL_CHUNK) -> Arrays:
    """`run` over every sample of `inputs`, `chunk` samples per call, outputs concatenated.

    Fewer per call when that many samples' inputs and outputs together would pass CHUNK_BYTES: the first
    call takes at most FIRST_CALL samples and its outputs' bytes set the size of the others (a multiple
    of the first's, so a model with a fixed batch of 4 is still fed whole batches), since a model's
    intermediate tensors (what onnxruntime allocates during the call) grow with its outputs as much as
    with its inputs. `names` keeps only those outputs (all when None), so a large split does not hold
    outputs nobody reads.
    """
    if chunk < 1:
        raise InputError(f"chunk is {chunk}; give a positive number of samples per call")
    count = len(next(iter(inputs.values())))
    parts: dict[str, list[np.ndarray]] = {}

    def call(start: int, stop: int) -> Arrays:
        result = run({k: v[start:stop] for k, v in inputs.items()})
        for name in names if names is not None else result:
            parts.setdefault(name, []).append(result[name])
        return result

    in_bytes = sum(v[:1].nbytes for v in inputs.values())
    step = min(FIRST_CALL, chunk_size(in_bytes, chunk), max(count, 1))
    first = call(0, step)  # an empty split still runs once, for its output shapes
    if count > step:
        out_bytes = sum(np.asarray(v).nbytes for v in first.values()) // step
        size = max(step, chunk_size(in_bytes + out_bytes, chunk) // step * step)
        for start in range(step, count, size):
            call(start, start + size)
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def chunk_size(per_sample: int, chunk: int = EVAL_CHUNK) -> int:
    """Samples per call: `chunk`, fewer when that many samples' inputs and outputs (`per_sample` bytes each)
    would pass CHUNK_BYTES; at least one."""
    return max(1, min(chunk, CHUNK_BYTES // max(per_sample, 1)))
