"""`pipe optimize ARTIFACT`: graph-optimized and quantized variants of model.onnx, each judged against it.

Steps: read the recipe's `optimize:` section as it is now (command-line values on top; an
imported artifact has no recipe and uses the defaults); read calibration samples when a kind asked
for calibrates; make each variant kind asked for (`kinds.KINDS`, in order: `opt`, `int8-dynamic`,
`int8-static`, `fp16`, and `int8` for auto) into a scratch directory, each judged against
model.onnx by its kind (the lossless policy for `opt`, the task's budget for the lossy ones); a
kind that fails to make its file is its variant's failed record, and the others are still made;
time all of them and model.onnx side by side in one run; then, under the artifact's lock, move them
into place and record each variant (passed, or failed with the reason: never served by default),
the stage record and reports/optimize.json + .md. A variant that misses its budget is still
written, so the best effort is there to inspect; `strict` makes the command exit 1. The run's
wall time and peak memory (the process's maximum resident set) are printed and reported.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact
from pipeline.artifact.records import OptimizeRecord
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import FP32, MODEL_FILE, Variant, variant_file
from pipeline.core.errors import ArtifactError, CheckFailed, InputError, PipelineError
from pipeline.core.fsutil import sha256_file
from pipeline.optimize.decoder import DecoderJudge, keep_smallest, speed_words, time_decoders
from pipeline.optimize.judge import Judge, Verdict
from pipeline.optimize.kind import Job, Kind, Made
from pipeline.optimize.kinds import KINDS
from pipeline.optimize.optimize_md import markdown
from pipeline.recipe.schema import OptimizeSpec
from pipeline.runtime.external_data import model_bytes, model_files
from pipeline.runtime.latency import affordable_batches, measure
from pipeline.samples.calibration import Calibration, calibration_set, has_real_samples
from pipeline.stagekit.contract import Context, Overrides, Progress, Stage, lm_off
from pipeline.stagekit.opening import made_from_model_fresh, open_for_model
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.report import GateReport, Row

REPORT_JSON, REPORT_MD = "reports/optimize.json", "reports/optimize.md"
TEXT_GENERATION = "text-generation"


def _rewrites(rel: str) -> bool:
    """The files an optimize run writes anew: every ONNX variant and its reports."""
    return rel.startswith("variants/") or rel in (REPORT_JSON, REPORT_MD)


@dataclass
class OptimizeOutcome:
    artifact: Artifact
    made: list[Made]
    failed: list[str]  # variants that missed their budget (recorded as failed)
    notes: list[str]
    seconds: float = 0.0  # wall time of the run
    peak_rss: int = 0  # bytes: the process's peak resident memory at the end of the run


def optimize_artifact(
    path: str | Path, overrides: Overrides | None = None, recipe_path: Path | None = None, progress: Progress = print
) -> OptimizeOutcome:
    """Make, judge, time and record the variants the settings ask for; see the module doc."""
    began = time.perf_counter()
    opened = open_for_model(
        path, "optimize", _rewrites, overrides, recipe_path, flags="--quantize, --max-accuracy-drop ..."
    )
    artifact, recipe, settings, evaluation, notes = (
        opened.artifact, opened.recipe, opened.settings, opened.evaluation, opened.notes
    )  # fmt: skip
    manifest = artifact.manifest
    gate = GateSettings.read(settings.model_dump())
    has_target = evaluation.target is not None
    lossless = hop_policy("optimize", "fp32", manifest.task, has_target, gate, manifest.detection)
    policy = hop_policy("optimize", "int8", manifest.task, has_target, gate, manifest.detection)
    parent, source, rewritten = opened.parent, opened.model, opened.rewritten
    bounds = ", ".join(f"{k} {v}" for k, v in policy.to_dict().items() if k != "policy")
    generating = manifest.task == TEXT_GENERATION  # a decoder: judged on text, timed by tokens/s (decoder.py)
    if generating:
        judge: Judge | DecoderJudge = DecoderJudge(artifact, source, evaluation.data or evaluation.samples, policy,
                                                   lossless)  # fmt: skip
        judged_on = f"{judge.source} ({evaluation.source})"
    else:
        judge, judged_on = Judge(artifact, source, evaluation, policy, lossless), evaluation.source
    progress(f"[optimize] {artifact.root}: budget {policy.name} ({bounds}); evaluated on {judged_on}")
    kinds = [k for k in KINDS if k.serves(manifest.task)]
    passed_over = [k.name for k in KINDS if k not in kinds and k.asked(settings) and k.choice != "auto"]
    if generating and passed_over:
        notes.append(f"{', '.join(passed_over)} not made: a decoder's variants are weight-only "
                     f"({', '.join(k.name for k in kinds if k.precision != 'fp32')}); quantizing its activations "
                     "kept about half its next tokens on a real 135M model (issue 29)")  # fmt: skip
    real = has_real_samples(artifact)
    needs_calibration = any(k.asked(settings) and k.calibrates(settings, real) for k in kinds)
    calibration = calibration_set(artifact, recipe, settings.calibration_samples) if needs_calibration else None

    with StageWrite(artifact.root, "optimize") as write:
        (write.scratch / "variants").mkdir()
        job = Job(source, write.scratch, write.scratch, judge, calibration, lambda line: progress(f"[optimize] {line}"))
        made = _make_variants(kinds, job, settings, manifest.task, notes)
        written = [m for m in made if m.written]
        files = {FP32: source, **{m.name: write.scratch / m.file for m in written}}
        if generating:  # prefill and decode tokens/s; --quantize auto keeps the smallest that passed
            base, batches = _time_decoders(artifact, files, made, settings, progress), []
            if "auto" in settings.quantize:
                made = _keep_smallest(made, kinds, write.scratch, notes, progress)
        else:
            base, batches = _time_models(files, made, evaluation.samples, settings.threads, progress)
        written = [m for m in made if m.written]
        placed = {m.name: _files(write.scratch, m.file) for m in written}  # a variant and its external data
        summary = _summary(artifact, settings, policy.to_dict(), judged_on, calibration, made, base, batches,
                           model_bytes(source))  # fmt: skip
        seconds, peak = time.perf_counter() - began, peak_rss()
        summary["resources"] = {"wall_seconds": round(seconds, 2), "peak_rss_bytes": peak}
        summary["notes"] = notes
        (write.scratch / "reports").mkdir()
        (write.scratch / REPORT_JSON).write_text(json.dumps(summary, indent=2) + "\n")
        (write.scratch / REPORT_MD).write_text(markdown(summary))
        moved = [rel for m in written for rel in placed[m.name]]  # each variant's data before its graph
        stale = [rel for rel in rewritten if rel not in {*moved, REPORT_JSON, REPORT_MD}]

        artifact = write.commit(
            [*moved, REPORT_JSON, REPORT_MD],
            lambda fresh: _record(fresh, made, stale, parent, base, settings, policy.to_dict()),
        )
    progress(f"[optimize] done in {seconds:.1f} s, peak memory {peak / 2**30:.2f} GiB (maximum resident set)")
    failed = [m.name for m in made if not m.verdict.passed]
    if failed and settings.strict:
        raise CheckFailed(
            "variant(s) missed their budget (recorded as failed, not served; see "
            f"{artifact.root / REPORT_MD}):\n  "
            + "\n  ".join(f"{m.name}: {m.verdict.detail}" for m in made if m.name in failed)
        )
    return OptimizeOutcome(artifact, made, failed, notes, seconds, peak)


def peak_rss() -> int:
    """The process's peak resident memory so far, in bytes (getrusage: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _make_variants(
    kinds: list[Kind],
    job: Job,
    settings: OptimizeSpec,
    task: str,
    notes: list[str],
) -> list[Made]:
    """Each kind the settings ask for, in the list's order. One that fails is that variant's failed record (no
    file, the reason said), never the end of the run: every variant that passed is still written and recorded."""
    made = []
    for kind in kinds:
        if not kind.asked(settings) or not kind.serves(task):
            continue
        config = kind.config(settings, task)
        source, parent = job.source, None
        if kind.parent is not None:  # made from a variant of this run: it must be there, and have passed
            base = next((m for m in made if m.name == kind.parent and m.written and m.verdict.passed), None)
            source = job.scratch / base.file if base is not None else source
            parent = sha256_file(source) if base is not None else None
        why = kind.skip(source, config) if kind.parent is None or parent is not None else (
            f"{kind.name} not made: it is made from {kind.parent}, which this run did not make or which failed"
        )  # fmt: skip
        if why:
            notes.append(why)
            job.say(why)
            continue
        dst = job.scratch / variant_file(kind.name)
        try:
            made.append(kind.make(replace(job, source=source, dst=dst), config))
            made[-1].parent = parent
        except PipelineError as exc:
            if isinstance(exc, InputError) and not isinstance(exc, ArtifactError):
                raise  # bad usage (a setting, samples the kind needs): exit 2, as in any other stage
            dst.unlink(missing_ok=True)  # onnxruntime could not make or load it: this variant failed, the run goes on
            made.append(_not_made(kind, config, exc))
            made[-1].parent = parent
            job.say(f"{kind.name}: FAILED, not made: {made[-1].verdict.detail}")
    return made


def _time_decoders(
    artifact: Artifact, files: dict[str, Path], made: list[Made], settings: OptimizeSpec, progress: Progress
) -> dict[str, float]:
    """Time model.onnx and each written decoder variant side by side (prefill and decode tokens/s, batch 1):
    each variant's latency, size and words on its speed set; model.onnx's figures returned."""
    written = [m for m in made if m.written]
    progress(f"[optimize] timing model.onnx and {len(written)} variant(s) side by side: prefill and decode "
             f"tokens/s, batch 1 ({settings.threads} thread)")  # fmt: skip
    speeds = time_decoders(artifact, files, settings.threads, progress)
    for m in written:
        m.latency, m.size = speeds[m.name].to_dict(), model_bytes(files[m.name])
        m.note = " ".join(filter(None, [m.note, speed_words(speeds[m.name], speeds[FP32])]))
    return speeds[FP32].to_dict()


def _keep_smallest(
    made: list[Made], kinds: list[Kind], scratch: Path, notes: list[str], progress: Progress
) -> list[Made]:
    """`--quantize auto` on a decoder: the smallest weight-only variant that passed, the other files removed."""
    kept, why = keep_smallest(made, {k.name for k in kinds if k.precision != "fp32"})
    for m in [m for m in made if m.written and m not in kept]:
        (scratch / m.file).unlink()
    if why:
        notes.append(why)
        progress(f"[optimize] {why}")
    return kept


def _time_models(
    files: dict[str, Path], made: list[Made], samples: dict[str, Any], threads: int, progress: Progress
) -> tuple[dict[str, float], list[int]]:
    """Time model.onnx and each written variant side by side at the batches the machine affords (1 and 32, or
    the one a model with a fixed batch takes): each variant's latency and size set; model.onnx's latency and
    the batches returned."""
    written = [m for m in made if m.written]
    batches = affordable_batches(files[FP32], samples, threads=threads)
    progress(f"[optimize] timing model.onnx and {len(written)} variant(s) side by side at batch "
             f"{', '.join(map(str, batches))} ({threads} thread)")  # fmt: skip
    timed = measure(files, samples, batches=batches, threads=threads, progress=progress)
    for m in written:
        m.latency = timed[m.name].to_dict()
        m.size = model_bytes(files[m.name])  # with its external data
    return timed[FP32].to_dict(), sorted(timed[FP32].batches)


def _record(
    fresh: Artifact,
    made: list[Made],
    stale: list[str],
    parent: str,
    base: dict[str, float],
    settings: OptimizeSpec,
    policy: dict[str, Any],
) -> None:
    """The run into the freshly read manifest: earlier variants this run did not make again removed, each
    variant recorded (passed, or failed with why), model.onnx's timing beside them, the stage record."""
    for rel in stale:  # variants of an earlier run that this run did not make again
        fresh.remove_file(rel)
        for name in [k for k, v in fresh.manifest.variants.items() if v.file == rel]:
            del fresh.manifest.variants[name]
    for m in made:
        if m.written:
            fresh.add_variant(m.name, _variant(m, m.parent or parent, fresh))
        else:  # failed before it had a file: recorded with why, nothing listed
            fresh.manifest.variants[m.name] = _variant(m, m.parent or parent, fresh)
    if FP32 in fresh.manifest.variants:  # timed beside the variants: what `--variant best` compares
        fresh.manifest.variants[FP32].latency = base
    fresh.manifest.stages.optimize = OptimizeRecord(
        settings=settings.model_dump(mode="json"),
        inputs={MODEL_FILE: parent},
        parent=parent,
        policy=policy,
        variants=[m.name for m in made],
        failed=[m.name for m in made if not m.verdict.passed],
        report=REPORT_JSON,
    )


def _files(scratch: Path, rel: str) -> list[str]:
    """The variant file `rel` and the external data files it names, data first, relative to `scratch`."""
    return [path.relative_to(scratch).as_posix() for path in model_files(scratch / rel)]


def _not_made(kind: Kind, config: Any, exc: PipelineError) -> Made:
    """The record of a kind that failed before it had a file to judge: failed, with why."""
    detail = f"not made: {exc}"
    verdict = Verdict(False, math.nan, -math.inf, detail, GateReport([Row("make", "-", False, detail)]))
    settings = config.to_dict() if hasattr(config, "to_dict") else asdict(config)
    return Made(kind.name, kind.precision, settings, verdict, {}, written=False)


def _variant(m: Made, parent: str, artifact: Artifact) -> Variant:
    metric = m.verdict.report.metric
    return Variant(
        file=m.file,
        precision=m.precision,
        format="onnx",
        stage="optimize",
        parent=parent,
        settings=m.settings,
        status="passed" if m.verdict.passed else "failed",
        reason="" if m.verdict.passed else m.verdict.detail,
        metrics={metric["name"]: metric["onnx"]} if metric.get("name") and "onnx" in metric else {},
        parity={**m.verdict.report.summary(), "budget_figure": m.verdict.figure, "margin": m.verdict.margin},
        latency=m.latency,
        size=m.size,  # with its external data
        note=m.note or None,
    )


def _summary(
    artifact: Artifact,
    settings: OptimizeSpec,
    policy: dict[str, Any],
    evaluation: str,
    calibration: Calibration | None,
    made: list[Made],
    base: dict[str, float],
    batches: list[int],
    size: int,
) -> dict[str, Any]:
    """reports/optimize.json: everything a person or CI needs to see what was tried and why. `base`: model.onnx's
    latency (a decoder's: prefill and decode tokens/s), timed beside the variants at `batches` (a decoder: none);
    `size`: model.onnx's bytes with its external data."""
    rows = []
    for m in made:
        rows.append(
            {
                "variant": m.name,
                "file": m.file,
                "precision": m.precision,
                "status": "passed" if m.verdict.passed else "failed",
                "detail": m.verdict.detail,
                "budget_figure": m.verdict.figure,
                "margin": m.verdict.margin,
                "latency": m.latency,
                **{f"speedup_b{b}": _ratio(base, m.latency, f"p50_ms_b{b}") for b in batches},
                **(
                    {f"speedup_{k}": _ratio(m.latency, base, f"{k}_tokens_per_s") for k in ("prefill", "decode")}
                    if "decode_tokens_per_s" in base
                    else {}
                ),
                "size": m.size,
                "settings": m.settings,
                "note": m.note,
                "details": m.details,
                "gate": m.verdict.report.to_dict(),
            }
        )
    return {
        "model": f"{artifact.manifest.name} v{artifact.manifest.version}",
        "settings": settings.model_dump(mode="json"),
        "policy": policy,
        "evaluation": evaluation,
        "calibration": calibration.source if calibration else None,
        "fp32": {"file": MODEL_FILE, "size": size, "latency": base},
        "batches": batches,
        "variants": rows,
    }


def _ratio(base: dict[str, float], other: dict[str, float], key: str) -> float | None:
    return base[key] / other[key] if key in base and other.get(key) else None


def _fresh(ctx: Context) -> str | None:
    return made_from_model_fresh(ctx, "optimize", "variants")


def _run(ctx: Context) -> str:
    outcome = optimize_artifact(ctx.version, recipe_path=ctx.recipe_path, progress=ctx.progress)
    failed = f"; failed their budget (not served): {', '.join(outcome.failed)}" if outcome.failed else ""
    return f"{', '.join(m.name for m in outcome.made)} in {ctx.version / 'variants'}{failed}"


STAGE = Stage("optimize", _fresh, _run, lm_off("optimize"))
