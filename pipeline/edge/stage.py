"""`pipe export ARTIFACT --target edge`: TFLite models of model.onnx, each proven on a real LiteRT interpreter.

Steps: read the recipe's `edge:` section as it is now (command-line values on top; an imported
artifact uses the defaults); fix every free dim but the batch at a size the artifact knows
(pipeline/edge/shapes.py); convert a copy of model.onnx with onnx2tf in a scratch directory,
trying known-good onnx2tf settings in turn until one's fp32 passes the gate (pipeline/edge/attempts.py;
pipeline/edge/convert.py: fp32, fp16, and int8 calibrated on real training samples, int8 I/O
for pictures and float I/O otherwise); judge each .tflite with the verifier on the LiteRT
interpreter against model.onnx:
fp32 and fp16 element by element (`atol`, `atol_fp16`), int8 by the task's budget (the
metric's drop on the test split, or agreement / cosine / relative error without labels), NaN/Inf
always, the batch at 1, 2 and 16; an fp16 model also by fp16's range (pipeline/edge/fp16range.py).
Each .tflite carries its feeding description as TFLite metadata, and `edge/feeding.json` and
`edge/labels.txt` lie beside them (pipeline/edge/feeding.py); each is then run by the stand-alone
runner on the device-like runtime, fed from that JSON (pipeline/edge/device.py), its rows joining
the gate's. Then, under the artifact's lock, move them into `edge/` and record each as a
`tflite-<precision>` variant with what a device program needs (layout, dtypes, shapes,
quantization) and its status. Any failure, a conversion onnx2tf refuses included, is recorded and
exits 1; the other variants stay as they were.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import GOLDEN_NAME
from pipeline.artifact.manifest import Detection, ModelSpec
from pipeline.artifact.records import EdgeRecord, FixedDim
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import EDGE_PREFIX, MODEL_FILE, EdgeIO, EdgeTensor, Variant, variant_file
from pipeline.core.errors import CheckFailed, InputError
from pipeline.core.host import describe_host
from pipeline.edge.attempts import (
    NotConverted,
    attempts_for,
    attempts_json,
    attempts_markdown,
    attempts_text,
    convert_in_turn,
)
from pipeline.edge.convert import Converted, EdgeSettings
from pipeline.edge.device import (
    DEVICE_PYTHON_ENV,
    DeviceCheck,
    device_check,
    device_python,
    device_runtime,
    device_tolerance,
)
from pipeline.edge.feeding import feeding_entry, stamp_metadata, write_feeding
from pipeline.edge.fp16range import fp16_range_rows
from pipeline.edge.shapes import device_specs, fitted_evaluation, is_picture
from pipeline.recipe.schema import EdgeSpec
from pipeline.runtime.runners import ort_runner, tflite_candidate
from pipeline.samples.calibration import calibration_set, has_real_samples
from pipeline.samples.evaluation import EvaluationSet
from pipeline.stagekit.contract import Context, Overrides, Progress, Stage
from pipeline.stagekit.opening import made_from_model_fresh, open_for_model
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.gate import verify
from pipeline.verify.policies import Policy
from pipeline.verify.report import GateReport


@dataclass
class EdgeMade:
    """One edge model converted and judged."""

    name: str  # tflite-fp32 ...
    converted: Converted
    report: GateReport  # the gate's rows on LiteRT, then the device check's rows when it ran
    litert: bool  # the gate passed on LiteRT (before the device rows joined)
    policy: Policy  # what the gate held it to (the device check's tolerance follows from it)
    device: DeviceCheck | None = None  # what the device-like runtime did with it

    @property
    def passed(self) -> bool:
        """Verified on LiteRT, and runs on the device-like runtime when one was checked."""
        return self.report.passed


@dataclass
class EdgeOutcome:
    artifact: Artifact
    made: list[EdgeMade]
    failed: list[str]
    notes: list[str]


def policy_for(
    precision: str, settings: EdgeSpec, task: str, has_target: bool, detection: Detection | None = None
) -> Policy:
    """What the `precision` TFLite is held to: hop_policy's choice for the edge hop (pipeline/verify/choose.py)."""
    return hop_policy("edge", precision, task, has_target, GateSettings.read(settings.model_dump()), detection)


def edge_artifact(
    path: str | Path, overrides: Overrides | None = None, recipe_path: Path | None = None, progress: Progress = print
) -> EdgeOutcome:
    """Convert, judge and record the edge models the settings ask for; see the module doc."""
    opened = open_for_model(
        path, "edge", lambda rel: rel.startswith("edge/"), overrides, recipe_path, flags="--precision, --layout ..."
    )
    artifact, recipe, settings, evaluation, notes = (
        opened.artifact, opened.recipe, opened.settings, opened.evaluation, opened.notes
    )  # fmt: skip
    parent, source, rewritten = opened.parent, opened.model, opened.rewritten
    precisions = list(dict.fromkeys(settings.precisions))
    calibration = None
    if "int8" in precisions:
        if has_real_samples(artifact):
            calibration = calibration_set(artifact, recipe, settings.calibration_samples).inputs
        else:
            notes.append("int8 skipped: the artifact was imported without --eval-data, so there are no real samples")
            precisions.remove("int8")
            if "int8" in ((overrides or {}).get("precisions") or []) or not precisions:  # asked for by name
                raise InputError(
                    "int8 edge models calibrate on real samples, and this artifact was imported without --eval-data; "
                    "re-import it with --eval-data FILE, or ask for --precision fp32 / fp16"
                )
    # Devices run fixed shapes: every free dim but the batch is fixed at a size the artifact knows (shapes.py)
    inputs, outputs, fixed = device_specs(artifact.manifest, evaluation.samples, settings.input_shapes)
    spec = ModelSpec(inputs, outputs, artifact.manifest.task)
    evaluation, resampled = fitted_evaluation(evaluation, inputs)
    for f in fixed:
        progress(f"[edge] {f.input} axis {f.axis} ({f.dim}) fixed at {f.size}: from {f.source}")
    int8_io = "integer" if all(is_picture(s) for s in inputs) else "float"  # q = pixel - 128 style only for pictures
    if "int8" in precisions and int8_io == "float" and all(np.dtype(s.dtype).kind == "f" for s in inputs):
        notes.append("int8 has float inputs and outputs (weights and activations int8 inside): the inputs are not "
                     "pictures, and one int8 scale per input would crush columns of different ranges")  # fmt: skip
        progress(f"[edge] note: {notes[-1]}")
    edge_settings = EdgeSettings(tuple(precisions), settings.layout, input_dims={s.name: s.shape for s in inputs},
                                 int8_io=int8_io, **_scaling(artifact.manifest.task, inputs, outputs))  # fmt: skip
    progress(f"[edge] {artifact.root}: converting with onnx2tf ({', '.join(precisions)}; layout {settings.layout})")

    with StageWrite(artifact.root, "edge") as write:
        judged: dict[int, tuple[list[EdgeMade], dict]] = {}

        def judge(converted: list[Converted]) -> str | None:
            """The gate on LiteRT; an attempt is left when its fp32 model fails it (a precision's own loss is not a
            conversion's fault, so an attempt without fp32 is kept as it is)."""
            entries = {c.precision: feeding_entry(f"{EDGE_PREFIX}{c.precision}", c, artifact.manifest)
                       for c in converted}  # fmt: skip
            for c in converted:  # before judging: the file shipped is the file verified
                if not stamp_metadata(c.path, entries[c.precision], artifact.manifest):
                    notes.append(f"{c.path.name} keeps its weights outside the flatbuffer: no TFLite metadata written")
            made = [_judge(c, artifact, evaluation, settings, write.scratch, progress, spec) for c in converted]
            judged[id(converted)] = made, entries
            fp32 = next((m for m in made if m.converted.precision == "fp32"), None)
            return None if fp32 is None or fp32.report.passed else f"{fp32.name}: {_first_failure(fp32.report)}"

        fixed_rows = [asdict(f) for f in fixed]
        try:
            converted, tried = convert_in_turn(source, write.scratch / "convert", edge_settings, calibration, judge,
                                               attempts_for(artifact.manifest.task), progress)  # fmt: skip
        except NotConverted as exc:
            kept = _record_failure(write, parent, settings, precisions, str(exc), exc, fixed_rows)
            message = f"no onnx2tf setting tried converts the model; the last said: {exc}"
            if kept:  # the copy kept in the artifact: the scratch directory it was written in goes away
                message += f"\nonnx2tf's last log: {kept}; the attempts: {CONVERT_REPORTS[1]}"
            raise CheckFailed(message) from None
        _write_convert_report(write.scratch, tried, fixed_rows)
        for warning in dict.fromkeys(w for c in converted for w in c.warnings):  # e.g. int8 not made, and why
            notes.append(warning)
            progress(f"[edge] note: {warning}")
        made, entries = judged[id(converted)]
        for m in made:
            target = write.scratch / variant_file(m.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(m.converted.path, target)
            m.converted.path = target
        models = {Path(variant_file(m.name)).name: entries[m.converted.precision] for m in made}
        feeding = write_feeding(write.scratch / "edge", artifact.manifest, models) if made else []
        device = device_python()
        golden = _device_golden(write.scratch, evaluation, artifact) if resampled else artifact.path(GOLDEN_NAME)
        if device is None:
            notes.append(
                "no device-like runtime to check on (make edge-runtime builds one: numpy<2 + tflite-runtime 2.14; "
                f"or set {DEVICE_PYTHON_ENV}); the edge models were verified on LiteRT only"
            )
        runtime = device_runtime(device) if device is not None and made else ""
        for m in made:
            if device is not None:
                _device(m, device, golden, settings, runtime, progress)
        host = describe_host()

        def record(fresh: Artifact) -> None:
            for rel in rewritten:  # edge files of an earlier run that this run did not make again
                if rel not in {variant_file(m.name) for m in made} | set(feeding):
                    fresh.remove_file(rel)
            for name in [k for k in fresh.manifest.variants if k.startswith(EDGE_PREFIX)]:
                if name not in {m.name for m in made}:
                    del fresh.manifest.variants[name]
            for m in made:
                fresh.add_variant(m.name, _variant(m, parent))
            fresh.manifest.stages.edge = EdgeRecord(
                settings=settings.model_dump(mode="json"),
                inputs={MODEL_FILE: parent},
                parent=parent,
                converter=converted[0].converter if converted else "onnx2tf",
                variants=[m.name for m in made],
                failed=[m.name for m in made if not m.passed],
                seconds={m.name: m.converted.seconds for m in made},
                host=host,
                fixed_dims=list(fixed),
                attempts=tried,
            )

        artifact = write.commit([*(variant_file(m.name) for m in made), *feeding, *CONVERT_REPORTS], record)
    failed = [m.name for m in made if not m.passed]
    if failed:
        lines = "\n".join(f"{m.name}:\n{m.report.table(only_failures=True)}" for m in made if not m.passed)
        if not any(a.used for a in tried):  # every onnx2tf setting was left: these are the first conversion's models
            lines += f"\nno onnx2tf setting gave models that pass; {attempts_text(tried)}"
        raise CheckFailed(f"edge model(s) failed verification (recorded as failed, not shipped): {', '.join(failed)}\n"
                          f"{lines}")  # fmt: skip
    return EdgeOutcome(artifact, made, failed, notes)


def _judge(c: Converted, artifact: Artifact, evaluation: EvaluationSet, settings: EdgeSpec, scratch: Path,
           progress: Progress, spec: ModelSpec) -> EdgeMade:  # fmt: skip
    m = artifact.manifest
    name = f"{EDGE_PREFIX}{c.precision}"
    policy = policy_for(c.precision, settings, m.task, evaluation.target is not None, m.detection)
    candidate = tflite_candidate(c.path, names=c.names, layout=c.input_layout, **c.scaling())
    report = verify(candidate, ort_runner(artifact.path(MODEL_FILE)), evaluation, spec, policy, scratch=scratch)
    if c.precision == "fp16":  # the cause before its symptom: a value fp16 cannot hold, then "exceeds atol"
        samples = None if evaluation.generated else evaluation.samples  # activations only on real samples
        report.rows[:0] = fp16_range_rows(artifact.path(MODEL_FILE), samples, scratch)
    status = "passed" if report.passed else "FAILED"
    progress(f"[edge] {name}: converted in {c.seconds:.1f} s, {c.path.stat().st_size} bytes; {policy.name}: {status}")
    return EdgeMade(name, c, report, report.passed, policy)


def _device(m: EdgeMade, python: Path, golden: Path, settings: EdgeSpec, runtime: str, progress: Progress) -> None:
    """Run `m` on the device-like runtime (feeding.json beside it); its rows join the gate's report."""
    tolerance = device_tolerance(m.converted.precision, m.policy)
    m.device = device_check(python, m.converted.path, golden, tolerance, runtime)
    m.report.rows += m.device.rows
    verdict = "runs" if m.device.ran else f"FAILS: {m.device.detail}"
    progress(f"[edge] {m.name} on {m.device.runtime}: {verdict}")


def _variant(m: EdgeMade, parent: str) -> Variant:
    c = m.converted
    metric = m.report.metric
    name = metric.get("name")
    value = next((v for k, v in metric.items() if k not in ("name", "reference", "difference", "samples")), None)
    runtime = f"ai-edge-litert {_litert_version()}"
    return Variant(
        file=variant_file(m.name),
        precision=c.precision,
        format="tflite",
        stage="edge",
        parent=parent,
        settings={
            "layout": c.input_layout,
            "converter": c.converter,
            **({"int8_io": c.int8_io} if c.int8_io else {}),
            **_scaling_settings(c),
        },
        status="passed" if m.passed else "failed",
        reason="" if m.passed else _reason(m),
        metrics={name: float(value)} if name and isinstance(value, int | float) else {},
        parity=m.report.summary(),
        edge=EdgeIO(
            layout=c.input_layout.upper(),
            inputs=[EdgeTensor(**t) for t in c.inputs],
            outputs=[EdgeTensor(**t) for t in c.outputs],
            names=dict(c.names),
            runtimes={runtime: m.litert, **({m.device.runtime: m.device.ran} if m.device else {})},
        ),
    )


def _scaling(task: str, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> dict:
    """What the conversion takes out of int8's one scale per tensor (pipeline/edge/scaling.py), every precision alike:
    a detector's boxes divided by the image size; a leading (x - mean) / std of each [batch, F] float input that is
    not a picture, applied by the caller in float."""
    tabular = tuple(s.name for s in inputs if not is_picture(s) and np.dtype(s.dtype).kind == "f" and len(s.shape) == 2)
    images = [
        s for s in inputs if s.layout == "NCHW" and len(s.shape) == 4 and all(isinstance(d, int) for d in s.shape[2:])
    ]
    boxes = {}
    if task == "detection" and len(images) == 1 and outputs:
        height, width = images[0].shape[2:]
        boxes = {outputs[0].name: (int(width), int(height))}
    return {"normalize_inputs": tabular, "boxes": boxes}


def _scaling_settings(c: Converted) -> dict:
    """The variant's settings: which inputs the caller normalizes, which outputs give boxes divided by [W, H]."""
    taken = [t["name"] for t in c.inputs if t.get("normalize")]
    boxes = {t["name"]: t["boxes_normalized_by"] for t in c.outputs if t.get("boxes_normalized_by")}
    return {**({"normalized_inputs": taken} if taken else {}), **({"boxes_normalized_by": boxes} if boxes else {})}


CONVERT_LOG = "reports/edge-convert.log"  # onnx2tf's own log of a conversion that failed
CONVERT_REPORTS = ("reports/edge-convert.json", "reports/edge-convert.md")  # device shapes and onnx2tf attempts


def _write_convert_report(scratch: Path, tried: list, fixed_rows: list[dict]) -> None:
    (scratch / "reports").mkdir(exist_ok=True)
    (scratch / CONVERT_REPORTS[0]).write_text(attempts_json(tried, fixed_rows))
    (scratch / CONVERT_REPORTS[1]).write_text(attempts_markdown(tried, fixed_rows))


def _device_golden(scratch: Path, evaluation: EvaluationSet, artifact: Artifact) -> Path:
    """golden inputs resampled to the device shapes, with model.onnx's outputs on them, for the device check."""
    outputs = ort_runner(artifact.path(MODEL_FILE))(evaluation.samples)
    path = scratch / "device-golden.npz"
    arrays = {**{f"in.{k}": v for k, v in evaluation.samples.items()}, **{f"out.{k}": v for k, v in outputs.items()}}
    np.savez(path, **arrays)
    return path


def _record_failure(
    write: StageWrite, parent: str, settings: EdgeSpec, precisions: list[str], reason: str, refused: NotConverted,
    fixed_rows: list[dict],
) -> str | None:  # fmt: skip
    """A conversion onnx2tf refused: recorded in the edge stage record, with onnx2tf's last log and the attempts
    kept in reports/ (the scratch directory it was written in goes away); no model file changes. Returns the
    log's path.
    """
    log = refused.log
    kept = None
    _write_convert_report(write.scratch, refused.attempts, fixed_rows)
    if log is not None and log.is_file():
        shutil.copyfile(log, write.scratch / CONVERT_LOG)
        kept = CONVERT_LOG

    def record(fresh: Artifact) -> None:
        fresh.manifest.stages.edge = EdgeRecord(
            settings={**settings.model_dump(mode="json"), "error": reason.splitlines()[0][:500]},
            inputs={MODEL_FILE: parent},
            parent=parent,
            converter="onnx2tf",
            variants=[],
            failed=[f"{EDGE_PREFIX}{p}" for p in precisions],
            fixed_dims=[FixedDim(**row) for row in fixed_rows],
            attempts=refused.attempts,
        )

    write.commit([*([kept] if kept else []), *CONVERT_REPORTS], record)
    return kept


def _reason(m: EdgeMade) -> str:
    if not m.litert or m.device is None:
        return _first_failure(m.report)
    return (f"verified on LiteRT but fails on {m.device.runtime}: {m.device.detail}; "
            "not shipped to devices with that runtime")  # fmt: skip


def _first_failure(report: GateReport) -> str:
    row = report.failures[0]
    more = f" (and {len(report.failures) - 1} more failed checks)" if len(report.failures) > 1 else ""
    return f"{row.check} {row.output}: {row.detail}{more}".strip()


def _litert_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return "?"


def _fresh(ctx: Context) -> str | None:
    record = Artifact.load(ctx.version, verify=False).manifest.stages.edge
    if record is not None and (record.failed or not record.variants):
        return None  # a failed edge model fails the run again (exit 1) rather than pass as up to date
    return made_from_model_fresh(ctx, "edge", "edge models")


def _run(ctx: Context) -> str:
    outcome = edge_artifact(ctx.version, recipe_path=ctx.recipe_path, progress=ctx.progress)
    return f"{', '.join(m.name for m in outcome.made)} in {ctx.version / 'edge'}"


def _off(ctx: Context) -> str | None:
    return None if ctx.recipe.edge.enabled else "edge.enabled: false"


STAGE = Stage("edge", _fresh, _run, _off, judges=True)
