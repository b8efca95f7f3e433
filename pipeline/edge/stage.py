"""`pipe export ARTIFACT --target edge`: TFLite models of model.onnx, each proven on a real LiteRT interpreter.

Steps: read the recipe's `edge:` section as it is now (a settings file's and the command line's values
on top; an imported artifact starts from the defaults); fix every free dim but the batch at a size the
artifact knows (pipeline/edge/shapes.py); convert a copy of model.onnx with onnx2tf in a scratch
directory, trying known-good onnx2tf settings in turn until one's fp32 passes the gate, or fails it on
accuracy rather than conversion (pipeline/edge/attempts.py;
pipeline/edge/convert.py: fp32, fp16, and int8 calibrated on real training samples, int8 I/O
for pictures and float I/O otherwise); judge each .tflite with the verifier on the LiteRT
interpreter against model.onnx (docs/gates.md):
fp32 as a lossless hop (each value within `atol` x its output's scale + `rtol`, but for a documented
few), fp16 and int8 by the task's budget over the evaluation split (the metric's drop on the test
split, or agreement / cosine / relative error / boxes without labels), NaN/Inf always, the batch at
1, 2 and 16; an fp16 model also by fp16's range (pipeline/edge/fp16range.py).
Each .tflite carries its feeding description as TFLite metadata, and `edge/feeding.json` and
`edge/labels.txt` lie beside them (pipeline/edge/feeding.py); each is then run by the stand-alone
runner on the device-like runtime, fed from that JSON (pipeline/edge/device.py), its rows joining
the gate's. Then, under the artifact's lock, move them into `edge/` and record each as a
`tflite-<precision>` variant with what a device program needs (layout, dtypes, shapes,
quantization) and its status. Any failure, a conversion onnx2tf refuses included, is recorded and
exits 1; the other variants stay as they were. A size guessed for a free dim (pipeline/edge/shapes.py)
is said in a note and in every failure, with the --input-shape that gives the real one.

The seams, one module each: what to make and at which shapes (pipeline/edge/plan.py), the gate on
LiteRT (pipeline/edge/litert_gate.py), what is recorded (pipeline/edge/recording.py); this module
chooses each precision's policy (`pipeline/verify/choose.py:hop_policy`) and runs the steps in order.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import GOLDEN_NAME
from pipeline.artifact.records import ConvertAttempt
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import MODEL_FILE, variant_file
from pipeline.core.errors import CheckFailed
from pipeline.edge.attempts import NotConverted, attempts_for, attempts_text, convert_in_turn, op_types
from pipeline.edge.device import DEVICE_PYTHON_ENV, device_check, device_python, device_runtime, device_tolerance
from pipeline.edge.feeding import write_feeding
from pipeline.edge.litert_gate import EdgeMade, Judged, LiteRTGate
from pipeline.edge.plan import EdgePlan, plan_edge
from pipeline.edge.recording import CONVERT_REPORTS, record_made, record_refused, write_convert_report
from pipeline.edge.shapes import guessed_advice
from pipeline.recipe.schema import EdgeSpec
from pipeline.runtime.runners import ort_runner
from pipeline.stagekit.contract import Context, Overrides, Progress, Stage, lm_off
from pipeline.stagekit.opening import Opened, made_from_model_fresh, open_for_model
from pipeline.verify.choose import GateSettings, hop_policy, refuse_unread_budgets


@dataclass
class EdgeOutcome:
    artifact: Artifact
    made: list[EdgeMade]
    failed: list[str]
    notes: list[str]


def edge_artifact(
    path: str | Path, overrides: Overrides | None = None, recipe_path: Path | None = None, progress: Progress = print
) -> EdgeOutcome:
    """Convert, judge and record the edge models the settings ask for; see the module doc."""
    opened = open_for_model(
        path, "edge", lambda rel: rel.startswith("edge/"), overrides, recipe_path, flags="--precision, --layout ..."
    )
    artifact, settings, notes, manifest = opened.artifact, opened.settings, opened.notes, opened.artifact.manifest
    plan = plan_edge(opened, overrides, progress)
    has_target = plan.evaluation.target is not None
    gate = GateSettings.read(settings.model_dump())
    refuse_unread_budgets("edge", plan.precisions, gate)
    policies = {p: hop_policy("edge", p, manifest.task, has_target, gate, manifest.detection) for p in plan.precisions}
    progress(
        f"[edge] {artifact.root}: converting with onnx2tf ({', '.join(plan.precisions)}; layout {settings.layout})"
    )

    with StageWrite(artifact.root, "edge") as write:
        gate = LiteRTGate(artifact, plan, policies, write.scratch, notes, progress)
        try:
            attempts = attempts_for(manifest.task, op_types(opened.model))
            judged, tried = convert_in_turn(opened.model, write.scratch / "convert", plan.convert, plan.calibration,
                                            gate, attempts, progress)  # fmt: skip
        except NotConverted as exc:
            kept = record_refused(write, settings, opened.parent, plan, exc)
            message = f"no onnx2tf setting tried converts the model; the last said: {exc}"
            if advice := guessed_advice(plan.fixed, plan.spec.inputs):
                message += f"\n{advice}"
            if kept:  # the copy kept in the artifact: the scratch directory it was written in goes away
                message += f"\nonnx2tf's last log: {kept}; the attempts: {CONVERT_REPORTS[1]}"
            raise CheckFailed(message) from None
        write_convert_report(write.scratch, tried, plan)
        if any(a.used and "fixed_batch" in a.options for a in tried):
            notes.append("the edge models take a batch of 1 (onnx2tf converts ConvTranspose only at a fixed batch): "
                         "a device program feeds one sample a call, as the gate did")  # fmt: skip
            progress(f"[edge] note: {notes[-1]}")
        for warning in dict.fromkeys(w for m in judged.made for w in m.converted.warnings):  # e.g. int8 not made
            notes.append(warning)
            progress(f"[edge] note: {warning}")
        written = _place(write.scratch, judged, artifact)
        _check_on_device(judged.made, write.scratch, plan, opened, progress)
        record = record_made(settings, opened.parent, plan, judged.made, tried, written, opened.rewritten)
        artifact = write.commit([*written, *CONVERT_REPORTS], record)
    _raise_on_failures(judged.made, tried, guessed_advice(plan.fixed, plan.spec.inputs))
    return EdgeOutcome(artifact, judged.made, [m.name for m in judged.made if not m.passed], notes)


def _place(scratch: Path, judged: Judged, artifact: Artifact) -> list[str]:
    """Move the judged models to their place under `scratch/edge/` and write feeding.json and labels.txt
    beside them; the files written, relative to the version."""
    for m in judged.made:
        target = scratch / variant_file(m.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(m.converted.path, target)
        m.converted.path = target
    models = {Path(variant_file(m.name)).name: judged.entries[m.converted.precision] for m in judged.made}
    feeding = write_feeding(scratch / "edge", artifact.manifest, models) if judged.made else []
    return [*(variant_file(m.name) for m in judged.made), *feeding]


def _check_on_device(
    made: list[EdgeMade], scratch: Path, plan: EdgePlan, opened: Opened[EdgeSpec], progress: Progress
) -> None:
    """Run each model on the device-like runtime, fed from feeding.json beside it; its rows join the gate's
    report. Without such a runtime a note says the models were verified on LiteRT only."""
    python = device_python()
    if python is None:
        opened.notes.append(
            "no device-like runtime to check on (make edge-runtime builds one: numpy<2 + tflite-runtime 2.14; "
            f"or set {DEVICE_PYTHON_ENV}); the edge models were verified on LiteRT only"
        )
        return
    if not made:
        return
    golden = _device_golden(scratch, plan, opened.artifact) if plan.resampled else opened.artifact.path(GOLDEN_NAME)
    runtime = device_runtime(python)
    for m in made:
        tolerance = device_tolerance(m.converted.precision, m.policy)
        m.device = device_check(python, m.converted.path, golden, tolerance, runtime)
        m.report.rows += m.device.rows
        verdict = "runs" if m.device.ran else f"FAILS: {m.device.detail}"
        progress(f"[edge] {m.name} on {m.device.runtime}: {verdict}")


def _device_golden(scratch: Path, plan: EdgePlan, artifact: Artifact) -> Path:
    """golden inputs resampled to the device shapes, with model.onnx's outputs on them, for the device check."""
    samples = plan.evaluation.samples
    outputs = ort_runner(artifact.path(MODEL_FILE))(samples)
    path = scratch / "device-golden.npz"
    arrays = {**{f"in.{k}": v for k, v in samples.items()}, **{f"out.{k}": v for k, v in outputs.items()}}
    np.savez(path, **arrays)
    return path


def _raise_on_failures(made: list[EdgeMade], tried: list[ConvertAttempt], advice: str | None) -> None:
    """CheckFailed naming each model that failed (recorded as failed, not shipped) and its failed checks; `advice`:
    the guessed sizes and the flag that gives the real ones."""
    failed = [m for m in made if not m.passed]
    if not failed:
        return
    lines = "\n".join(f"{m.name}:\n{m.report.table(only_failures=True)}" for m in failed)
    if not any(a.used for a in tried):  # every onnx2tf setting was left: these are the first conversion's models
        lines += f"\nno onnx2tf setting gave models that pass; {attempts_text(tried)}"
    lines += "".join(f"\nonnx2tf attempt {a.name!r}: {a.reason}" for a in tried if a.used and a.reason)
    lines += f"\n{advice}" if advice else ""
    raise CheckFailed(f"edge model(s) failed verification (recorded as failed, not shipped): "
                      f"{', '.join(m.name for m in failed)}\n{lines}")  # fmt: skip


def _fresh(ctx: Context) -> str | None:
    record = Artifact.load(ctx.version, verify=False).manifest.stages.edge
    if record is not None and (record.failed or not record.variants):
        return None  # a failed edge model fails the run again (exit 1) rather than pass as up to date
    return made_from_model_fresh(ctx, "edge", "edge models")


def _run(ctx: Context) -> str:
    outcome = edge_artifact(ctx.version, recipe_path=ctx.recipe_path, progress=ctx.progress)
    return f"{', '.join(m.name for m in outcome.made)} in {ctx.version / 'edge'}"


def _off(ctx: Context) -> str | None:
    return lm_off("edge")(ctx) or (None if ctx.recipe.edge.enabled else "edge.enabled: false")


STAGE = Stage("edge", _fresh, _run, _off, judges=True)
