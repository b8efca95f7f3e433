"""What a benchmark measured: each row's timings (`Result`) and the whole run (`BenchmarkOutcome`).

Read by the stage that measures it (stage.py), the table (table.py) and the plot (plot.py).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.benchmark.rows import Row
from pipeline.runtime.latency import Latency

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
    speed: dict[str, Any] | None = None  # a decoder's: time to first token, tokens/s, ratios to fp32 (lm.py)

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
            "timed": self.latency is not None or self.speed is not None,
            "not_timed": self.not_timed,
            "fixed_batch": self.latency.fixed_batch if self.latency else None,
            **figures,
            **(self.speed or {}),
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
        return [r.row.name for r in self.results if r.latency is None and r.speed is None]

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
