"""torch -> ONNX: the dynamo exporter first, the TorchScript exporter as a logged fallback.

Works on any nn.Module whose forward takes the inputs positionally in manifest order. Symbolic dims
in the input specs ("batch", "sequence") become dynamic axes under the same names, so the ONNX
graph says `batch` where the manifest does; the parity gate then proves they really are dynamic.
torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError, PipelineError
from pipeline.export.opset import default_opset, explain_exporter_error, missing_operators, opset_advice

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Protobuf refuses messages over 2 GiB; keep a margin for the graph itself.
EXTERNAL_DATA_BYTES = 1_800_000_000
EXPORTERS = ("dynamo", "torchscript")


class ExportError(PipelineError):
    """Neither exporter could turn the module into ONNX; the message holds both reasons."""


@dataclass
class ExportResult:
    """Which exporter produced the file, and why the preferred one was not used."""

    exporter: str  # dynamo | torchscript | fused (a decoder written from its weights, fused_decoder.py)
    opset: int  # the default-domain opset the file really declares
    external_data: bool  # weights in `<file>.data` beside the model
    fallback_reason: str | None = None  # why dynamo was not used (None when it was)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exporter": self.exporter,
            "opset": self.opset,
            "external_data": self.external_data,
            "fallback_reason": self.fallback_reason,
        }


def dynamic_axes(specs: list[TensorSpec]) -> dict[str, dict[int, str]]:
    """{tensor name: {axis: dim name}} for every symbolic dim in the specs."""
    return {s.name: {i: d for i, d in enumerate(s.shape) if isinstance(d, str)} for s in specs}


def needs_external_data(module: torch.nn.Module) -> bool:
    """True when the weights are too large for one protobuf file (2 GiB limit)."""
    size = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
    return size > EXTERNAL_DATA_BYTES


def short_reason(exc: BaseException) -> str:
    """The useful part of an exporter exception: torch's 'Exception summary' or the first line."""
    text = str(exc)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1].split("(Refer to", 1)[0]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' '.join(lines)[:600]}"


def export_module(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    opset: int = 18,
    exporter: str = "dynamo",
) -> ExportResult:
    """Write `module` to `path` as ONNX and return how it was done.

    `exporter="dynamo"` tries torch.onnx.export(dynamo=True) and falls back to the TorchScript
    exporter, logging the reason; `"torchscript"` uses only the latter. The file is checked to
    declare the requested opset: an operator the opset lacks raises InputError naming it and the
    opset that has it, instead of the silently newer file the dynamo exporter would leave.
    """
    if exporter not in EXPORTERS:
        raise InputError(f"exporter {exporter!r} is not one of {', '.join(EXPORTERS)}")
    if len(example_inputs) != len(inputs):
        raise InputError(
            f"{len(example_inputs)} example inputs for {len(inputs)} input specs ({[s.name for s in inputs]})"
        )
    path = Path(path)
    external = needs_external_data(module)
    module.eval()
    reason = None
    if exporter == "dynamo":
        try:
            _export_dynamo(module, example_inputs, inputs, outputs, path, opset, external)
        except Exception as exc:  # any exporter failure: fall back, keep the reason
            reason = short_reason(exc)
            log.warning("dynamo exporter failed, falling back to the TorchScript exporter: %s", reason)
    if exporter == "torchscript" or reason is not None:
        try:
            _export_torchscript(module, example_inputs, inputs, outputs, path, opset, external)
        except Exception as exc:  # the last exporter: report both reasons
            explained = explain_exporter_error(str(exc))
            if explained:
                raise InputError(explained) from exc
            before = f"dynamo exporter: {reason}\n  " if reason else ""
            raise ExportError(
                f"the model could not be exported to ONNX:\n  {before}TorchScript exporter: {short_reason(exc)}\n"
                "Make forward() traceable (no data-dependent Python control flow), or set export.opset"
            ) from exc
    model = onnx.load(str(path), load_external_data=False)
    check_requested_opset(model, opset)
    return ExportResult(
        exporter="dynamo" if reason is None and exporter == "dynamo" else "torchscript",
        opset=default_opset(model) or opset,
        external_data=external,
        fallback_reason=reason,
    )


def check_requested_opset(model: onnx.ModelProto, requested: int) -> None:
    """Refuse a file whose opset is not the one asked for, naming the operators responsible."""
    actual = default_opset(model)
    if actual is None or actual == requested:
        return
    gaps = missing_operators(model, requested)
    if gaps:
        raise InputError(opset_advice(gaps, requested) + f" (the exporter left the model at opset {actual})")
    raise InputError(
        f"the exporter wrote ONNX opset {actual}, not the requested {requested}, and could not convert it down; "
        f"choose --opset {actual}"
    )


def _quiet() -> warnings.catch_warnings:
    """Exporters warn about their own internals (deprecations we cannot fix); log them instead of failing."""
    return warnings.catch_warnings(record=True)


@contextlib.contextmanager
def _torch_onnx_logs_quiet() -> Iterator[None]:
    """torch.onnx logs notes such as 'torchvision is not installed' at WARNING; pipe reports what matters."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _log_warnings(caught: list[warnings.WarningMessage]) -> None:
    for w in caught:
        log.debug("exporter warning: %s: %s", w.category.__name__, w.message)


def _export_dynamo(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    opset: int,
    external: bool,
) -> None:
    import torch

    axes = dynamic_axes(inputs)
    # One {axis: name} per positional input; torch.onnx turns string names into dynamic dims of that name.
    shapes = tuple(axes[s.name] or None for s in inputs)
    with _quiet() as caught, _torch_onnx_logs_quiet(), torch.no_grad():
        warnings.simplefilter("always")
        program = torch.onnx.export(
            module,
            example_inputs,
            input_names=[s.name for s in inputs],
            output_names=[s.name for s in outputs],
            opset_version=opset,
            dynamo=True,
            dynamic_shapes=shapes,
            external_data=external,
            optimize=True,
            verbose=False,
        )
        if program is None:
            raise ExportError("torch.onnx.export(dynamo=True) returned no program")
        program.save(str(path), external_data=external)
    _log_warnings(caught)


def _export_torchscript(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    opset: int,
    external: bool,
) -> None:
    import torch

    with _quiet() as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.onnx.export(
            module,
            example_inputs,
            str(path),
            input_names=[s.name for s in inputs],
            output_names=[s.name for s in outputs],
            opset_version=opset,
            dynamo=False,
            dynamic_axes=dynamic_axes(inputs) | dynamic_axes(outputs),
            external_data=external,
        )
    _log_warnings(caught)
