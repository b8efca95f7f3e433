"""The card's how-to sections: serve it, run it on a device, check a candidate against it.

Every name, shape, datatype and file comes from the artifact: the request examples send the first
golden sample (a real input) with the input's real name, shape and V2 datatype; the device
commands name the edge model's layout, renamed tensors and the runtimes it was seen to run on.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.datatypes import NUMPY_TO_V2
from pipeline.artifact.directions import HIGHER_IS_BETTER
from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import GOLDEN_NAME, Golden, load_golden
from pipeline.artifact.variants import FEEDING_FILE, FP32, LABELS_FILE
from pipeline.recipe.budgets import DEFAULT_CHECK_DROP, DEFAULT_CHECK_RELATIVE, BudgetSpec
from pipeline.report.markdown import code, shape, table
from pipeline.report.variants import usable

INLINE_ELEMENTS = 256  # a request up to this many values is written out in full; a larger one is built from golden.npz


def sh(*args: str) -> str:
    """A command line to paste into a shell: every argument quoted (shlex.quote), never spliced in raw."""
    return shlex.join(args)


def _place(artifact: Artifact) -> str:
    """The artifact where it really is: relative to the working directory when under it, else absolute."""
    root = artifact.root.resolve()
    try:
        return root.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return root.as_posix()


def _batch(artifact: Artifact) -> int:
    """The batch a request sends: 1, or the batch the model's inputs fix (the server refuses any other)."""
    fixed = [spec.shape[0] for spec in artifact.manifest.inputs if spec.shape and isinstance(spec.shape[0], int)]
    return fixed[0] if fixed and fixed[0] > 0 else 1


def _sample(artifact: Artifact, golden: Golden | None, batch: int) -> dict[str, np.ndarray]:
    """The first golden samples of each input (`batch` of them, repeated when golden.npz holds fewer), or
    zeros of the declared shape without golden.npz."""
    if golden is not None:
        inputs = golden.inputs
        if all(spec.name in inputs and len(inputs[spec.name]) for spec in artifact.manifest.inputs):
            return {
                spec.name: inputs[spec.name][np.resize(np.arange(len(inputs[spec.name])), batch)]
                for spec in artifact.manifest.inputs
            }
    return {
        spec.name: np.zeros([d if isinstance(d, int) else 1 for d in spec.shape], dtype=spec.dtype)
        for spec in artifact.manifest.inputs
    }


def _values(array: np.ndarray) -> list[Any]:
    """Nested lists, floats to 6 significant digits (enough to reproduce a float32 input's prediction)."""
    if array.dtype.kind == "f":
        return np.vectorize(lambda v: float(f"{v:.6g}"), otypes=[object])(array).tolist()
    return array.tolist()


def serve_section(artifact: Artifact) -> list[str]:
    m = artifact.manifest
    place, base = _place(artifact), "http://127.0.0.1:8000"
    servable = [n for n, v in usable(artifact).items() if v.format == "onnx"]
    golden = load_golden(artifact) if GOLDEN_NAME in m.files else None  # read once for the request and the answer
    batch = _batch(artifact)
    sample = _sample(artifact, golden, batch)
    what = "sample" if batch == 1 else f"{batch} samples (the model fixes its batch at {batch})"
    dtypes = {name: NUMPY_TO_V2.get(str(x.dtype), str(x.dtype)) for name, x in sample.items()}
    lines = [
        "## How to serve it",
        "",
        "```sh",
        f"{sh('pipe', 'serve', place)}    # KServe V2 and TF Serving REST on 127.0.0.1:8000",
        "```",
        "",
        f"Servable variants: {', '.join(code(n) for n in servable) or 'none'} (`--variant NAME`; `--variant best` "
        f"serves the fastest by recorded latency). The default is {code(FP32)} (model.onnx).",
        "",
        f"KServe V2 request with the first golden {what} (input {', '.join(code(n) for n in sample)}):",
        "",
        "```sh",
    ]
    url = f"{base}/v2/models/{m.name}/versions/{m.version}/infer"
    if sum(x.size for x in sample.values()) <= INLINE_ELEMENTS:
        body = {"inputs": [{"name": n, "shape": list(x.shape), "datatype": dtypes[n], "data": _values(x.ravel())}
                           for n, x in sample.items()]}  # fmt: skip
        lines.append(sh("curl", "-s", url, "-H", "Content-Type: application/json", "-d", json.dumps(body)))
    else:
        build = ", ".join(
            f"{{'name': {n!r}, 'shape': list(g['in.{n}'][:{batch}].shape), 'datatype': {dtypes[n]!r}, "
            f"'data': g['in.{n}'][:{batch}].ravel().tolist()}}"
            for n in sample
        )
        program = (
            f"import json, numpy as np; g = np.load({f'{place}/{GOLDEN_NAME}'!r}); "
            f"json.dump({{'inputs': [{build}]}}, open('request.json', 'w'))"
        )
        lines += [
            sh("python", "-c", program),
            sh("curl", "-s", url, "-H", "Content-Type: application/json", "-d", "@request.json"),
        ]
    lines += [
        "```",
        "",
        _answer(artifact, golden, batch),
        "",
        f"TF Serving REST, the same {'sample' if batch == 1 else 'samples'} in row form:",
        "",
        "```sh",
    ]
    predict = f"{base}/v1/models/{m.name}/versions/{m.version}:predict"
    if len(sample) == 1 and sum(x.size for x in sample.values()) <= INLINE_ELEMENTS:
        (x,) = sample.values()
        instances = json.dumps({"instances": _values(x)})
        lines.append(sh("curl", "-s", predict, "-d", instances))
    elif sum(x.size for x in sample.values()) <= INLINE_ELEMENTS:
        instances = json.dumps({"instances": [{n: _values(x[i]) for n, x in sample.items()} for i in range(batch)]})
        lines.append(sh("curl", "-s", predict, "-d", instances))
    else:
        example = sh("curl", "-s", predict, "-d", '{"instances": [...]}')
        lines.append(f"{example}    # one value per example, without the batch axis")
    lines += [
        "```",
        "",
        *_detections(artifact, predict),
        "See docs/http-api.md for binary tensors, metadata and readiness.",
    ]
    return lines


def _detections(artifact: Artifact, predict: str) -> list[str]:
    """For a detector: how to send a picture and get boxes back instead of the raw head output."""
    m = artifact.manifest
    if m.task != "detection" or m.detection is None:
        return []
    d = m.detection
    program = (
        "import base64, json; picture = base64.b64encode(open('photo.jpg', 'rb').read()).decode(); "
        "json.dump({'instances': [{'b64': picture}], 'detections': True}, open('request.json', 'w'))"
    )
    return [
        f"A detector: send a picture and add `detections` for its boxes, scores and labels in the picture's "
        f"pixels (the letterbox undone) instead of the raw {code(m.outputs[0].name)}; decoded at confidence > "
        f"{d.confidence:g}, NMS IoU {d.iou:g}, at most {d.max_detections} boxes per picture, as recorded (a "
        "request may override each):",
        "",
        "```sh",
        sh("python", "-c", program),
        sh("curl", "-s", predict, "-d", "@request.json"),
        "```",
        "",
    ]


def _answer(artifact: Artifact, golden: Golden | None, batch: int) -> str:
    """What the V2 request returns, and what the model said for its first sample when it was recorded."""
    m = artifact.manifest
    outputs = ", ".join(f"{code(o.name)} {o.dtype} {shape(o.shape)}" for o in m.outputs)
    text = f"The answer holds {outputs} (the batch axis is {batch} here)."
    if m.ctc is not None:  # a text recognizer answers its output read as text (docs/http-api.md, "Texts")
        raw = code(m.outputs[0].name)
        text = (f"The answer holds `text` BYTES and `confidence` FP32, one per sample (the batch axis is {batch} "
                f"here): {raw} read as text; name {raw} in `outputs` for the raw scores.")  # fmt: skip
    if golden is not None and m.task == "classification" and m.labels:
        first = golden.outputs.get(m.outputs[0].name)
        if first is not None and len(first):
            label = m.labels[int(np.argmax(first[0]))]
            text += (
                f" For {'this' if batch == 1 else 'the first'} sample the recorded output's top class is {code(label)}"
            )
            if golden.target is not None:
                text += f"; its label is {code(m.labels[int(golden.target[0])])}"
            text += "."
    return text


def device_section(artifact: Artifact) -> list[str]:
    head = ["## How to run it on a device", ""]
    edge = {name: v for name, v in usable(artifact).items() if v.format == "tflite" and v.edge is not None}
    if not edge:
        return [*head, "No edge model passed its checks, so none is shipped to devices "
                "(`pipe export ARTIFACT --target edge` makes them)."]  # fmt: skip
    place = _place(artifact)
    files = [f"{place}/{v.file}" for v in edge.values()]
    fed = FEEDING_FILE in artifact.manifest.files  # the runner reads layout and names from it
    files += [f"{place}/{rel}" for rel in (FEEDING_FILE, LABELS_FILE) if rel in artifact.manifest.files]
    runtimes = sorted({r for v in edge.values() for r, ok in v.edge.runtimes.items() if ok})
    lines = [
        *head,
        "Copy the stand-alone runner (numpy and a TFLite interpreter, nothing of pipe), the models, "
        f"{'feeding.json (how to feed each model), ' if fed else ''}and the golden file to the device:",
        "",
        "```sh",
        sh("scp", "pipeline/runtime/tflite_runner.py", *files, f"{place}/{GOLDEN_NAME}", "device:model/"),
        "```",
        "",
        "On the device, install one of the runtimes these models were seen to run on:",
        "",
        "```sh",
        *(f"{_install(r)}    # or" for r in runtimes[:-1]),
        *(_install(r) for r in runtimes[-1:]),
        "```",
        "",
        "Check each model on the device against the recorded golden outputs (one JSON line; exit 0 when it runs):",
        "",
        "```sh",
        "cd model",
    ]
    for v in edge.values():
        names = [arg for a, b in v.edge.names.items() for arg in ("--name", f"{a}={b}")]
        model = v.file.rsplit("/", 1)[-1]
        flags = [] if fed else ["--layout", v.edge.layout, *names]  # feeding.json beside the model says them
        lines.append(sh("python", "tflite_runner.py", model, GOLDEN_NAME, *flags))
    first_name, first = next(iter(edge.items()))
    specs = artifact.manifest.inputs
    inputs = ", ".join(f"{code(s.name)} {s.dtype} {shape(s.shape)}" for s in specs)
    arrays = {s.name: "x" if len(specs) == 1 else f"x{i}" for i, s in enumerate(specs)}  # a variable per input
    lines += [
        "```",
        "",
        f"In a program, `TFLiteRunner` takes the inputs as model.onnx does ({inputs}, in its layout and raw units) "
        f"and quantizes, transposes and renames them itself, e.g. for {code(first_name)}:",
        "",
        "```python",
        "from tflite_runner import TFLiteRunner  # the runner copied above",
        "",
        f"model = TFLiteRunner({first.file.rsplit('/', 1)[-1]!r})  # layout and names from feeding.json beside it"
        if fed
        else f"model = TFLiteRunner({first.file.rsplit('/', 1)[-1]!r}, names={dict(first.edge.names)!r}, "
        f"layout={first.edge.layout!r})",
        *(f"{arrays[s.name]} = ...  # {s.dtype} {shape(s.shape)}, {s.layout}, as model.onnx takes it" for s in specs),
        f"outputs = model({{{', '.join(f'{n!r}: {v}' for n, v in arrays.items())}}})  # named numpy arrays out",
        "```",
        "",
        "See docs/edge.md for feeding the raw interpreter by hand.",
    ]
    return lines


def _install(runtime: str) -> str:
    """`pip install` line for a runtime as the edge record names it, e.g. 'tflite_runtime 2.14.0'."""
    name, _, version = runtime.partition(" ")
    package = name.replace("_", "-")
    pin = f"=={version}" if version else ""
    numpy = ' "numpy<2"' if package == "tflite-runtime" else ""  # tflite-runtime 2.14 needs numpy 1.x
    return f"pip install {package}{pin}{numpy}"


def check_section(artifact: Artifact, budgets: BudgetSpec, where: str) -> list[str]:
    place = _place(artifact)
    rows = []
    for name in dict.fromkeys([*artifact.manifest.metrics, *budgets.metrics]):  # each metric by its own budget
        if name not in HIGHER_IS_BETTER:
            rows.append([f"metric {code(name)}", "is not judged: no known direction for a drop", "-"])
            continue
        b = budgets.for_metric(name)
        bounds = [
            f"drops by more than {b.max_drop:g}" if b.max_drop is not None else "",
            f"drops by more than {b.max_relative_drop:.2%} of the baseline's value"
            if b.max_relative_drop is not None
            else "",
        ]
        rows.append([f"metric {code(name)}", " or ".join(filter(None, bounds)), "this version's and each variant's"])
    rows += [
        ["other metrics", f"drops by more than {budgets.max_accuracy_drop:g}" if budgets.max_accuracy_drop is not None
         else f"unitless: drops by more than {DEFAULT_CHECK_DROP:g}; in the target's units (mae, rmse): by more "
              f"than {DEFAULT_CHECK_RELATIVE:.0%} of the baseline's value", "`max_accuracy_drop`"],
        ["latency", f"more than x{1 + budgets.max_latency_increase:g} the baseline's", "p50 at batch 1, side by side"],
        ["size", f"more than x{1 + budgets.max_size_increase:g} the baseline's", "model.onnx with its external data"],
    ]  # fmt: skip
    return [
        "## How to check a candidate against it",
        "",
        f"`pipe check` is the CI regression gate; this version as the baseline (budgets: {where}):",
        "",
        *table(["check", "fails when it", "of"], rows),
        "",
        "```sh",
        sh("pipe", "check", posixpath.join(posixpath.dirname(place), "NEW_VERSION"), "--baseline", place),
        sh("pipe", "check", place, "--write-baseline", f"models/{artifact.name}.baseline.json")
        + "    # a summary to commit",
        "```",
        "",
        "Exit 0: every check held; 1: a regression, each listed with its numbers; 2: bad input (docs/check.md).",
        *(["", verdict] if (verdict := _verdict(artifact)) else []),
    ]


def _verdict(artifact: Artifact) -> str | None:
    """`pipe run`'s kept check of this version against the committed baseline, when it ran."""
    record = artifact.manifest.stages.check
    if record is None:
        return None
    report = next((rel for rel in record.reports if rel.endswith(".md")), None)
    where = f" ({report})" if report else ""
    total = _check_count(artifact, record.reports)
    checks = f"{total} checks" if total is not None else "checks"
    if record.passed:
        return f"Checked against {code(record.baseline)}: all {checks} held{where}."
    failed = ", ".join(code(name) for name in record.failures)
    of = f" of {total}" if total is not None else ""
    return f"Checked against {code(record.baseline)}: {len(record.failures)}{of} checks failed: {failed}{where}."


def _check_count(artifact: Artifact, reports: list[str]) -> int | None:
    """How many checks the verdict ran, as its JSON report lists them (None without it)."""
    rel = next((r for r in reports if r.endswith(".json")), None)
    if rel is None or rel not in artifact.manifest.files or not (path := artifact.path(rel)).is_file():
        return None
    checks = json.loads(path.read_text(encoding="utf-8")).get("checks")
    return len(checks) if isinstance(checks, list) else None
