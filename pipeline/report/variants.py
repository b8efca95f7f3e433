"""The card's sections on the model files: every variant with its evidence, the edge models, the benchmark.

Each variant's status is the one `pipe serve` acts on (`pipeline.artifact.variants.unusable`: failed, or
stale when its parent is no file the artifact holds now); its metrics are compared with the fp32
variant's, and its gate summary is shown with the policy it was held to. The benchmark is another
stage's JSON report, read by its keys only, and skipped with a note when it is absent or does
not read as rows of figures.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from pipeline.artifact.directions import HIGHER_IS_BETTER, metric_drop
from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import FP32, Variant, unusable
from pipeline.core.host import host_line
from pipeline.report.markdown import cell, code, number, size, table
from pipeline.report.policy import held_to

BENCHMARK_JSON = "reports/benchmark.json"
# The benchmark's columns a card shows, when its rows have them; otherwise the first BENCHMARK_COLUMNS it has.
BENCHMARK_KEYS = {  # key -> column heading
    "name": "model", "runtime": "runtime", "precision": "precision", "status": "status", "size_bytes": "size",
    "metric": "metric",
    "drop": "drop vs fp32", "p50_ms": "p50 (ms)", "p95_ms": "p95 (ms)", "throughput": "throughput (samples/s)",
    "not_timed": "not timed because",
}  # fmt: skip
BENCHMARK_COLUMNS = 8


def status(variant: Variant, artifact: Artifact) -> str:
    """passed, failed (why) or stale (why): what `pipe serve` makes of the variant."""
    listed = {entry.sha256 for entry in artifact.manifest.files.values()}
    why = unusable(variant, listed)
    if why is None:
        return "passed"
    return (
        f"failed: {variant.reason or 'no reason recorded'}"
        if not variant.passed
        else f"stale: {why.removeprefix('is stale: ')}"
    )


def usable(artifact: Artifact) -> dict[str, Variant]:
    """The variants that passed and are current, in manifest order."""
    return {name: v for name, v in artifact.manifest.variants.items() if status(v, artifact) == "passed"}


def variants_section(artifact: Artifact) -> list[str]:
    manifest = artifact.manifest
    if not manifest.variants:
        return ["## Variants", "", "No variants recorded yet: run `pipe export` (or `pipe import`) to make model.onnx."]
    reference = manifest.variants.get(FP32)
    rows = []
    for name, v in manifest.variants.items():
        rows.append([
            code(name), code(v.file), v.precision, v.format, status(v, artifact), size(v.size),
            _metrics(v.metrics), _drops(v, reference), _parity(v.parity), held_to(v, manifest),
        ])  # fmt: skip
    headers = ["variant", "file", "precision", "format", "status", "size", "metrics", "drop vs fp32", "parity",
               "held to"]  # fmt: skip
    notes = [f"- {code(name)}: {cell(v.note)}" for name, v in manifest.variants.items() if v.note]
    return [
        "## Variants",
        "",
        "Every model file of the artifact, how it was judged, and whether it may be served or shipped "
        "(a failed or stale variant never is). Parity is the verifier's gate against the variant's parent.",
        "",
        *table(headers, rows),
        *(["", "Notes:", "", *notes] if notes else []),
    ]


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {number(v)}" for k, v in metrics.items()) or "-"


def _drops(variant: Variant, reference: Variant | None) -> str:
    if reference is None or variant is reference:
        return "reference" if variant is reference else "-"
    drops = []
    for name, value in variant.metrics.items():
        if name in reference.metrics and name in HIGHER_IS_BETTER:
            drops.append(f"{name} {number(metric_drop(name, reference.metrics[name], value))}")
    return ", ".join(drops) or "-"


def _parity(parity: dict[str, Any]) -> str:
    if not parity:
        return "-"
    verdict = "passed" if parity.get("passed") else "failed"
    text = f"{verdict}: {parity.get('checks', '?')} checks, {parity.get('failed', '?')} failed"
    text += f"; max abs {number(parity.get('max_abs'), 3)}, max rel {number(parity.get('max_rel'), 3)}"
    if "budget_figure" in parity:
        text += f"; budget figure {number(parity['budget_figure'], 3)} (margin {number(parity.get('margin'), 3)})"
    return text


def edge_section(artifact: Artifact) -> list[str]:
    manifest = artifact.manifest
    edge = {name: v for name, v in manifest.variants.items() if v.format == "tflite"}
    if not edge:
        return ["## Edge models", "", "No edge models: `pipe export ARTIFACT --target edge` makes TFLite models."]
    record = manifest.stages.edge
    rows = []
    for name, v in edge.items():
        io = v.edge
        inputs = "; ".join(_tensor(t) for t in io.inputs) if io else "-"
        runtimes = ", ".join(f"{r}: {'runs' if ok else 'FAILS'}" for r, ok in io.runtimes.items()) if io else "-"
        seconds = record.seconds.get(name) if record else None
        rows.append([code(name), status(v, artifact), io.layout if io else "-", inputs, runtimes,
                     "-" if seconds is None else f"{seconds:g} s"])  # fmt: skip
    converter = f" Converted by {record.converter}." if record else ""
    machine = host_line(record.host) if record else ""
    where = f"Conversion times and device checks were measured on this host, not on a device: {cell(machine)}." if (
        machine) else "Conversion times and device checks were measured on this host, not on a device."  # fmt: skip
    return [
        "## Edge models",
        "",
        f"TFLite models converted from model.onnx, verified on LiteRT and, where found, run on the device-like "
        f"runtime.{converter} {where}",
        "",
        *table(["variant", "status", "layout", "inputs", "device check", "conversion"], rows),
    ]


def _tensor(t: Any) -> str:
    quant = f" (scale {number(t.scale)}, zero point {t.zero_point})" if t.scale is not None else ""
    if getattr(t, "normalize", None):
        quant += ", takes (x - mean) / std (feeding.json)"
    return f"{t.name} {t.dtype} {t.shape}{quant}"


def benchmark_section(artifact: Artifact) -> list[str]:
    """A short table of `pipe benchmark`'s rows and its plot, or a note saying why there is none."""
    record = artifact.manifest.stages.benchmark
    head = ["## Benchmark", ""]
    if record is None:
        return [*head, "No benchmark recorded: `pipe benchmark ARTIFACT` times every format side by side."]
    report = record.report or BENCHMARK_JSON
    path = artifact.path(report)
    if report not in artifact.manifest.files or not path.is_file():
        return [*head, f"The benchmark record names {code(report)}, but the artifact does not hold it; "
                "run `pipe benchmark` again."]  # fmt: skip
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        return [*head, f"{code(report)} cannot be read ({cell(exc)}); run `pipe benchmark` again."]
    rows = benchmark_rows(data)
    if not rows:
        return [*head, f"{code(report)} holds no rows of figures this card can show; see the file itself."]
    found = list(dict.fromkeys(k for row in rows for k in row))
    columns = [k for k in BENCHMARK_KEYS if k in found]
    columns = columns if len(columns) >= 2 else found[:BENCHMARK_COLUMNS]
    about = [f"measured {record.finished}"]
    if isinstance(data, dict) and isinstance(data.get("metric"), str):
        about.append(f"metric: {cell(data['metric'])}")  # folded onto this line, like every value read here
    for key, what in (("latency_batch", "latency at batch"), ("throughput_batch", "throughput at batch")):
        if len(batches := {row.get(key) for row in rows} - {None}) == 1:
            about.append(f"{what} {cell(batches.pop())}")
    cells = [[_figure(k, row.get(k)) for k in columns] for row in rows]
    headings = [BENCHMARK_KEYS.get(k, k) for k in columns]
    lines = [*head, f"From {code(report)}: {'; '.join(about)}."]
    if isinstance(data, dict) and isinstance(machine := data.get("machine"), dict):
        lines += ["", f"Timed on this machine only: {cell(_machine(machine, data.get('settings')))}."]
    lines += ["", *table(headings, cells)]
    lines += [f"\n{cell(line)}" for line in slower_than_fp32(rows)]
    if record.plot and record.plot in artifact.manifest.files:
        lines += ["", f"![benchmark]({posixpath.relpath(record.plot, 'reports')})"]
    return lines


def _machine(machine: dict[str, Any], settings: Any) -> str:
    """`Intel(R) Xeon(R) ..., 2 CPUs, Linux-6.1-x86_64, onnxruntime 1.32.0, 1 thread`"""
    parts = [str(machine.get("cpu") or machine.get("processor") or "an unnamed CPU")]
    if isinstance(machine.get("cpu_count"), int):
        parts.append(f"{machine['cpu_count']} CPUs")
    parts += [str(machine[k]) for k in ("platform",) if machine.get(k)]
    parts += [f"{k} {machine[k]}" for k in ("onnxruntime", "ai_edge_litert", "torch") if machine.get(k)]
    if isinstance(settings, dict) and isinstance(threads := settings.get("threads"), int):
        parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    return ", ".join(parts)


def slower_than_fp32(rows: list[dict[str, Any]]) -> list[str]:
    """A plain line for each servable int8 row slower than the fp32 row of its own runtime on this machine
    (onnxruntime's model.onnx, LiteRT's tflite-fp32): quantization saved size, not time, here (CPUs without
    fast int8 kernels, or a model too small for them to pay). Failed rows are not offered, so not compared."""
    timed = [r for r in rows if isinstance(r.get("p50_ms"), int | float) and r.get("status") in ("passed", None)]
    fp32s = {r.get("runtime"): r for r in timed if r.get("precision") == "fp32" and r.get("runtime") != "torch"}
    lines = []
    for row in timed:
        p50, fp32 = row.get("p50_ms"), fp32s.get(row.get("runtime"))
        if row.get("precision") == "int8" and fp32 is not None and p50 > fp32["p50_ms"]:
            lines.append(
                f"On this machine {row['name']} (int8) is slower than {fp32['name']} (fp32): p50 {number(p50)} ms "
                f"against {number(fp32['p50_ms'])} ms at batch {row.get('latency_batch', 1)}. It saves size here, "
                "not time; serve fp32 unless the size matters."
            )
    return lines


def _figure(key: str, value: Any) -> str:
    if key == "size_bytes":
        return size(value)
    if key == "throughput" and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,.0f}"
    return number(value)


def benchmark_rows(data: Any) -> list[dict[str, Any]]:
    """The rows of a benchmark report: a list of objects under `rows` (or the report itself), scalars only."""
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        return []
    scalars = (str, int, float, bool)
    return [{k: v for k, v in r.items() if isinstance(v, scalars)} for r in rows if isinstance(r, dict)]
