"""reports/optimize.md: the optimize run for a person (or a CI step summary); optimize.json is the machine copy.

What was tried, each variant's status and budget figure against model.onnx, its size and speed
against model.onnx measured side by side in the same run, and, for the auto search, every
candidate it tried and every node it left in fp32 with the reason.
"""

from __future__ import annotations

from typing import Any


def markdown(summary: dict[str, Any]) -> str:
    """The Markdown report of an optimize summary (the dict written to reports/optimize.json)."""
    fp32 = summary["fp32"]
    lines = [
        f"# pipe optimize: {summary['model']}",
        "",
        f"- budget: {_policy(summary['policy'])}",
        f"- evaluated on: {summary['evaluation']}",
        f"- calibrated on: {summary['calibration'] or 'no calibration (no static quantization)'}",
        f"- timed with {int(fp32['latency'].get('threads', 1))} intra-op thread(s), all models side by side in one run",
        "",
        "| variant | status | budget figure | size | p50 b1 (ms) | speedup b1 | p50 b32 (ms) | speedup b32 | detail |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        _row("fp32 (model.onnx)", "reference", None, fp32["size"], fp32["latency"], 1.0, 1.0, ""),
    ]
    for v in summary["variants"]:
        size = f"{v['size']} ({v['size'] / fp32['size']:.2f}x)" if v["size"] else "-"
        speedups = (v["speedup_b1"], v["speedup_b32"])
        lines.append(_row(v["variant"], v["status"], v["budget_figure"], size, v["latency"], *speedups, v["detail"]))
    for v in summary["variants"]:
        search = v["details"].get("search")
        if search:
            lines += ["", f"## {v['variant']}: the auto search", "", *_search(search)]
        graph = v["details"] if v["variant"] == "opt" else None
        if graph:
            lines += ["", "## opt: graph passes", "", f"nodes {graph['nodes_before']} -> {graph['nodes_after']}"]
            for step in graph.get("steps", []):
                kept = "kept" if step["kept"] else f"not kept ({step['note']})"
                lines.append(f"- {step['name']} {step['version']} ({step['setting']}): "
                             f"{step['nodes_before']} -> {step['nodes_after']} nodes, {kept}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _search(search: dict[str, Any]) -> list[str]:
    lines = [f"{'Met' if search.get('passed') else 'Missed'} the budget. Candidates tried:", ""]
    lines += ["| candidate | excluded nodes | status | figure | detail |", "| --- | --- | --- | --- | --- |"]
    for trial in search.get("tried", []):
        verdict = trial.get("verdict", {})
        lines.append(
            f"| {trial.get('name', '')} | {len(trial.get('excluded', []))} | "
            f"{'passed' if verdict.get('passed') else 'failed'} | {_num(verdict.get('figure'))} | "
            f"{_cell(verdict.get('detail', ''))} |"
        )
    exclusions = search.get("exclusions", [])
    if exclusions:
        lines += ["", "Nodes left in fp32, worst first:", ""]
        lines += [f"- `{e['node']}` ({e['op_type']}, score {_num(e['score'])}): {e['why']}" for e in exclusions]
    return lines


def _row(
    name: str, status: str, figure: Any, size: Any, latency: dict[str, float], s1: Any, s32: Any, detail: str
) -> str:
    return (
        f"| {name} | {status} | {_num(figure)} | {size} | {_num(latency.get('p50_ms_b1'))} | {_x(s1)} | "
        f"{_num(latency.get('p50_ms_b32'))} | {_x(s32)} | {_cell(detail)} |"
    )


def _policy(policy: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in policy.items())


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _x(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
