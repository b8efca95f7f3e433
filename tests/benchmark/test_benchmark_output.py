"""The benchmark's table and plot on outcomes built inline: text that looks like markup, metrics that are not numbers.

No model is timed here: the rows and their timings are made by hand, so each test runs in well under a second.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.benchmark.outcome import BenchmarkOutcome, Result
from pipeline.benchmark.plot import plotted, write_plot
from pipeline.benchmark.rows import Row
from pipeline.benchmark.table import render
from pipeline.runtime.latency import BatchLatency, Latency


def timed(p50_ms: float) -> Latency:
    """Timings at batch 1 and 32 with a p50 of `p50_ms` at batch 1."""
    return Latency({b: BatchLatency(b, p50_ms * b, p50_ms * b, p50_ms * b, 100, 1e3 / p50_ms) for b in (1, 32)}, 1)


def outcome(rows: list[tuple[str, float | None, str]], metric: str | None = "mae") -> BenchmarkOutcome:
    """One onnxruntime row per (name, metric value, reason), each timed a little slower than the one before."""
    results = [
        Result(
            Row(name=name, format="onnx", precision="fp32", file=f"{name}.onnx", size=1024 * (i + 1),
                status="failed" if reason else "passed", reason=reason, metric=value),
            timed(0.01 * (i + 1)),
        )
        for i, (name, value, reason) in enumerate(rows)
    ]  # fmt: skip
    return BenchmarkOutcome(Path("."), "m", 1, metric, results, {"threads": 1, "seconds": 1.0}, {})


def test_reasons_and_names_that_look_like_rich_markup_are_printed_as_they_are() -> None:
    reasons = ["input 'x' has shape [batch, 64], expected [1, 64]", "cannot open [/tmp/model.onnx]", "[bold]x[/bold]"]
    text = render(outcome([(f"[red]v{i}", 0.5, reason) for i, reason in enumerate(reasons)]), width=400)
    for i, reason in enumerate(reasons):
        assert reason in text and f"[red]v{i}" in text, text


def test_a_plot_with_metrics_that_are_not_finite_leaves_those_rows_out_and_names_them(tmp_path: Path) -> None:
    for rows, left_out in (
        ([("fp32", math.nan, ""), ("opt", 0.5, ""), ("int8", 0.7, "")], ["fp32"]),  # the first row's metric is NaN
        ([("fp32", math.nan, "")], ["fp32"]),  # a single row, without a finite metric
        ([("fp32", 0.5, ""), ("fp16", math.inf, "overflow")], ["fp16"]),
        ([("fp32", 0.5, "")], []),  # a single row: a plot with one point
    ):
        assert plotted(outcome(rows))[1] == left_out
        path = tmp_path / "benchmark.png"
        write_plot(outcome(rows), path)
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] >= 600
            assert (np.asarray(image.convert("L")) < 128).mean() > 0.005  # axes and text, not a blank file


def test_the_title_says_the_run_cap_that_ends_a_fast_models_timing_before_its_seconds() -> None:
    text = render(outcome([("fp32", 0.5, "")]), width=200)
    assert "1 s or 2000 runs per row and batch" in text.replace("\n", ""), text
