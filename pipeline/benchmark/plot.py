"""reports/benchmark.png: the task metric (y) against p50 latency at batch 1 (x), one labelled point per row.

The trade-off a deployment chooses on: up and to the left is better (for MAE, down and to the
left). The marker says the runtime (torch, onnxruntime, LiteRT); a hollow marker is a failed or
stale variant (timed, not servable). Rows without a latency at batch 1 (not timed, or a model
with another fixed batch) or without a finite metric are left out and named under the title. An
artifact whose records hold no task metric (an embedding model) is plotted as size against
latency instead.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pipeline.benchmark.outcome import BATCH, BenchmarkOutcome, Result

MARKERS = {"torch": ("s", "tab:orange"), "onnxruntime": ("o", "tab:blue"), "litert": ("^", "tab:green")}
LABELS = {"torch": "torch eager", "onnxruntime": "onnxruntime", "litert": "LiteRT (TFLite)"}


def write_plot(outcome: BenchmarkOutcome, path: Path) -> None:
    """Draw the outcome's scatter into `path` (PNG, about 1000 x 650 pixels)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    metric = outcome.metric
    points, left_out = plotted(outcome)

    figure, axes = plt.subplots(figsize=(8.5, 5.5), dpi=120)
    try:
        for runtime, (marker, color) in MARKERS.items():
            mine = [p for p in points if p[0].row.runtime == runtime]
            if not mine:
                continue
            for usable in (True, False):
                chosen = [p for p in mine if p[0].row.usable == usable]
                if chosen:
                    axes.scatter(
                        [p[1] for p in chosen],
                        [p[2] for p in chosen],
                        marker=marker,
                        s=70,
                        color=color if usable else "none",
                        edgecolors=color,
                        linewidths=1.5,
                        label=LABELS[runtime] + ("" if usable else " (failed or stale)"),
                        zorder=3,
                    )
        latencies = [p[1] for p in points]
        log = bool(latencies) and max(latencies) / min(latencies) > 20
        if log:
            axes.set_xscale("log")
        _label(axes, points, log)
        values = [p[2] for p in points]
        if values:  # a little room around the values, never a range of nothing (every row at one accuracy)
            low, high = min(values), max(values)
            pad = max((high - low) * 0.3, abs(high) * 0.004, 1e-3)
            axes.set_ylim(low - pad, high + pad)
        axes.set_xlabel(f"p50 latency at batch {BATCH} (ms)")
        axes.set_ylabel(f"{metric} (recorded on the evaluation split)" if metric else "size (KiB)")
        threads = outcome.settings["threads"]
        title = (
            f"{outcome.name} v{outcome.version}: {metric or 'size'} vs latency, "
            f"{threads} thread{'s' if threads != 1 else ''}"
        )
        if left_out:
            title += f"\nnot plotted (no batch-{BATCH} latency, or no finite metric): {', '.join(left_out)}"
        axes.set_title(title, fontsize=10)
        axes.grid(True, alpha=0.3)
        if points:
            axes.legend(fontsize=8, loc="best")
            axes.margins(x=0.15)
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)


def plotted(outcome: BenchmarkOutcome) -> tuple[list[tuple[Result, float, float]], list[str]]:
    """(result, p50 ms at batch 1, metric or KiB) for each row that can be drawn, and the names of those that
    cannot: not timed at batch 1, or no metric, or one that is not a finite number (a NaN MAE of a model that
    overflowed in fp16 would make the axis limits NaN)."""

    points, left_out = [], []
    for result in outcome.results:
        timing = result.latency.batches.get(BATCH) if result.latency else None
        value = result.row.metric if outcome.metric else result.row.size / 1024
        if timing is None or value is None or not math.isfinite(value):
            left_out.append(result.row.name)
            continue
        points.append((result, timing.p50_ms, value))
    return points, left_out


def _label(axes: Any, points: list[tuple[Result, float, float]], log: bool) -> None:
    """Name every point. Points close together at one metric (an fp32 ONNX beside its TFLite twin) share one
    block of names with their latency, stacked in latency order, so no two labels print over each other; blocks
    alternate above and below the points along x."""
    if not points:
        return
    xs = [math.log10(p[1]) if log else p[1] for p in points]
    ys = [p[2] for p in points]
    x_span = (max(xs) - min(xs)) or 1.0
    y_span = (max(ys) - min(ys)) or 1.0
    clusters: list[list[int]] = []
    for index in sorted(range(len(points)), key=lambda i: xs[i]):
        last = clusters[-1][-1] if clusters else None
        near = last is not None and (xs[index] - xs[last]) / x_span < 0.08 and abs(ys[index] - ys[last]) / y_span < 0.05
        if near:
            clusters[-1].append(index)
        else:
            clusters.append([index])
    for number, cluster in enumerate(clusters):
        names = []
        for index in cluster:
            row = points[index][0].row
            name = row.name + ("" if row.usable else f" ({row.status})")
            names.append(f"{name}  {points[index][1]:.3g} ms" if len(cluster) > 1 else name)
        first = points[cluster[0]]
        above = number % 2 == 0
        axes.annotate(
            "\n".join(names),
            (first[1], first[2]),
            textcoords="offset points",
            xytext=(4, 8 if above else -8),
            va="bottom" if above else "top",
            fontsize=8,
            annotation_clip=False,
        )
