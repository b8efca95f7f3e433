"""`pipe benchmark ARTIFACT`: every format the artifact holds, timed side by side in one run, and recorded.

Each format was timed once already by the stage that made it, but at another moment, on a machine
that is shared and noisy, and ONNX only: the numbers do not compare. Here every row (torch eager,
model.onnx, each ONNX variant, each TFLite model) runs in the same interleaved rounds
(`pipeline.runtime.latency.measure_sessions`), on the same golden inputs, with the same thread count, at
batch 1 (p50/p95 latency) and batch 32 (throughput), and is shown beside its size and the metric
its stage recorded. reports/benchmark.json and reports/benchmark.png are written through
`StageWrite`, so they are listed in the manifest with their hashes, and an interrupted run leaves
the previous report (or none), never half of one.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.golden import load_golden
from pipeline.artifact.records import BenchmarkRecord
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import FP32
from pipeline.benchmark.lm import decoder_rows, is_decoder, speed_figures, time_decoder_rows
from pipeline.benchmark.outcome import BATCH, MAX_RUNS, THROUGHPUT_BATCH, BenchmarkOutcome, Result
from pipeline.benchmark.rows import Row, drop, metric_name, plan_rows, timed_files
from pipeline.benchmark.sessions import open_rows, versions
from pipeline.core.errors import InputError
from pipeline.core.host import describe_host
from pipeline.recipe.current import current_recipe, section_settings
from pipeline.runtime.latency import measure_sessions
from pipeline.stagekit.contract import Context, Overrides, Progress, Stage

REPORT = "reports/benchmark.json"
PLOT = "reports/benchmark.png"


def benchmark_artifact(
    path: str | Path,
    overrides: Overrides | None = None,
    recipe_path: Path | None = None,
    progress: Progress = print,
    *,
    plot: bool = True,
) -> BenchmarkOutcome:
    """Time every format of the artifact at `path` side by side, then record reports/benchmark.json (and .png).

    Settings: the recipe's `benchmark:` section as it is now (an imported model: its defaults) with
    `overrides` on top: `seconds`, timed runs per row and batch; `threads`, the threads every runtime
    gets (onnxruntime intra-op, torch, LiteRT). InputError (exit 2) for bad settings or an artifact
    without model.onnx.
    """
    artifact = Artifact.load(resolve_artifact(path), replacing=[REPORT, PLOT])
    recipe = current_recipe(artifact, recipe_path)[0] if artifact.manifest.stages.train else None
    wanted = section_settings(recipe, "benchmark", dict(overrides or {}))  # each bad value named by its flag
    seconds, threads = wanted.seconds, wanted.threads
    rows, notes = plan_rows(artifact)
    if is_decoder(artifact):
        return _benchmark_decoder(artifact, decoder_rows(artifact, rows, notes), notes, seconds, threads, progress)
    inputs = load_golden(artifact).inputs
    settings = {"seconds": seconds, "threads": threads, "batch": BATCH, "throughput_batch": THROUGHPUT_BATCH}
    batches = (BATCH, THROUGHPUT_BATCH)
    progress(
        f"[benchmark] {len(rows)} rows: {', '.join(row.name for row in rows)}; {threads} thread(s), {seconds:g} s each"
    )
    with open_rows(artifact, rows, threads, inputs, batches) as (sessions, untimed):
        for name, why in untimed.items():
            progress(f"[benchmark] {name}: not timed: {why}")
        timed = (
            measure_sessions(
                sessions,
                inputs,
                batches,
                threads,
                seconds,
                max_runs=MAX_RUNS,
                progress=lambda message: progress(f"[benchmark] {message}"),
            )
            if sessions
            else {}
        )
    name = metric_name(artifact)
    fp32 = next((row.metric for row in rows if row.name == FP32), None)
    results = [
        Result(row, timed.get(row.name), untimed.get(row.name, ""), drop(name, fp32, row.metric)) for row in rows
    ]
    manifest = artifact.manifest
    outcome = BenchmarkOutcome(
        root=artifact.root,
        name=manifest.name,
        version=manifest.version,
        metric=name,
        results=results,
        settings=settings,
        machine=_machine(),
        notes=notes,
    )
    _record(artifact, outcome, timed_files(artifact, rows), plot)
    return outcome


def _benchmark_decoder(
    artifact: Artifact, rows: list[Row], notes: list[str], seconds: float, threads: int, progress: Progress
) -> BenchmarkOutcome:
    """A decoder's rows timed as generations (lm.py): time to first token, prefill and decode tokens/s."""
    progress(f"[benchmark] {len(rows)} rows: {', '.join(row.name for row in rows)}; {threads} thread(s), "
             f"{seconds:g} s of generations each")  # fmt: skip
    speeds, untimed, prompt = time_decoder_rows(
        artifact, rows, threads, seconds, lambda message: progress(f"[benchmark] {message}")
    )
    for name, why in untimed.items():
        progress(f"[benchmark] {name}: not timed: {why}")
    fp32 = speeds.get(FP32)
    results = [
        Result(row, None, untimed.get(row.name, ""), None, speed_figures(speeds.get(row.name), fp32) or None)
        for row in rows
    ]
    notes.append("a decoder has no plot: the table and reports/benchmark.json hold its figures")
    outcome = BenchmarkOutcome(
        root=artifact.root,
        name=artifact.manifest.name,
        version=artifact.manifest.version,
        metric=None,
        results=results,
        settings={"seconds": seconds, "threads": threads, **prompt},
        machine=_machine(),
        notes=notes,
    )
    _record(artifact, outcome, timed_files(artifact, rows), False)
    return outcome


def benchmark_fresh(root: Path) -> str | None:
    """Why the recorded benchmark is up to date, or None to run it.

    Up to date while manifest.stages.benchmark exists, its report is listed, it timed the files the
    artifact holds now (`inputs`: every timed file's sha256, the torch weights and golden.npz
    included) and the rows it would time now are the rows it timed.
    """
    artifact = Artifact.load(root, verify=False)
    record = artifact.manifest.stages.benchmark
    if record is None or record.report not in artifact.manifest.files:
        return None
    if record.plot is not None and record.plot not in artifact.manifest.files:
        return None
    try:
        rows, notes = plan_rows(artifact)
    except InputError:
        return None
    if is_decoder(artifact):
        rows = decoder_rows(artifact, rows, notes)
    if record.inputs != timed_files(artifact, rows) or record.formats != [row.name for row in rows]:
        return None
    untimed = f" ({len(record.failed)} not timed: {', '.join(record.failed)})" if record.failed else ""
    return f"{record.report} timed these {len(rows)} models as they are now{untimed}"


def _record(artifact: Artifact, outcome: BenchmarkOutcome, inputs: dict[str, str], plot: bool) -> None:
    """Write the report (and plot) in a scratch directory, then move them in and record the stage under the lock."""
    from pipeline.benchmark.plot import write_plot

    with StageWrite(artifact.root, "benchmark") as write:
        outcome.report = artifact.root / REPORT
        files = [REPORT]
        if plot:
            write_plot(outcome, write.scratch / PLOT)
            outcome.plot = artifact.root / PLOT
            files.append(PLOT)
        (write.scratch / REPORT).parent.mkdir(parents=True, exist_ok=True)
        (write.scratch / REPORT).write_text(json.dumps(outcome.to_dict(), indent=2) + "\n")

        def record(fresh: Artifact) -> None:
            if not plot and PLOT in fresh.manifest.files:  # an old plot would show other numbers
                fresh.remove_file(PLOT)
            fresh.manifest.stages.benchmark = BenchmarkRecord(
                settings=outcome.settings,
                inputs=inputs,
                report=REPORT,
                plot=PLOT if plot else None,
                formats=[result.row.name for result in outcome.results],
                failed=outcome.failed,
            )

        write.commit(files, record)


def _machine() -> dict[str, Any]:
    """Where the numbers were taken: they hold for this machine only."""
    return {
        "cpu": describe_host()["cpu"],  # the CPU's model name: the card says what the timings ran on
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions(),
    }


def _fresh(ctx: Context) -> str | None:
    """Up to date while it timed, with the recipe's `benchmark:` settings, the files the version holds."""
    record, wanted = Artifact.load(ctx.version, verify=False).manifest.stages.benchmark, ctx.recipe.benchmark
    same = record is not None and [record.settings.get(k) for k in ("seconds", "threads")] == [
        wanted.seconds,
        wanted.threads,
    ]
    return benchmark_fresh(ctx.version) if same else None


def _run(ctx: Context) -> str:
    benchmark_artifact(ctx.version, recipe_path=ctx.recipe_path, progress=ctx.progress)
    return str(ctx.version / REPORT)


def _off(ctx: Context) -> str | None:
    return None if ctx.recipe.benchmark.enabled else "benchmark.enabled: false"


STAGE = Stage("benchmark", _fresh, _run, _off)
