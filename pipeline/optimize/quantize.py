"""Quantization: an fp32 ONNX file in, a dynamic int8, static int8 (QDQ) or fp16 ONNX file out.

All three go through onnxruntime's own tools (onnxruntime.quantization, and the fp16 converter of
onnxruntime.transformers), so what is written is what onnxruntime runs. Static int8 fixes each
activation's range from calibration samples: they must be real inputs in the layout the graph
expects (the caller brings them; see calibration.py), never made-up ones.

Exclusion works by node name (nodes.py names the unnamed ones and lists each mode's candidates):
the model is first copied into scratch with those names. The model given is never modified.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import (
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.transformers.float16 import convert_float_to_float16

from pipeline.core.errors import ArtifactError, InputError, first_line
from pipeline.optimize.cache import Preprocessed, QuantCache
from pipeline.optimize.graph import (
    keep_dim_names,
    keep_metadata,
    load,
    loads_in_onnxruntime,
    op_counts,
    signature_changes,
    strip_debug_info,
)
from pipeline.optimize.nodes import (
    DYNAMIC_OP_TYPES,
    MODES,
    QUANT_OPS,
    decode_tail,
    name_nodes,
    quantizable_nodes,
    quantized_nodes,
)
from pipeline.optimize.samples import STRIDE, Progress, SampleReader, check_calibration, sample_reader

TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# onnxruntime's quantizer cannot type weights a transformers fusion made unless told (DESIGN.md section 5)
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


def quantize(
    src: Path,
    dst: Path,
    settings: QuantSettings,
    calibration: dict[str, np.ndarray] | None = None,
    scratch: Path | None = None,
    progress: Progress | None = None,
    cache: QuantCache | None = None,
) -> QuantReport:
    """Write a quantized copy of the model at `src` to `dst` as `settings` say, and report it.

    `calibration`: real inputs, one array per graph input with the samples along axis 0; required
    for static mode. `scratch`: where the intermediate files go (a temporary directory beside
    `dst` if not given). `progress(done, total)` is called per calibration batch, when calibration
    runs. With `cache` (one per search), pre-processing runs once per graph and static mode reuses
    the ranges an earlier call computed with the same method on the same graph.
    """
    if settings.mode == "static" and calibration is None:
        raise InputError(
            "static quantization needs calibration samples: pass real training inputs (one array "
            "per model input), or use mode dynamic or fp16"
        )
    if scratch is None:
        with tempfile.TemporaryDirectory(prefix="pipe-quantize-", dir=Path(dst).parent) as tmp:
            return quantize(src, dst, settings, calibration, Path(tmp), progress, cache)
    original = load(src)
    model = onnx.ModelProto.FromString(original.SerializeToString())
    named = name_nodes(model)
    unknown = [n for n in settings.nodes_to_exclude if n not in {node.name for node in model.graph.node}]
    if unknown:
        known = quantizable_nodes(src, settings.mode)
        raise InputError(
            f"nodes_to_exclude names nodes the model does not have: {unknown}; "
            f"its {settings.mode} candidates are {known[:20]}{' ...' if len(known) > 20 else ''}"
        )
    samples = check_calibration(model, calibration) if calibration is not None and settings.mode == "static" else 0
    scratch.mkdir(parents=True, exist_ok=True)
    named_path = scratch / "named.onnx"
    onnx.save(model, str(named_path))
    warnings: list[str] = []
    source, excluded, preprocessed = named_path, list(settings.nodes_to_exclude), False
    if settings.preprocess and settings.mode != "fp16":
        source, excluded, preprocessed = _preprocess(named_path, scratch / "preprocessed.onnx", excluded, warnings,
                                                     cache)  # fmt: skip
    quantized_from, out = load(source), scratch / "quantized.onnx"  # dst is written only once it checks out
    tail = []
    if settings.float_tail and settings.mode == "static":  # named after pre-processing, which may fuse nodes
        tail = [name for name in decode_tail(quantized_from) if name not in excluded]
    if settings.mode == "fp16":
        result = convert_float_to_float16(quantized_from, keep_io_types=True, node_block_list=excluded or None)
        _sort_topologically(result.graph)  # the converter appends the input casts last: the checker refuses that
        onnx.save(result, str(out))
    else:
        reader = None
        if calibration is not None and settings.mode == "static":
            reader = sample_reader(quantized_from, calibration, samples, progress, warnings)
            samples = reader.samples
        _quantize_int8(source, out, settings, [*excluded, *tail], reader, cache)
        result = load(out)
    keep_dim_names(result, original)
    _check_output(original, result, out, settings)
    keep_metadata(result, original)
    stripped = strip_debug_info(result)
    onnx.save(result, str(dst))
    quantized, left_float = quantized_nodes(quantized_from, result, settings.mode, [*excluded, *tail])
    return QuantReport(
        settings.to_dict(),
        settings.describe(),
        preprocessed,
        {op: n for op, n in op_counts(result).items() if op.split(".")[-1] in QUANT_OPS},
        quantized,
        left_float,
        excluded,
        named,
        samples,
        weight_bytes(original),
        weight_bytes(result),
        warnings,
        stripped,
        tail,
    )


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Reorder `graph.node` so every node comes after the nodes producing its inputs (stable otherwise)."""
    available = {t.name for t in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(range(len(graph.node)))
    order: list[int] = []
    while pending:
        ready = [i for i in pending if all(name in available for name in graph.node[i].input)]
        if not ready:  # a cycle, or an input from an outer scope: keep the rest as it was
            order += pending
            break
        for i in ready:
            available.update(graph.node[i].output)
        order += ready
        taken = set(ready)
        pending = [i for i in pending if i not in taken]
    copies = [onnx.NodeProto.FromString(graph.node[i].SerializeToString()) for i in order]
    del graph.node[:]
    graph.node.extend(copies)


class _PreprocessAdvice(logging.Filter):
    """Drops two onnxruntime warnings that say nothing to a pipe user: its advice to run pre-processing
    (pipe runs it, or reports why not), and "Axis 1 is out-of-range for weight" for every 1-D weight
    (a LayerNorm scale) under per-channel quantization, which it then quantizes per tensor as it should.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        advice = "consider" in message and "pre-processing" in message
        return not advice and "is out-of-range for weight" not in message


@contextlib.contextmanager
def _quiet_advice() -> Iterator[None]:
    root, advice = logging.getLogger(), _PreprocessAdvice()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


def _quantize_int8(
    source: Path,
    dst: Path,
    settings: QuantSettings,
    excluded: list[str],
    reader: SampleReader | None,
    cache: QuantCache | None,
) -> None:
    """onnxruntime's dynamic or static (QDQ) quantizer; its chatter on stdout is kept off the terminal.

    Dynamic mode is given DYNAMIC_OP_TYPES (never Conv). Static mode calibrates one batch per pass
    (STRIDE), into `cache`'s file for this method and graph when given, or reads the ranges from it.
    """
    # dynamic mode rewrites a Gemm `g` as MatMul `g_MatMul` before it quantizes: exclude both names
    renamed = [f"{n}_MatMul" for n in excluded] if settings.mode == "dynamic" else []
    common = dict(
        per_channel=settings.per_channel,
        reduce_range=settings.reduce_range,
        weight_type=TYPES[settings.weight_type],
        nodes_to_exclude=excluded + renamed or None,
    )
    try:
        with _quiet_advice():
            if settings.mode == "dynamic":
                quantize_dynamic(source, dst, op_types_to_quantize=list(DYNAMIC_OP_TYPES),
                                 extra_options=dict(EXTRA_OPTIONS), **common)  # fmt: skip
            elif reader is not None:  # quantize refused static mode without calibration samples
                kept = cache.ranges(settings.calibration, source) if cache is not None else None
                calibrates = kept is None or not kept.is_file()
                with contextlib.redirect_stdout(io.StringIO()):  # the entropy/percentile calibrators print()
                    quantize_static(
                        source,
                        dst,
                        reader,
                        quant_format=QuantFormat.QDQ,
                        activation_type=TYPES[settings.activation_type],
                        calibrate_method=METHODS[settings.calibration],
                        extra_options={**EXTRA_OPTIONS, **STRIDE},
                        calibration_cache_path=kept,
                        **common,
                    )
                if calibrates and cache is not None:
                    cache.computed.append(settings.calibration)
    except Exception as exc:  # onnxruntime.quantization raises bare Exception/ValueError/KeyError as it goes
        raise ArtifactError(
            f"onnxruntime could not quantize {source.name} ({settings.describe()}): "
            f"{type(exc).__name__}: {first_line(exc)}; try other settings or exclude the "
            "failing node"
        ) from exc


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    """Run inside `path`: onnxruntime's symbolic shape inference, when it gives up, dumps
    `sym_shape_infer_temp.onnx` and a uuid-named weights file into the current directory, which
    would litter the user's working directory (or the repository). pipe optimize runs this on its
    main thread alone, so changing the process's directory for the call is safe here.
    """
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _preprocess(
    named: Path, out: Path, excluded: list[str], warnings: list[str], cache: QuantCache | None = None
) -> tuple[Path, list[str], bool]:
    """onnxruntime's pre-processing of `named` into `out`: (the model to quantize, its exclusions, ran).

    Symbolic shape inference fails on graphs holding contrib ops (e.g. after an extended graph
    optimization), so a second try skips it. A node a fusion renamed (`MatMul_3` -> `MatMul_3/MatMulAddFusion`)
    is followed to its new name; an excluded node that vanished keeps the model unprocessed.
    With `cache`, a graph pre-processed before is not pre-processed again (same result, same warnings).
    """
    kept = cache.preprocessed(named, out) if cache is not None else None
    if kept is None:
        kept = _run_preprocess(named, out)
        if cache is not None:
            cache.keep_preprocessed(named, kept.path, kept.warnings)
    warnings += kept.warnings
    if kept.path is None:
        return named, excluded, False
    names = [node.name for node in load(out).graph.node]
    followed = []
    for name in excluded:
        renamed = [n for n in names if n == name or n.startswith(f"{name}/")]
        if not renamed:
            warnings.append(f"pre-processing removed excluded node {name!r}; quantized without pre-processing")
            return named, excluded, False
        followed += renamed
    return out, followed, True


def _run_preprocess(named: Path, out: Path) -> Preprocessed:
    error, warnings = "", []
    for skip_symbolic in (False, True):
        try:
            source, target = named.resolve(), out.resolve()  # absolute before the call runs elsewhere
            with _working_directory(target.parent):
                quant_pre_process(str(source), str(target), skip_symbolic_shape=skip_symbolic)
            break
        except Exception as exc:  # shape inference raises bare Exception on graphs it cannot follow
            error = f"{type(exc).__name__}: {first_line(exc)}"
    else:
        return Preprocessed(None, [f"pre-processing failed ({error}); quantized without it"])
    if error:
        warnings.append(f"symbolic shape inference failed ({error}); pre-processed with onnx shape inference only")
    return Preprocessed(out, warnings)


def _check_output(original: onnx.ModelProto, result: onnx.ModelProto, path: Path, settings: QuantSettings) -> None:
    """Refuse a result that onnxruntime cannot load or that changes the model's signature."""
    problems = [f"it changes the signature: {p}" for p in signature_changes(original, result)]
    error = loads_in_onnxruntime(path)
    problems += [f"onnxruntime cannot load it: {error}"] if error else []
    if problems:
        raise ArtifactError(
            f"{settings.describe()} made a broken model ({'; '.join(problems)}); try other settings or "
            "exclude the nodes named (nodes_to_exclude)"
        )


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes the model's initializers hold (weights, biases, scales)."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.STRING:
            total += sum(len(s) for s in init.string_data)
        else:
            total += np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize * math.prod(init.dims)
    return total
