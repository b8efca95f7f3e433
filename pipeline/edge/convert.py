"""ONNX -> TFLite with onnx2tf: fp32, fp16 and int8 files from one ONNX model.

`convert` is a pure function: a model file in, .tflite files in a scratch directory out, each
described the way a device program must feed it. It never touches the file it is given: onnx2tf
overwrites its input, so it converts a copy, with the names it would reject rewritten
(pipeline/edge/graphcopy.py). onnx2tf runs in a child process (pipeline/edge/onnx2tf_child.py),
so tensorflow never loads in pipe's own process, and onnx2tf's global state and prints stay out.
The child first passes the copy through onnxslim (`EdgeSettings.slim`, with onnx2tf's own onnxsim
then off): a YOLOv8 head converts only that way. `EdgeSettings.input_dims` fixes free dims of the
copy's inputs first (pipeline/edge/shapes.py), and `EdgeSettings.onnx2tf` adds onnx2tf options
(pipeline/edge/attempts.py tries a few in turn). `EdgeSettings.normalize_inputs` and `boxes` move
what int8's one scale per tensor cannot hold out of the copy (pipeline/edge/scaling.py); the inputs and
outputs of each `Converted` then carry `normalize` and `boxes_normalized_by` for the caller.

What this module does about onnx2tf's habits (docs/edge.md, The conversion):
- it downloads sample images whenever every input is a fixed-size 3-channel 4-D image, unless
  `calibration_image_sample_data_20x128x128x3_float32.npy` is in its working directory: that file
  is always written there, made from the caller's samples (zeros when there is no such input),
  and the child's HTTP(S) proxy points at a closed port, so any other download fails at once;
- the batch stays dynamic (never `-b 1`: a fixed batch made a transformer silently wrong);
- int8 calibrates on the caller's samples (`custom_input_op_name_np_data_path`, mean 0 and std 1,
  since our models hold their own normalization) in the layout the converted graph takes;
- full-integer int8 cannot calibrate integer inputs (token ids), so int8 is skipped for them.

The int8 file is, with `int8_io="integer"` (pictures), onnx2tf's `*_full_integer_quant.tflite`:
int8 inputs and outputs, every op in int8. It is the one integer-only accelerators (Edge TPU,
Ethos-U, Hexagon) and microcontrollers run whole; a device program quantizes its input with the
input's `scale` and `zero_point` and dequantizes the output the same way (both are in
`Converted.inputs`/`outputs`, and pipeline/runtime/tflite_runner.py does it). With
`int8_io="float"` (tabular and other non-picture inputs, whose columns span very different ranges
that one input scale would crush) it is the float-I/O `*_integer_quant.tflite`: weights and
activations int8 inside, a quantize op after each float input and a dequantize op before each float
output, fed like fp32.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipeline.core.errors import CheckFailed, InputError
from pipeline.edge.graphcopy import dims_of, sanitize, write_input_dims
from pipeline.edge.onnx2tf_child import LOG, reason, run_onnx2tf
from pipeline.edge.scaling import normalize_boxes, take_normalization

PRECISIONS = ("fp32", "fp16", "int8")
SUFFIX = {"fp32": "float32", "fp16": "float16"}  # onnx2tf's <name>_<suffix>.tflite (int8: INT8_SUFFIX)
INT8_SUFFIX = {"integer": "full_integer_quant", "float": "integer_quant"}  # by int8_io: int8 or float inputs/outputs
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"  # onnx2tf reads it instead of downloading
SAMPLE_SHAPE = (20, 128, 128, 3)
COPY = "model.onnx"  # the copy onnx2tf converts (and overwrites), in the scratch directory
FLOAT_TYPES = (1, 10, 11, 16)  # ONNX FLOAT, FLOAT16, DOUBLE, BFLOAT16: the input types int8 can calibrate

Progress = Callable[[str], None]
Inputs = list[tuple[str, int, list[int | str]]]  # model.onnx's inputs: name, ONNX element type, dims


@dataclass(frozen=True)
class EdgeSettings:
    """What `convert` makes."""

    precisions: tuple[str, ...] = PRECISIONS  # of fp32, fp16, int8
    layout: Literal["nhwc", "nchw"] = "nhwc"  # 4-D image inputs: NHWC for devices, or keep the server's NCHW
    timeout_s: float = 1800.0  # onnx2tf is stopped after this long and the conversion fails (edge.timeout_s)
    slim: bool = True  # onnxslim the copy first, and turn onnx2tf's own onnxsim off
    onnx2tf: dict[str, Any] = field(default_factory=dict)  # more onnx2tf.convert keyword arguments
    input_dims: dict[str, list[int | str]] = field(default_factory=dict)  # input -> dims written into the copy
    int8_io: Literal["integer", "float"] = "integer"  # int8's inputs and outputs: int8 (pictures) or float
    # [batch, F] inputs whose leading (x - mean) / std is taken out of the copy (scaling.py): the caller applies it
    normalize_inputs: tuple[str, ...] = ()
    boxes: dict[str, tuple[int, int]] = field(default_factory=dict)  # detector output -> (W, H) its boxes divide by


@dataclass
class Converted:
    """One .tflite file and what a device program needs to feed it."""

    precision: str  # fp32 | fp16 | int8
    path: Path  # <workdir>/model.<precision>.tflite
    input_layout: str  # NHWC or NCHW: the 4-D image inputs' layout; NC (features) or NT (tokens) without one
    inputs: list[dict[str, Any]]  # model.onnx's order and names: name, dtype, shape (-1: resizable), scale, zero_point
    outputs: list[dict[str, Any]]  # the same; scale and zero_point are None for a float tensor
    names: dict[str, str] = field(default_factory=dict)  # model.onnx's I/O name -> the edge model's, where they differ
    converter: str = ""  # e.g. "onnx2tf 1.28.8"
    seconds: float = 0.0  # wall time: fp32 includes the graph conversion; fp16 and int8 the time each added after it
    warnings: list[str] = field(default_factory=list)  # e.g. a precision asked for and not made, and why
    int8_io: str = ""  # int8 only: "integer" (int8 inputs and outputs) or "float" (float I/O, int8 inside)
    fixed_batch: int | None = None  # converted at this batch on purpose (attempts.py BATCH_ONE): fed that many a call

    def scaling(self) -> dict[str, dict[str, Any]]:
        """The runner's `normalize` and `boxes`: the inputs the caller normalizes, the outputs it multiplies back."""
        return {
            "normalize": {t["name"]: t["normalize"] for t in self.inputs if t.get("normalize")},
            "boxes": {t["name"]: t["boxes_normalized_by"] for t in self.outputs if t.get("boxes_normalized_by")},
        }


def convert(
    onnx_path: Path,
    workdir: Path,
    settings: EdgeSettings,
    calibration: dict[str, np.ndarray] | None,
    progress: Progress | None = None,
) -> list[Converted]:
    """Convert `onnx_path` to the TFLite files `settings` asks for, in `workdir`.

    `calibration`: real samples per model.onnx input name, in model.onnx's layout (NCHW images),
    needed for int8. Returns one `Converted` per file made, in `settings.precisions` order; a
    precision that cannot be made (int8 of a model with integer inputs, or int8 that onnx2tf
    failed to quantize) is missing from the list and every returned model's `warnings` says why.
    A model onnx2tf cannot convert raises CheckFailed with onnx2tf's own reason.
    """
    say = progress or (lambda _message: None)
    unknown = [p for p in settings.precisions if p not in PRECISIONS]
    if unknown or not settings.precisions:
        raise InputError(f"edge precisions {list(settings.precisions)} are not valid: choose from {list(PRECISIONS)}")
    if settings.layout not in ("nhwc", "nchw"):
        raise InputError(f"edge layout {settings.layout!r} is not valid: choose 'nhwc' or 'nchw'")
    workdir = Path(workdir)
    scratch = workdir / "onnx2tf"
    scratch.mkdir(parents=True, exist_ok=True)
    copy = _prepare_copy(onnx_path, scratch, settings, calibration, say)
    precisions = _precisions(settings, copy)
    (scratch / "convert.json").write_text(json.dumps(_onnx2tf_options(scratch, settings, copy, precisions)))

    images = f"; image inputs {settings.layout.upper()}" if any(len(d) == 4 for _, _, d in copy.inputs) else ""
    say(f"onnx2tf: converting {onnx_path.name} ({', '.join(precisions)}{images})")
    started = time.time()
    run_onnx2tf(scratch, settings.timeout_s, {v: k for k, v in copy.renamed.items()})
    made: list[Converted] = []
    previous = started
    for precision in precisions:
        suffix = INT8_SUFFIX[settings.int8_io] if precision == "int8" else SUFFIX[precision]
        produced = scratch / "out" / f"{Path(COPY).stem}_{suffix}.tflite"
        if not produced.is_file():
            if precision != "int8":
                raise CheckFailed(f"onnx2tf finished but wrote no {precision} model: {reason(scratch / LOG, {})}")
            copy.warnings.append(f"int8 not made: onnx2tf could not quantize the model: {reason(scratch / LOG, {})}")
            continue
        finished = produced.stat().st_mtime
        target = workdir / f"model.{precision}.tflite"
        produced.replace(target)
        made.append(_describe(precision, target, copy.inputs, copy.outputs, copy.renamed, settings.layout,
                              round(max(finished - previous, 0.0), 2)))  # fmt: skip
        previous = max(previous, finished)
        if precision == "int8":
            made[-1].int8_io = settings.int8_io
        for entry in made[-1].inputs:
            if entry["name"] in copy.normalized:
                entry["normalize"] = copy.normalized[entry["name"]]
        for entry in made[-1].outputs:
            if entry["name"] in copy.boxed:
                entry["boxes_normalized_by"] = copy.boxed[entry["name"]]
    for converted in made:
        converted.warnings = list(copy.warnings) + converted.warnings
    say(f"onnx2tf: {', '.join(f'{c.precision} {c.seconds:.1f} s' for c in made)} (total {time.time() - started:.1f} s)")
    return made


@dataclass
class _Copy:
    """The copy onnx2tf converts, as written in the scratch directory, and what writing it changed."""

    inputs: Inputs  # model.onnx's inputs, their free dims fixed as `EdgeSettings.input_dims` says
    outputs: list[tuple[str, list[int | str]]]
    renamed: dict[str, str]  # model.onnx's name -> the copy's, where onnx2tf would reject the name
    normalized: dict[str, dict[str, list[float]]]  # input -> the mean and std taken out of the copy
    boxed: dict[str, list[int]]  # detector output -> [width, height] its boxes were divided by
    calibration: dict[str, np.ndarray] | None  # the caller's samples, normalized where the copy no longer is
    warnings: list[str]  # for every model made: what was asked for and not done, and why


def _prepare_copy(
    onnx_path: Path, scratch: Path, settings: EdgeSettings, calibration: dict[str, np.ndarray] | None, say: Progress
) -> _Copy:
    """Write the copy of `onnx_path` onnx2tf converts: its weights inline, its input dims fixed, the
    normalization and box scaling int8 cannot hold taken out (scaling.py), names onnx2tf rejects rewritten."""
    import onnx

    model = onnx.load(str(onnx_path))  # external data, if any, is read here and saved inline in the copy
    write_input_dims(model.graph, settings.input_dims)
    inputs = [(v.name, v.type.tensor_type.elem_type, dims_of(v)) for v in model.graph.input if v.name not in
              {t.name for t in model.graph.initializer}]  # fmt: skip
    outputs = [(v.name, dims_of(v)) for v in model.graph.output]
    warnings: list[str] = []
    normalized = take_normalization(model, list(settings.normalize_inputs))
    for name, stats in normalized.items():
        say(f"edge: {name}'s leading (x - mean) / std taken out of the converted graph: the caller applies it in float")
        if calibration is not None and name in calibration:
            mean, std = np.float32(stats["mean"]), np.float32(stats["std"])
            calibration = {**calibration, name: (np.asarray(calibration[name], np.float32) - mean) / std}
    boxed = {}
    for name, (width, height) in settings.boxes.items():
        try:
            where = normalize_boxes(model, name, width, height)
        except ValueError as exc:
            warnings.append(f"boxes of {name!r} not normalized (int8 shares one scale with the scores): {exc}")
            continue
        boxed[name] = [width, height]
        say(f"edge: {name}'s boxes divided by the image size {width}x{height} ({where}); the runner multiplies back")
    renamed = sanitize(model.graph)
    onnx.save(model, str(scratch / COPY))
    return _Copy(inputs, outputs, renamed, normalized, boxed, calibration, warnings)


def _precisions(settings: EdgeSettings, copy: _Copy) -> list[str]:
    """The precisions to make: int8 left out (and why, in the warnings) for a model fed integers."""
    precisions = list(dict.fromkeys(settings.precisions))
    if "int8" in precisions and (ints := [name for name, kind, _ in copy.inputs if kind not in FLOAT_TYPES]):
        precisions.remove("int8")
        copy.warnings.append(
            f"int8 not made: full-integer int8 calibrates float inputs only, and {ints} hold integers (token ids); "
            "use fp16 for this model"
        )
        if not precisions:
            raise InputError(f"{copy.warnings[-1]}; ask for fp32 or fp16")
    if "int8" in precisions and copy.calibration is None:
        raise InputError("int8 needs real calibration samples (calibration=None was given); or leave int8 out")
    return precisions


def _onnx2tf_options(scratch: Path, settings: EdgeSettings, copy: _Copy, precisions: list[str]) -> dict[str, Any]:
    """onnx2tf.convert's keyword arguments, with the sample-image and calibration files they name written beside
    the copy: layouts kept or transposed, onnxslim, the caller's own options, int8 calibrated on its samples."""
    inputs, renamed, calibration = copy.inputs, copy.renamed, copy.calibration
    # onnx2tf transposes every 3-D, 4-D and 5-D input to channels-last; only 4-D images may change layout
    nhwc = {n for n, _, dims in inputs if len(dims) == 4 and settings.layout == "nhwc"}
    kept = [renamed.get(n, n) for n, _, dims in inputs if len(dims) in (3, 4, 5) and n not in nhwc]
    np.save(scratch / SAMPLE_FILE, _sample_images(inputs, calibration))
    kwargs: dict[str, Any] = {
        "input_onnx_file_path": COPY,
        "output_folder_path": "out",
        "non_verbose": True,
        "keep_ncw_or_nchw_or_ncdhw_input_names": kept or None,
        "slim": settings.slim,
        "not_use_onnxsim": settings.slim,
        **settings.onnx2tf,
    }
    if "int8" in precisions and calibration is not None:
        kwargs["output_integer_quantized_tflite"] = True
        kwargs["custom_input_op_name_np_data_path"] = _calibration_files(scratch, inputs, renamed, nhwc, calibration)
    return kwargs


def _sample_images(inputs: Inputs, calibration: dict[str, np.ndarray] | None) -> np.ndarray:
    """onnx2tf's sample-image file: the caller's 3-channel images, NHWC, resized to 128x128, 20 of them.

    onnx2tf reads it only for a model whose inputs are all fixed-size 3-channel images (for its own
    output check), where it would otherwise download COCO pictures; zeros when there are none.
    """
    for name, _, dims in inputs:
        if len(dims) == 4 and dims[1] == 3 and calibration is not None and name in calibration:
            x = np.asarray(calibration[name], np.float32)
            rows = np.arange(128) * x.shape[2] // 128
            cols = np.arange(128) * x.shape[3] // 128
            nhwc = x[:, :, rows][:, :, :, cols].transpose(0, 2, 3, 1)  # nearest neighbour to 128x128
            return np.resize(nhwc, SAMPLE_SHAPE).astype(np.float32)
    return np.zeros(SAMPLE_SHAPE, np.float32)


def _calibration_files(
    scratch: Path,
    inputs: Inputs,
    renamed: dict[str, str],
    nhwc: set[str],
    calibration: dict[str, np.ndarray],
) -> list[list[Any]]:
    """One .npy per input in the layout the converted graph takes, as onnx2tf's [name, file, mean, std] rows."""
    missing = [name for name, _, _ in inputs if name not in calibration]
    if missing:
        raise InputError(f"int8 calibration has no samples for input(s) {missing}; it has {sorted(calibration)}")
    rows = []
    for i, (name, _, dims) in enumerate(inputs):
        x = np.asarray(calibration[name], np.float32)
        if x.ndim != len(dims):
            raise InputError(f"calibration samples for {name!r} have shape {list(x.shape)}; the model takes {dims}")
        if name in nhwc:
            x = x.transpose(0, 2, 3, 1)
        path = scratch / f"calibration_{i}.npy"
        np.save(path, np.ascontiguousarray(x))
        rows.append([renamed.get(name, name), path.name, 0.0, 1.0])  # mean 0, std 1: normalization is in the model
    return rows


def _describe(
    precision: str,
    path: Path,
    inputs: Inputs,
    outputs: list[tuple[str, list[int | str]]],
    renamed: dict[str, str],
    layout: str,
    seconds: float,
) -> Converted:
    """What the .tflite at `path` takes and gives, read with the LiteRT interpreter, in model.onnx's names and order."""
    from importlib.metadata import version

    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    warnings = []
    by_index = {d["index"]: d for d in [*interpreter.get_input_details(), *interpreter.get_output_details()]}
    signatures = interpreter._get_full_signature_list()
    if len(signatures) == 1:  # int8: keys are the (sanitized) input names and output_0, output_1, ...
        (signature,) = signatures.values()
        own_in = {key: by_index[i] for key, i in signature["inputs"].items()}
        own_out = {key: by_index[i] for key, i in signature["outputs"].items()}
        out_keys = [f"output_{k}" for k in range(len(outputs))]
    else:  # fp32/fp16: input tensors keep the (sanitized) names; outputs are Identity, Identity_1, ...
        own_in = {d["name"]: d for d in interpreter.get_input_details()}
        own_out = {d["name"]: d for d in interpreter.get_output_details()}
        out_keys = ["Identity"] + [f"Identity_{k}" for k in range(1, len(outputs))]
    in_keys = [renamed.get(name, name) for name, _, _ in inputs]
    if set(in_keys) != set(own_in) or set(out_keys) != set(own_out):
        warnings.append(
            f"onnx2tf named the I/O {sorted(own_in)}, {sorted(own_out)}: matched to model.onnx's by position"
        )
        in_keys = list(own_in)[: len(inputs)]
        out_keys = list(own_out)[: len(outputs)]

    def entry(name: str, detail: dict[str, Any]) -> dict[str, Any]:
        scale, zero_point = detail["quantization"]
        shape = [int(n) for n in detail["shape_signature"]]
        if not scale:
            return {
                "name": name,
                "dtype": np.dtype(detail["dtype"]).name,
                "shape": shape,
                "scale": None,
                "zero_point": None,
            }
        return {"name": name, "dtype": np.dtype(detail["dtype"]).name, "shape": shape, "scale": float(scale),
                "zero_point": int(zero_point)}  # fmt: skip

    described_in = [entry(name, own_in[key]) for (name, _, _), key in zip(inputs, in_keys, strict=True)]
    described_out = [entry(name, own_out[key]) for (name, _), key in zip(outputs, out_keys, strict=True)]
    names = {}
    for (name, *_), key in [*zip(inputs, in_keys, strict=True), *zip(outputs, out_keys, strict=True)]:
        if key != name:
            names[name] = key
    for (name, dims), d in zip(outputs, described_out, strict=True):
        static = [(a, b) for a, b in zip(dims, d["shape"], strict=False) if isinstance(a, int) and b != -1]
        if len(dims) != len(d["shape"]) or any(a != b for a, b in static):
            warnings.append(f"output {name!r} is {d['shape']} in the edge model but {dims} in model.onnx")
    has_images = any(len(dims) == 4 for _, _, dims in inputs)
    # no image input: nothing is transposed, and the record says the inputs' own layout (a table's NC)
    flat = "NC" if any(kind in FLOAT_TYPES for _, kind, _ in inputs) else "NT"
    return Converted(
        precision=precision,
        path=path,
        input_layout=layout.upper() if has_images else flat,
        inputs=described_in,
        outputs=described_out,
        names=names,
        converter=f"onnx2tf {version('onnx2tf')}",
        seconds=seconds,
        warnings=warnings,
    )
