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

import datetime as _dt
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.artifact.records import BenchmarkRecord
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import FP32
from pipeline.benchmark.rows import Row, drop, metric_name, plan_rows, timed_files
from pipeline.benchmark.sessions import open_rows, versions
from pipeline.core.errors import InputError
from pipeline.runtime.latency import Latency, measure_sessions

REPORT = "reports/benchmark.json"
PLOT = "reports/benchmark.png"
BATCH = 1  # latency (p50, p95) is taken at this batch
THROUGHPUT_BATCH = 32  # throughput (samples/s) at this one
# Timed runs per row and batch at most: a model of tens of microseconds reaches it long before `seconds`. Every
# row runs in every round, so going on until the fastest row has `seconds` of runs would take about
# seconds x (sum of the rows' latencies / the fastest's), tens of seconds per batch for digits-cnn.
MAX_RUNS = 2000


@dataclass
class Result:
    """One row of the table: the model, and its timings or why it was not timed."""

    row: Row
    latency: Latency | None = None
    not_timed: str = ""  # why it was not timed (empty when it was)
    drop: float | None = None  # its metric's drop against model.onnx's (negative: better)

    def at(self, batch: int) -> tuple[int, Any] | None:
        """(batch, timings) at `batch`, or at the model's fixed batch when it ran there only; None if untimed."""
        if self.latency is None:
            return None
        if batch in self.latency.batches:
            return batch, self.latency.batches[batch]
        if self.latency.fixed_batch is not None and self.latency.fixed_batch in self.latency.batches:
            return self.latency.fixed_batch, self.latency.batches[self.latency.fixed_batch]
        return None

    def to_dict(self) -> dict[str, Any]:
        row = self.row
        figures: dict[str, Any] = {}
        if (latency := self.at(BATCH)) is not None:
            batch, timing = latency
            figures |= {"latency_batch": batch, "p50_ms": timing.p50_ms, "p95_ms": timing.p95_ms, "runs": timing.runs}
        if (throughput := self.at(THROUGHPUT_BATCH)) is not None:
            batch, timing = throughput
            figures |= {"throughput_batch": batch, "throughput": timing.throughput}
        return {
            "name": row.name,
            "runtime": row.runtime,
            "format": row.format,
            "precision": row.precision,
            "file": row.file,
            "size_bytes": row.size,
            "status": row.status,
            "reason": row.reason,
            "metric": row.metric,
            "drop": self.drop,
            "timed": self.latency is not None,
            "not_timed": self.not_timed,
            "fixed_batch": self.latency.fixed_batch if self.latency else None,
            **figures,
            "latency": self.latency.to_dict() if self.latency else {},
        }


@dataclass
class BenchmarkOutcome:
    """What one benchmark measured and where it was written."""

    root: Path
    name: str
    version: int
    metric: str | None  # the task metric compared (accuracy, mae), None when the records hold none
    results: list[Result]
    settings: dict[str, Any]
    machine: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    report: Path = Path()
    plot: Path | None = None

    @property
    def failed(self) -> list[str]:
        """The rows that could not be timed."""
        return [r.row.name for r in self.results if r.latency is None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "version": self.version,
            "metric": self.metric,
            "settings": self.settings,
            "machine": self.machine,
            "rows": [result.to_dict() for result in self.results],
            "not_timed": self.failed,
            "notes": self.notes,
            "finished": _dt.datetime.now(_dt.UTC).isoformat(),
        }


def benchmark_artifact(
    root: Path, *, seconds: float = 1.0, threads: int = 1, say: Callable[[str], None] = print, plot: bool = True
) -> BenchmarkOutcome:
    """Time every format of the artifact at `root` side by side, then record reports/benchmark.json (and .png).

    `seconds`: timed runs per row and batch; `threads`: the threads every runtime gets (onnxruntime
    intra-op, torch, LiteRT). InputError (exit 2) for bad settings or an artifact without model.onnx.
    """
    if not threads >= 1:
        raise InputError(f"--threads is {threads}; give 1 or more (every runtime gets the same count)")
    if not seconds > 0:
        raise InputError(f"--seconds is {seconds}; give a positive duration of timed runs per row and batch")
    artifact = Artifact.load(root, replacing=[REPORT, PLOT])
    rows, notes = plan_rows(artifact)
    inputs = load_golden(artifact).inputs
    settings = {"seconds": seconds, "threads": threads, "batch": BATCH, "throughput_batch": THROUGHPUT_BATCH}
    batches = (BATCH, THROUGHPUT_BATCH)
    say(f"[benchmark] {len(rows)} rows: {', '.join(row.name for row in rows)}; {threads} thread(s), {seconds:g} s each")
    with open_rows(artifact, rows, threads, inputs, batches) as (sessions, untimed):
        for name, why in untimed.items():
            say(f"[benchmark] {name}: not timed: {why}")
        timed = (
            measure_sessions(
                sessions,
                inputs,
                batches,
                threads,
                seconds,
                max_runs=MAX_RUNS,
                progress=lambda message: say(f"[benchmark] {message}"),
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
        rows, _ = plan_rows(artifact)
    except InputError:
        return None
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
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions(),
    }
