"""The benchmark as a rich table on the terminal: one row per format, the figures side by side."""

from __future__ import annotations

import io
import shutil
from typing import TYPE_CHECKING

from pipeline.benchmark.outcome import BATCH, MAX_RUNS, THROUGHPUT_BATCH, BenchmarkOutcome, Result

if TYPE_CHECKING:
    from rich.table import Table

STATUS_STYLE = {"reference": "cyan", "passed": "green", "failed": "red", "stale": "yellow"}


def render(outcome: BenchmarkOutcome, width: int | None = None) -> str:
    """The table as text with ANSI colours (click.echo drops them when stdout is not a terminal)."""
    from rich.markup import escape
    from rich.table import Table

    threads = outcome.settings["threads"]
    if "new_tokens" in outcome.settings:
        return _render_decoder(outcome, width)
    table = Table(
        title=f"{outcome.name} v{outcome.version}: every format side by side "
        f"({threads} thread{'s' if threads != 1 else ''}, {outcome.settings['seconds']:g} s or {MAX_RUNS} runs "
        "per row and batch, whichever ends first)",
        title_justify="left",
    )
    table.add_column("row")
    table.add_column("runtime")
    table.add_column("precision")
    table.add_column("status")
    table.add_column("size", justify="right")
    metric = outcome.metric or "metric"
    table.add_column(metric, justify="right")
    table.add_column("drop", justify="right")
    table.add_column(f"p50 ms b{BATCH}", justify="right")
    table.add_column(f"p95 ms b{BATCH}", justify="right")
    table.add_column(f"samples/s b{THROUGHPUT_BATCH}", justify="right")
    table.add_column("note")
    for result in outcome.results:
        row = result.row
        status = f"[{STATUS_STYLE.get(row.status, 'white')}]{row.status}[/]"
        table.add_row(  # names and reasons are text, not markup: "[batch, 64]" in an error is a shape
            escape(row.name),
            row.runtime,
            row.precision,
            status,
            kib(row.size),
            _number(row.metric),
            _signed(result.drop),
            *_timings(result, BATCH, THROUGHPUT_BATCH),
            escape(_note(result)),
        )
    return _printed(table, width)


def _render_decoder(outcome: BenchmarkOutcome, width: int | None) -> str:
    """A decoder's table: time to first token, prefill and decode tokens/s, each beside model.onnx's."""
    from rich.markup import escape
    from rich.table import Table

    settings = outcome.settings
    threads = settings["threads"]
    table = Table(
        title=f"{outcome.name} v{outcome.version}: generation speed side by side ({threads} "
        f"thread{'s' if threads != 1 else ''}; batch 1, a {settings['prompt_tokens']}-token prompt, "
        f"{settings['new_tokens']} new tokens; {settings['seconds']:g} s of generations per row)",
        title_justify="left",
    )
    for name in ("row", "runtime", "precision", "status"):
        table.add_column(name)
    for name in ("size", "first token ms", "prefill tok/s", "decode tok/s", "prefill x fp32", "decode x fp32"):
        table.add_column(name, justify="right")
    table.add_column("note")
    for result in outcome.results:
        row, speed = result.row, result.speed or {}
        status = f"[{STATUS_STYLE.get(row.status, 'white')}]{row.status}[/]"
        figures = [
            f"{speed['ttft_ms']:.2f}" if speed else "-",
            f"{speed['prefill_tokens_per_s']:,.0f}" if speed else "-",
            f"{speed['decode_tokens_per_s']:,.1f}" if speed else "-",
            *(f"{speed[k]:.2f}x" if speed.get(k) is not None else "-" for k in ("prefill_x_fp32", "decode_x_fp32")),
        ]
        table.add_row(escape(row.name), row.runtime, row.precision, status, kib(row.size), *figures,
                      escape(_note(result)))  # fmt: skip
    return _printed(table, width)


def _printed(table: Table, width: int | None) -> str:
    """The table as the terminal shows it: its width, at least 120 columns."""
    from rich.console import Console

    columns = width or shutil.get_terminal_size(fallback=(200, 24)).columns
    buffer = io.StringIO()
    console = Console(file=buffer, width=max(columns, 120), force_terminal=True, color_system="standard")
    console.print(table)
    return buffer.getvalue().rstrip("\n")


def kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.4f}"


def _timings(result: Result, batch: int, throughput_batch: int) -> tuple[str, str, str]:
    latency, throughput = result.at(batch), result.at(throughput_batch)
    p50 = p95 = rate = "-"
    if latency is not None:
        ran, timing = latency
        tag = "" if ran == batch else f" (b{ran})"
        p50, p95 = f"{timing.p50_ms:.3f}{tag}", f"{timing.p95_ms:.3f}{tag}"
    if throughput is not None:
        ran, timing = throughput
        rate = f"{timing.throughput:,.0f}" + ("" if ran == throughput_batch else f" (b{ran})")
    return p50, p95, rate


def _note(result: Result) -> str:
    """Why a row is not timed, not usable, or timed at its fixed batch only."""
    notes = []
    if result.not_timed:
        notes.append(f"not timed: {result.not_timed}")
    if result.row.reason:
        notes.append(result.row.reason)
    if result.latency is not None and result.latency.fixed_batch is not None:
        notes.append(f"fixed batch {result.latency.fixed_batch}: timed at that batch only")
    return "; ".join(notes)
