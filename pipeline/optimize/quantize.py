"""The quantization every quantizing kind shares: settings, the report, and the frame around a kind's conversion.

A quantizing kind (int8_dynamic.py, int8_static.py, fp16.py; `Quantizer` below) writes its file
through one frame, whatever its conversion: the model is copied into scratch with every node named
(nodes.py; the model given is never modified), the excluded nodes checked, calibration samples
checked against the graph when the kind calibrates, onnxruntime's pre-processing (preprocess.py) run when the kind
wants it, then the kind's own `convert` step, and the result refused when onnxruntime cannot load it
or its signature changed (a symbolic dim that pre-processing renamed or fixed is put back first);
metadata kept, exporter debug info dropped. All of it goes through onnxruntime's own tools, so what
is written is what onnxruntime runs. `quantizers.py` finds the kind for a `QuantSettings.mode`.
"""

from __future__ import annotations

import math
import tempfile
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationMethod, QuantType

from pipeline.core.errors import ArtifactError, InputError, PipelineError
from pipeline.optimize.cache import QuantCache
from pipeline.optimize.calibration_feed import Progress, check_calibration, sample_axes
from pipeline.optimize.graph import (
    error_line,
    failing_nodes,
    keep_dim_names,
    keep_metadata,
    load,
    loads_in_onnxruntime,
    op_counts,
    signature_changes,
    strip_debug_info,
)
from pipeline.optimize.kind import Job, Kind, Made
from pipeline.optimize.nodes import (
    MODES,
    QUANT_OPS,
    already_int8,
    name_nodes,
    nodes_behind,
    quantizable_nodes,
    quantized_nodes,
)
from pipeline.optimize.order import sort_nodes
from pipeline.optimize.preprocess import preprocess
from pipeline.recipe.schema import OptimizeSpec
from pipeline.runtime.external_data import external, move_model, save_beside
from pipeline.runtime.sample_axes import SampleAxes

TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# onnxruntime's quantizer cannot type weights a transformers fusion made unless told
EXTRA_OPTIONS = {"DefaultTensorType": onnx.TensorProto.FLOAT}


@dataclass(frozen=True)
class QuantSettings:
    """How to quantize; every field is a choice onnxruntime.quantization offers."""

    mode: Literal["dynamic", "static", "fp16"]  # int8 weights + runtime activation ranges | calibrated QDQ | fp16
    per_channel: bool = False  # one weight scale per output channel instead of one per tensor (int8 modes)
    reduce_range: bool = False  # 7-bit weights: avoids int16 overflow on CPUs without VNNI (int8 modes)
    weight_type: Literal["int8", "uint8"] = "int8"
    activation_type: Literal["int8", "uint8"] = "uint8"  # static only; dynamic activations are always uint8
    calibration: Literal["minmax", "entropy", "percentile"] = "minmax"  # static only: how ranges are chosen
    nodes_to_exclude: tuple[str, ...] = ()  # node names left in fp32 (see quantizable_nodes)
    float_tail: bool = False  # static: the nodes after the last Conv/MatMul/Gemm stay fp32 (nodes.decode_tail)
    preprocess: bool = True  # shape inference + graph optimization before dynamic/static quantization

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("mode", self.mode, MODES),
            ("weight_type", self.weight_type, TYPES),
            ("activation_type", self.activation_type, TYPES),
            ("calibration", self.calibration, METHODS),
        ):
            if value not in choices:
                raise InputError(f"quantization {name} {value!r} is not one of {', '.join(choices)}")
        if isinstance(self.nodes_to_exclude, str) or not all(isinstance(n, str) for n in self.nodes_to_exclude):
            raise InputError(f"nodes_to_exclude must be a list of node names, got {self.nodes_to_exclude!r}")
        object.__setattr__(self, "nodes_to_exclude", tuple(self.nodes_to_exclude))

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "nodes_to_exclude": list(self.nodes_to_exclude)}

    def describe(self) -> str:
        """A short label, e.g. "static int8, per-channel, entropy, 2 nodes excluded"."""
        if self.mode == "fp16":
            parts = ["fp16"]
        else:
            parts = [f"{self.mode} {'uint8' if self.weight_type == 'uint8' else 'int8'}"]
            if self.mode == "static":
                parts[0] += f" (activations {self.activation_type})"
            parts += ["per-channel"] if self.per_channel else []
            parts += ["reduce-range"] if self.reduce_range else []
            parts += [self.calibration] if self.mode == "static" else []
            parts += ["decode tail in fp32"] if self.float_tail and self.mode == "static" else []
        excluded = len(self.nodes_to_exclude)
        parts += [f"{excluded} node{'s' if excluded != 1 else ''} excluded"] if excluded else []
        return ", ".join(parts)


@dataclass
class QuantReport:
    """What quantize did: the settings, what it quantized and what it left alone."""

    settings: dict[str, object]
    label: str
    preprocessed: bool  # whether the pre-processing step's result was quantized
    quant_ops: dict[str, int]  # quantization op type -> count in the output (QuantizeLinear, MatMulInteger...)
    quantized: dict[str, int]  # op type of a candidate node -> how many now run on quantized inputs
    left_float: list[str]  # candidate nodes still running in fp32 (the excluded ones among them)
    excluded: list[str]
    named: int  # nodes that had no name and were given one in the scratch copy
    calibration_samples: int
    weight_bytes_before: int
    weight_bytes_after: int
    warnings: list[str] = field(default_factory=list)
    debug_bytes_removed: int = 0  # per-node exporter metadata dropped from the output (see strip_debug_info)
    float_tail: list[str] = field(default_factory=list)  # nodes after the last Conv/MatMul/Gemm left in fp32

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class Conversion:
    """What a quantizing kind's `convert` step is given, and what it says back (`warnings`, `tail`)."""

    source: Path  # the graph to convert: named, and pre-processed when the kind pre-processes
    model: onnx.ModelProto  # that graph, loaded without external data (a kind needing the weights loads `source`)
    out: Path  # where `convert` writes the converted model
    settings: QuantSettings
    excluded: list[str]  # node names left in fp32, followed through pre-processing
    calibration: Mapping[str, np.ndarray] | None  # checked against the graph; only for a kind that calibrates
    samples: int  # how many calibration samples there are (0 without)
    progress: Progress | None
    cache: QuantCache | None  # one per search: pre-processing and calibrated ranges shared by its candidates
    warnings: list[str] = field(default_factory=list)  # what convert did otherwise than asked
    tail: list[str] = field(default_factory=list)  # nodes convert left in fp32 beyond `excluded`
    used: int = 0  # calibration samples convert really used
    axes: SampleAxes = field(default_factory=SampleAxes)  # the source's stamp: pre-processing may drop it
    external: bool = False  # `source` keeps its weights in external data: `out` is written so too (save_model)


class Quantizer(Kind[QuantSettings]):
    """A kind made by onnxruntime's quantization tools: its `mode`, whether it pre-processes and
    calibrates, and its `convert` step; the frame (`quantize`) and the stage hook (`make`) are shared."""

    mode: ClassVar[Literal["dynamic", "static", "fp16"]]  # QuantSettings.mode this kind converts
    preprocess: ClassVar[bool] = True  # onnxruntime's pre-processing (shape inference, fusions) first
    needs_samples: ClassVar[bool] = False  # calibrates on real samples: refused without them
    per_channel: ClassVar[bool] = False  # weight scales per output channel when the section leaves it unset

    def calibrates(self, spec: OptimizeSpec, real_samples: bool) -> bool:
        return self.needs_samples

    def skip(self, source: Path, config: QuantSettings) -> str:
        """An int8 kind of a model quantized already is not made (a note: nodes.already_int8)."""
        return already_int8(source, self.name) if self.precision == "int8" else ""

    def config(self, spec: OptimizeSpec, task: str) -> QuantSettings:
        """The section's settings; a detector's decode tail stays fp32 in static int8 (nodes.decode_tail)."""
        return QuantSettings(
            mode=self.mode,
            per_channel=self.per_channel if spec.per_channel is None else spec.per_channel,
            reduce_range=spec.reduce_range,
            activation_type=spec.activation_type,
            calibration=spec.calibration,
            float_tail=task == "detection" and self.needs_samples,
        )

    @abstractmethod
    def convert(self, step: Conversion) -> None:
        """Write `step.model` converted as `step.settings` say to `step.out` (onnxruntime's tool for this mode)."""

    def make(self, job: Job, config: QuantSettings) -> Made:
        job.say(f"{self.name}: {config.describe()}")
        work = job.scratch / f"{self.name}.work"
        calibration = job.calibration.inputs if job.calibration is not None and self.needs_samples else None
        report = self.quantize(job.source, job.dst, config, calibration, work, _calibrating(self.name, job.say))
        verdict = job.judge(job.dst, None, job.scratch)
        job.say(f"{self.name}: {'passed' if verdict.passed else 'FAILED'}: {verdict.detail}")
        return Made(self.name, self.precision, config.to_dict(), verdict, report.to_dict())

    def quantize(
        self,
        src: Path,
        dst: Path,
        settings: QuantSettings,
        calibration: Mapping[str, np.ndarray] | None = None,
        scratch: Path | None = None,
        progress: Progress | None = None,
        cache: QuantCache | None = None,
    ) -> QuantReport:
        """Write a quantized copy of the model at `src` to `dst` as `settings` say, and report it.

        `calibration`: real inputs, one array per graph input with the samples along axis 0; required
        by a kind that calibrates. `scratch`: where the intermediate files go (a temporary directory
        beside `dst` if not given). `progress(done, total)` is called per calibration batch. With
        `cache` (one per search), pre-processing runs once per graph and calibrated ranges are reused.
        """
        if settings.mode != self.mode:
            raise InputError(f"{self.name} makes mode {self.mode!r}, not {settings.mode!r}; use quantizers.quantize")
        if self.needs_samples and calibration is None:
            raise InputError(
                f"{settings.mode} quantization needs calibration samples: pass real training inputs (one array "
                "per model input), or use mode dynamic or fp16"
            )
        if scratch is None:
            with tempfile.TemporaryDirectory(prefix="pipe-quantize-", dir=Path(dst).parent) as tmp:
                return self.quantize(src, dst, settings, calibration, Path(tmp), progress, cache)
        original = load(src)  # the graph; weights kept beside it stay there (save_beside copies them)
        big = external(src)
        model = onnx.ModelProto()
        model.CopyFrom(original)
        named = name_nodes(model)
        names = {node.name for node in model.graph.node}
        _check_exclusions(src, settings, names)
        samples = check_calibration(model, dict(calibration)) if calibration is not None and self.needs_samples else 0
        scratch.mkdir(parents=True, exist_ok=True)
        named_path = scratch / "named.onnx"
        save_beside(model, Path(src).parent, named_path)
        del model
        warnings: list[str] = []
        source, excluded, preprocessed = named_path, list(settings.nodes_to_exclude), False
        if settings.preprocess and self.preprocess:
            source, excluded, preprocessed = preprocess(named_path, scratch / "preprocessed.onnx", excluded, warnings,
                                                         cache, big)  # fmt: skip
        out = scratch / "quantized.onnx"  # dst is written only once it checks out
        step = Conversion(source, load(source), out, settings, excluded, calibration if samples else None, samples,
                          progress, cache, warnings, [], samples, sample_axes(original), big)  # fmt: skip
        self._convert(step, names)
        result, stripped = _write_checked(out, Path(dst), original, settings, names)
        left_out = [*excluded, *step.tail]
        quantized, left_float = quantized_nodes(step.model, result, settings.mode, left_out)
        return QuantReport(
            settings.to_dict(),
            settings.describe(),
            preprocessed,
            {op: n for op, n in op_counts(result).items() if op.split(".")[-1] in QUANT_OPS},
            quantized,
            left_float,
            excluded,
            named,
            step.used,
            weight_bytes(original),
            weight_bytes(result),
            warnings,
            stripped,
            step.tail,
        )

    def _convert(self, step: Conversion, names: set[str]) -> None:
        """The kind's conversion, onnxruntime's bare exceptions turned into one ArtifactError with the fix."""
        try:
            self.convert(step)
        except PipelineError:
            raise
        except Exception as exc:  # onnxruntime's tools raise bare Exception/ValueError/KeyError as they go
            line = error_line(exc)
            raise ArtifactError(
                f"onnxruntime could not quantize {step.source.name} ({step.settings.describe()}): "
                f"{type(exc).__name__}: {line}; {_fix(step.model, line, names)}"
            ) from exc


def _check_exclusions(src: Path, settings: QuantSettings, names: set[str]) -> None:
    """Refuse a `nodes_to_exclude` naming a node the model does not have, with the nodes it could name."""
    unknown = [n for n in settings.nodes_to_exclude if n not in names]
    if unknown:
        known = quantizable_nodes(src, settings.mode)
        raise InputError(
            f"nodes_to_exclude names nodes the model does not have: {unknown}; "
            f"its {settings.mode} candidates are {known[:20]}{' ...' if len(known) > 20 else ''}"
        )


def _write_checked(
    out: Path, dst: Path, original: onnx.ModelProto, settings: QuantSettings, names: set[str]
) -> tuple[onnx.ModelProto, int]:
    """The converted model at `out`, put in order, checked against `original` and moved to `dst` with the
    original's dimension names and metadata; it and the debug attributes stripped from it."""
    result = load(out)
    sort_nodes(result.graph)  # an If branch pre-processing inlined can follow the If that reads it (order.py)
    keep_dim_names(result, original)
    check_output(original, result, out, settings, names)
    keep_metadata(result, original)
    stripped = strip_debug_info(result)
    onnx.save(result, str(out))  # beside its data, where it was read from
    move_model(out, dst)
    return result, stripped


def int8_options(settings: QuantSettings, excluded: list[str]) -> dict[str, object]:
    """The keyword arguments onnxruntime's dynamic and static quantizers share."""
    return dict(
        per_channel=settings.per_channel,
        reduce_range=settings.reduce_range,
        weight_type=TYPES[settings.weight_type],
        nodes_to_exclude=excluded or None,
    )


def _calibrating(name: str, say: Callable[[str], None]) -> Progress:
    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            say(f"{name}: calibrating {done}/{total} samples")

    return progress


def check_output(
    original: onnx.ModelProto, result: onnx.ModelProto, path: Path, settings: QuantSettings, names: set[str]
) -> None:
    """Refuse a result that onnxruntime cannot load or that changes the model's signature, naming the nodes
    of the source (`names`: the names nodes_to_exclude takes) that the node onnxruntime failed on stands for."""
    problems = [f"it changes the signature: {p}" for p in signature_changes(original, result)]
    error = loads_in_onnxruntime(path)
    problems += [f"onnxruntime cannot load it: {error}"] if error else []
    if not problems:
        return
    fix = _fix(result, error, names)
    raise ArtifactError(f"{settings.describe()} made a broken model ({'; '.join(problems)}); {fix}")


def _fix(model: onnx.ModelProto, error: str, names: set[str]) -> str:
    """The advice for an onnxruntime error about `model`: the source nodes (`names`) to exclude, when it names any."""
    blamed = sorted({name for node in failing_nodes(error) for name in nodes_behind(model, node, names)})
    if not blamed:
        return "try other settings"
    return f"exclude {', '.join(repr(n) for n in blamed)} (nodes_to_exclude) or try other settings"


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes the model's initializers hold (weights, biases, scales)."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.STRING:
            total += sum(len(s) for s in init.string_data)
        else:
            total += np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize * math.prod(init.dims)
    return total
