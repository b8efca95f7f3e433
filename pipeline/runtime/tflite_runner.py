"""Run a .tflite model with named numpy arrays in and out: one stand-alone file for a device.

This file imports numpy and a TFLite interpreter, `ai_edge_litert` (LiteRT) when present, else
`tflite_runtime` (the interpreter many devices still have), and nothing else: not the rest of
pipe, not tensorflow. Copy it next to a model and run it anywhere those two packages exist:

    python tflite_runner.py model.int8.tflite golden.npz

prints one JSON line: the runtime used and, per output, the largest absolute difference from the
golden outputs (`in.<name>` arrays in, `out.<name>` arrays compared). How to feed the model (its
layout, the tensors the converter renamed) comes from `feeding.json` beside it, which the edge
stage writes into `edge/`; without that file, `--layout` and `--name` say it. `make edge-check`
runs it in `.venv-edge` (numpy<2 and tflite-runtime 2.14, nothing else).

Why it lives in `pipeline/runtime/` although it is the edge stage's deliverable, the file a device
program copies: the verifier and `pipe predict` run edge models through it too, and it imports
nothing of pipe, so it can sit under any layer. pipeline/runtime/runners.py imports this one
module (inside `tflite_candidate`); pyproject's import-linter contract `tflite-runner-alone`
keeps this file free of every other pipe module and framework. It stays one file past the ~400
lines a module is usually split at: a device gets this file alone (`scp` it with the model), so the
runner and its command line cannot live in two.

`TFLiteRunner` speaks the verifier's runner shape (named arrays in, named arrays out) and hides
what differs on a device: input names the converter rewrote (`names`), a batch size other than
the one the model was saved with (resize and re-allocate), int8/uint8/int16 inputs and outputs
(quantized and dequantized with each tensor's scale and zero point), a model that takes NHWC
images from a caller that holds NCHW ones (`layout`), and what the edge conversion moved out of the
model for int8's sake: a tabular input's leading (x - mean) / std (`normalize`, applied in float
before feeding) and a detector's boxes divided by the image size (`boxes`, multiplied back).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

RUNTIMES = ("ai_edge_litert", "tflite_runtime")  # in order of preference
FEEDING_FILE = "feeding.json"  # beside the models: how to feed each one (written by `pipe export --target edge`)
# the caller's layout is always channels-first; NHWC names a model that wants channels-last; NC (features)
# and NT (tokens) name a model without image inputs, where nothing is transposed
LAYOUTS = ("NCHW", "NHWC", "NC", "NT")
QUANTIZED = (np.int8, np.uint8, np.int16)  # integer tensors that carry a (scale, zero point)

Arrays = dict[str, np.ndarray]


def load_interpreter_class(runtime: str | None = None) -> tuple[Any, str]:
    """The Interpreter class of `runtime` (one of RUNTIMES) or of the first one installed, and its name."""
    if runtime is not None and runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {list(RUNTIMES)}")
    for name in (runtime,) if runtime else RUNTIMES:
        try:
            if name == "ai_edge_litert":
                from ai_edge_litert.interpreter import Interpreter
            else:
                from tflite_runtime.interpreter import Interpreter
        except ImportError:
            continue
        return Interpreter, name
    wanted = runtime or " or ".join(RUNTIMES)
    raise ImportError(
        f"no TFLite interpreter: {wanted} is not installed; pip install ai-edge-litert (or tflite-runtime)"
    )


def runtime_version(runtime: str) -> str:
    """The installed version of `runtime`'s package, or "unknown"."""
    from importlib import metadata

    try:
        return metadata.version(runtime.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "unknown"


class TFLiteRunner:
    """A .tflite model as a runner: `runner({"x": array}) -> {"logits": array}`.

    `names`: pipe's tensor name -> the model's, for inputs and outputs the converter renamed (a
    model's own name is its signature's key when it has one signature, else its tensor name
    without `serving_default_` and `:0`). `layout`: "NHWC" when the model takes channels-last
    tensors while the caller gives channels-first ones; a string applies to every 4-D input and
    output, a mapping names tensors one by one (by pipe's name). Either left out (None) is read
    from `feeding.json` beside the model when there is one (`self.feeding` is then its path),
    else no renames and "NCHW". `runtime`: force one of RUNTIMES.
    """

    def __init__(
        self,
        path: str | Path,
        num_threads: int = 1,
        names: Mapping[str, str] | None = None,
        layout: str | Mapping[str, str] | None = None,
        runtime: str | None = None,
        normalize: Mapping[str, Mapping[str, Any]] | None = None,
        boxes: Mapping[str, Any] | None = None,
    ) -> None:
        interpreter_class, self.runtime = load_interpreter_class(runtime)
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no TFLite model at {self.path}")
        self.feeding: Path | None = None
        if names is None or layout is None or normalize is None or boxes is None:
            entry = read_feeding(self.path)
            if entry is not None:
                self.feeding = self.path.parent / FEEDING_FILE
                names = entry.get("names", {}) if names is None else names
                layout = entry.get("layout", "NCHW") if layout is None else layout
                if normalize is None:
                    normalize = {t["name"]: t["normalize"] for t in entry.get("inputs", []) if t.get("normalize")}
                if boxes is None:
                    boxes = {t["name"]: t["boxes_normalized_by"] for t in entry.get("outputs", [])
                             if t.get("boxes_normalized_by")}  # fmt: skip
        layout = "NCHW" if layout is None else layout
        # the model takes (x - mean) / std of these inputs, given raw by the caller; these outputs give boxes
        # (channels 0..3 of axis 1: cx, cy, w, h) divided by [width, height], given back to the caller in pixels
        self.normalize = {name: (np.float32(n["mean"]), np.float32(n["std"])) for name, n in (normalize or {}).items()}
        self.boxes = {name: np.float32([size[0], size[1]] * 2) for name, size in (boxes or {}).items()}
        self.interpreter = interpreter_class(model_path=str(self.path), num_threads=num_threads)
        self.interpreter.allocate_tensors()
        own = _own_names(self.interpreter)
        unknown = sorted(set((names or {}).values()) - set(own.values()))
        if unknown:
            raise ValueError(f"names maps to tensor(s) {unknown} the model lacks; it has {sorted(own.values())}")
        renamed = {model: pipe for pipe, model in (names or {}).items()}
        self.inputs = {renamed.get(own[d["index"]], own[d["index"]]): d for d in self.interpreter.get_input_details()}
        self.outputs = {renamed.get(own[d["index"]], own[d["index"]]): d for d in self.interpreter.get_output_details()}
        self.layouts = _layouts(layout, self.inputs, self.outputs)
        self._shapes = {d["index"]: tuple(int(n) for n in d["shape"]) for d in self.inputs.values()}
        unknown = sorted(set(self.normalize) - set(self.inputs)) + sorted(set(self.boxes) - set(self.outputs))
        if unknown:
            raise ValueError(f"normalize/boxes name tensor(s) {unknown} the model lacks")

    def __call__(self, inputs: Mapping[str, np.ndarray], /) -> Arrays:
        missing = sorted(set(self.inputs) - set(inputs))
        if missing:
            raise ValueError(
                f"missing input(s) {missing}: got {sorted(inputs)}, the model takes {sorted(self.inputs)}; "
                f"give --name PIPE=MODEL (names={{pipe_name: model_name}}) for inputs the converter renamed, "
                f"or keep {FEEDING_FILE} beside the model"
            )
        fed = {name: self._to_model(name, np.asarray(inputs[name])) for name in self.inputs}
        self._resize({self.inputs[name]["index"]: array.shape for name, array in fed.items()})
        for name, array in fed.items():
            self.interpreter.set_tensor(self.inputs[name]["index"], array)
        self.interpreter.invoke()
        return {
            name: self._from_model(name, self.interpreter.get_tensor(d["index"])) for name, d in self.outputs.items()
        }

    def details(self) -> dict[str, list[dict[str, Any]]]:
        """Inputs and outputs as a device program needs them, JSON-ready.

        Each: `name` (pipe's), `tensor` (the model's), `dtype`, `shape` (the model's; None for a
        dynamic dim), `quantization` ({scale, zero_point} or None) and `layout` ("NHWC" when this
        runner transposes the tensor between the caller's NCHW and the model's NHWC, else None).
        """

        def describe(name: str, d: dict[str, Any]) -> dict[str, Any]:
            signature = d.get("shape_signature", d["shape"])
            scale, zero_point = _quantization(d)
            return {
                "name": name,
                "tensor": d["name"],
                "dtype": np.dtype(d["dtype"]).name,
                "shape": [int(n) if n >= 0 else None for n in signature],
                "quantization": {"scale": scale, "zero_point": zero_point} if scale else None,
                "layout": self.layouts.get(name),
            }

        return {
            "inputs": [describe(name, d) for name, d in self.inputs.items()],
            "outputs": [describe(name, d) for name, d in self.outputs.items()],
        }

    def _to_model(self, name: str, array: np.ndarray) -> np.ndarray:
        """The caller's array as the model's input tensor: layout, then quantization or dtype."""
        detail = self.inputs[name]
        if name in self.normalize:  # in float, as model.onnx did before the edge model's first op
            mean, std = self.normalize[name]
            array = (np.asarray(array, np.float32) - mean) / std
        _check_layout(name, array.shape, detail, self.layouts.get(name, "NCHW"))
        if self.layouts.get(name) == "NHWC":
            if array.ndim != 4:
                raise ValueError(f"input {name!r} has shape {list(array.shape)}; an NCHW image needs 4 dims")
            array = array.transpose(0, 2, 3, 1)
        dtype = np.dtype(detail["dtype"])
        scale, zero_point = _quantization(detail)
        if scale and dtype in QUANTIZED and np.issubdtype(array.dtype, np.floating):
            return quantize(array, scale, zero_point, dtype)
        return np.ascontiguousarray(array, dtype=dtype)

    def _from_model(self, name: str, array: np.ndarray) -> np.ndarray:
        """The model's output tensor as the caller expects it: dequantized floats, channels-first."""
        scale, zero_point = _quantization(self.outputs[name])
        if scale and array.dtype in QUANTIZED:
            array = dequantize(array, scale, zero_point)
        if self.layouts.get(name) == "NHWC" and array.ndim == 4:
            array = np.ascontiguousarray(array.transpose(0, 3, 1, 2))
        if name in self.boxes:  # 0..1 boxes back to pixels, as model.onnx gives them
            factors = self.boxes[name].reshape(1, 4, *[1] * (array.ndim - 2))
            array = np.array(array, np.float32)
            array[:, :4] *= factors
        return array

    def _resize(self, shapes: dict[int, tuple[int, ...]]) -> None:
        """Resize inputs whose shape changed (strict: only the model's dynamic dims may change), then re-allocate."""
        changed = {index: shape for index, shape in shapes.items() if self._shapes[index] != shape}
        if not changed:
            return
        for index, shape in changed.items():
            # strict: a dim the model fixed (a batch saved as 1) is refused here, not silently resized
            self.interpreter.resize_tensor_input(index, list(shape), strict=True)
        self.interpreter.allocate_tensors()
        self._shapes.update(changed)


def read_feeding(model: Path) -> dict[str, Any] | None:
    """The entry for `model` in the feeding.json beside it, or None when there is no such file.

    The file is `{"models": {"<file name>": {"layout": ..., "names": {...}, "inputs": [...], ...}}}`;
    one that cannot be read, or that has no entry for this model, raises ValueError naming it.
    """
    path = Path(model).parent / FEEDING_FILE
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())["models"][Path(model).name]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path} has no readable entry for {Path(model).name} ({type(exc).__name__}: {exc}); "
            "copy the feeding.json made with this model, or remove it and give --layout and --name"
        ) from None
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: the entry for {Path(model).name} is not an object")
    return entry


def _check_layout(name: str, shape: tuple[int, ...], detail: Mapping[str, Any], layout: str) -> None:
    """Refuse, in one line naming the flag, a 4-D input given in the other layout than the one set."""
    signature = [int(n) for n in detail.get("shape_signature", detail["shape"])]
    if len(shape) != 4 or len(signature) != 4:
        return

    def fits(dims: tuple[int, ...]) -> bool:
        return all(want < 0 or want == got for want, got in zip(signature[1:], dims[1:], strict=True))

    other = "NCHW" if layout == "NHWC" else "NHWC"
    fed = tuple(shape[i] for i in ((0, 2, 3, 1) if layout == "NHWC" else (0, 1, 2, 3)))
    if not fits(fed) and fits(shape if layout == "NHWC" else tuple(shape[i] for i in (0, 2, 3, 1))):
        raise ValueError(
            f"input {name!r} {list(shape)} does not fit the model's {signature} as {layout}: the model takes "
            f"{other}; give --layout {other} (layout={other!r}), "
            f"or keep {FEEDING_FILE} beside the model"
        )


def quantize(array: np.ndarray, scale: float, zero_point: int, dtype: np.dtype) -> np.ndarray:
    """Floats -> integers of `dtype`: round(x / scale) + zero_point, clipped to the dtype's range."""
    info = np.iinfo(dtype)
    q = np.round(np.asarray(array, dtype=np.float64) / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(array: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """Integers -> float32: (q - zero_point) * scale."""
    return ((array.astype(np.float64) - zero_point) * scale).astype(np.float32)


def _quantization(detail: Mapping[str, Any]) -> tuple[float, int]:
    """(scale, zero point) of a tensor; scale 0.0 means not quantized."""
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return float(scale), int(zero_point)


def _own_names(interpreter: Any) -> dict[int, str]:
    """Tensor index -> the model's name for it: its signature key when there is one signature, else its tensor name."""
    names = {}
    for d in [*interpreter.get_input_details(), *interpreter.get_output_details()]:
        name = d["name"].removeprefix("serving_default_")
        names[d["index"]] = name.rsplit(":", 1)[0] if name.rsplit(":", 1)[-1].isdigit() else name
    signatures = interpreter._get_full_signature_list() if hasattr(interpreter, "_get_full_signature_list") else {}
    if len(signatures) == 1:  # keys as the converter was told them (onnx2tf: the ONNX names)
        (signature,) = signatures.values()
        for side in ("inputs", "outputs"):
            names.update({index: key for key, index in signature.get(side, {}).items()})
    return names


def _layouts(layout: str | Mapping[str, str], inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, str]:
    """Pipe's tensor name -> the model's layout, for the tensors that differ from the caller's (NHWC)."""
    if isinstance(layout, str):
        layout = layout.upper()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; choose one of {list(LAYOUTS)}")
        tensors = {**inputs, **outputs}
        return {name: layout for name, d in tensors.items() if len(d["shape"]) == 4 and layout == "NHWC"}
    unknown = sorted(set(layout) - set(inputs) - set(outputs))
    if unknown:
        raise ValueError(f"layout names unknown tensor(s) {unknown}; the model has {sorted([*inputs, *outputs])}")
    bad = {name: value for name, value in layout.items() if value.upper() not in LAYOUTS}
    if bad:
        raise ValueError(f"unknown layout(s) {bad}; choose one of {list(LAYOUTS)}")
    return {name: "NHWC" for name, value in layout.items() if value.upper() == "NHWC"}


def check_golden(runner: TFLiteRunner, golden: Path, atol: float | None = None, rtol: float = 0.0) -> dict[str, Any]:
    """Run `runner` on golden.npz's `in.*` arrays and measure each output against `out.*`.

    Per output: `max_abs`, `scale` (its largest |golden| value) and `non_finite`; with `atol`, also
    `tolerance` = atol + rtol * scale and `within`: an output of a house-price regression (~3e5)
    is held to its own scale, not to a bare 1e-3.
    """
    with np.load(golden, allow_pickle=False) as data:
        inputs = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
        expected = {k[4:]: data[k] for k in data.files if k.startswith("out.")}
    if not inputs:
        raise ValueError(f"{golden} holds no in.<name> arrays (it has {sorted(data.files)})")
    count = len(next(iter(inputs.values())))
    first = next(iter(runner.inputs.values()))
    fixed = int(first.get("shape_signature", first["shape"])[0])
    step = fixed if fixed > 0 else max(count, 1)  # a model saved with a fixed batch runs that many at a time
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, count, step):
        for name, array in runner({k: v[start : start + step] for k, v in inputs.items()}).items():
            parts.setdefault(name, []).append(array)
    got = {name: np.concatenate(arrays) for name, arrays in parts.items()}
    outputs = {}
    for name, want in expected.items():
        if name not in got:
            outputs[name] = {"error": f"the model has no output {name!r} (it has {sorted(got)})"}
            continue
        a, b = got[name].astype(np.float64), want.astype(np.float64)
        if a.shape != b.shape:
            outputs[name] = {"error": f"shape {list(a.shape)}, golden {list(b.shape)}"}
            continue
        finite = b[np.isfinite(b)]
        entry = {
            "max_abs": float(np.max(np.abs(a - b))) if a.size else 0.0,
            "scale": float(np.max(np.abs(finite))) if finite.size else 0.0,
            "non_finite": int((~np.isfinite(a)).sum()),
        }
        if atol is not None:
            entry["tolerance"] = atol + rtol * entry["scale"]
            entry["within"] = bool(entry["max_abs"] <= entry["tolerance"])
        outputs[name] = entry
    worst = [o["max_abs"] for o in outputs.values() if "max_abs" in o]
    return {
        "model": str(runner.path),
        "runtime": runner.runtime,
        "runtime_version": runtime_version(runner.runtime),
        "numpy": np.__version__,
        "feeding": None if runner.feeding is None else str(runner.feeding),
        "samples": count,
        "max_abs": max(worst) if len(worst) == len(outputs) and worst else None,
        "outputs": outputs,
    }


def _runtime_info(forced: str | None) -> dict[str, str | None]:
    """The runtime this file would use (`forced`, else the first installed) and its version; None when none is."""
    from importlib.util import find_spec

    runtime = forced or next((r for r in RUNTIMES if find_spec(r) is not None), None)
    return {"runtime": runtime, "runtime_version": runtime_version(runtime) if runtime else None}


def main(argv: list[str] | None = None) -> int:
    """The command line: one JSON line; exit 0 when the model ran on every golden sample, gave every
    golden output with its shape and no NaN/Inf (and within --atol + --rtol x the output's scale, if
    given), else 1 (2: bad usage). `--runtime-info` prints only the runtime this file would use.
    """
    parser = argparse.ArgumentParser(description="Run a .tflite model on golden.npz and print one JSON line.")
    parser.add_argument("model", type=Path, nargs="?", help="the .tflite file")
    parser.add_argument("golden", type=Path, nargs="?", help="an .npz with in.<name> inputs and out.<name> outputs")
    parser.add_argument("--layout", choices=LAYOUTS, help=f"NHWC: the model takes channels-last (default: "
                        f"{FEEDING_FILE} beside the model, else NCHW)")  # fmt: skip
    parser.add_argument("--name", action="append", default=[], metavar="PIPE=MODEL",
                        help=f"a renamed tensor (default: {FEEDING_FILE} beside the model)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runtime", choices=RUNTIMES, help="force an interpreter (default: the first installed)")
    parser.add_argument("--atol", type=float, help="exit 1 when an output differs by more than this (+ --rtol x scale)")
    parser.add_argument("--rtol", type=float, default=0.0, help="plus this fraction of the output's largest |value|")
    parser.add_argument("--runtime-info", action="store_true", help="print the runtime this file would use, and exit")
    args = parser.parse_args(argv)
    if args.runtime_info:
        info = _runtime_info(args.runtime)
        print(json.dumps({**info, "numpy": np.__version__}))
        return 0 if info["runtime"] else 1
    if args.model is None or args.golden is None:
        parser.error("give a .tflite model and a golden .npz (or --runtime-info)")
    bad = [pair for pair in args.name if "=" not in pair]
    if bad:
        parser.error(f"--name takes PIPE=MODEL, got {bad}")
    if args.threads < 1:
        parser.error(f"--threads must be 1 or more, got {args.threads}")
    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if value is not None and not value >= 0:  # NaN too: every comparison with it is false
            parser.error(f"{flag} must be a number >= 0, got {value}")
    if not args.golden.is_file():
        parser.error(f"golden file {args.golden} not found; give an .npz with in.<name> and out.<name> arrays")
    names = dict(pair.split("=", 1) for pair in args.name) if args.name else None
    try:
        runner = TFLiteRunner(args.model, args.threads, names, args.layout, args.runtime)
        result = check_golden(runner, args.golden, args.atol, args.rtol)
    except (ValueError, RuntimeError, OSError, ImportError) as exc:
        # The answer a device check needs: this runtime cannot load or run this model (e.g. an op
        # version newer than the interpreter), said as one JSON line like a result.
        error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(json.dumps({"model": str(args.model), **_runtime_info(args.runtime), "error": error}))
        return 1
    print(json.dumps(result))
    failed = result["max_abs"] is None or any(o.get("non_finite") for o in result["outputs"].values())
    return 1 if failed or not all(o.get("within", True) for o in result["outputs"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
