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
    batches = summary.get("batches", [1, 32])  # the batches model.onnx was timed at
    fixed = fp32["latency"].get("fixed_batch")
    lines = [
        f"# pipe optimize: {summary['model']}",
        "",
        f"- budget: {_policy(summary['policy'])}",
        *_as_detections(summary["policy"]),
        f"- evaluated on: {summary['evaluation']}",
        f"- calibrated on: {summary['calibration'] or 'no calibration (no static quantization)'}",
        f"- timed with {int(fp32['latency'].get('threads', 1))} intra-op thread(s), all models side by side in one run"
        + (f" at batch {int(fixed)}, the batch model.onnx's inputs fix" if fixed else ""),
        *_resources(summary.get("resources")),
        *[f"- note: {_cell(note)}" for note in summary.get("notes", [])],
        "",
        "| variant | status | budget figure | size | "
        + "".join(f"p50 b{b} (ms) | speedup b{b} | " for b in batches)
        + "detail |",
        "| --- | --- | --- | --- | " + "--- | --- | " * len(batches) + "--- |",
        _row("fp32 (model.onnx)", "reference", None, fp32["size"], fp32["latency"], batches, [1.0] * len(batches), ""),
    ]
    for v in summary["variants"]:
        size = f"{v['size']} ({v['size'] / fp32['size']:.2f}x)" if v["size"] else "-"
        speedups = [v.get(f"speedup_b{b}") for b in batches]
        lines.append(_row(v["variant"], v["status"], v["budget_figure"], size, v["latency"], batches, speedups,
                          v["detail"]))  # fmt: skip
    lines += _decoder_speed(fp32, summary["variants"])
    for v in summary["variants"]:
        if tail := v["details"].get("float_tail"):
            lines.append(f"\n{v['variant']}: the {len(tail)} nodes after the last Conv/MatMul/Gemm (the decode tail) "
                         "were left in fp32: one int8 scale cannot hold pixel boxes and 0..1 scores")  # fmt: skip
        if v.get("note"):
            lines += ["", f"**{v['variant']}: {_cell(v['note'])}**"]
    for v in summary["variants"]:
        search = v["details"].get("search")
        if search:
            lines += ["", f"## {v['variant']}: the auto search", "", *_plan(v["details"].get("plan")), *_search(search)]
        graph = v["details"] if v["variant"] == "opt" else None
        if graph:
            lines += ["", "## opt: graph passes", "", f"nodes {graph['nodes_before']} -> {graph['nodes_after']}"]
            for step in graph.get("steps", []):
                kept = ("kept" + (f" ({step['note']})" if step.get("note") else "")) if step["kept"] else (
                    f"not kept ({step['note']})")  # fmt: skip
                lines.append(f"- {step['name']} {step['version']} ({step['setting']}): "
                             f"{step['nodes_before']} -> {step['nodes_after']} nodes, {kept}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _decoder_speed(fp32: dict[str, Any], variants: list[dict[str, Any]]) -> list[str]:
    """A decoder's speed table: prefill and decode tokens/s beside model.onnx's (none for other models)."""
    base = fp32["latency"]
    if "decode_tokens_per_s" not in base:
        return []
    lines = [
        "",
        f"Generation speed, batch 1, a {int(base['prompt_tokens'])}-token prompt then {int(base['new_tokens'])} new "
        "tokens (pipeline/runtime/lm_speed.py):",
        "",
        "| model | time to first token (ms) | prefill tokens/s | x fp32 | decode tokens/s | x fp32 |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| fp32 (model.onnx) | {_num(base['prefill_ms'])} | {base['prefill_tokens_per_s']:,.0f} | 1.00x | "
        f"{base['decode_tokens_per_s']:,.0f} | 1.00x |",
    ]
    for v in variants:
        t = v.get("latency") or {}
        if "decode_tokens_per_s" in t:
            lines.append(f"| {v['variant']} | {_num(t['prefill_ms'])} | {t['prefill_tokens_per_s']:,.0f} | "
                         f"{_x(v.get('speedup_prefill'))} | {t['decode_tokens_per_s']:,.0f} | "
                         f"{_x(v.get('speedup_decode'))} |")  # fmt: skip
    return lines


def _resources(resources: dict[str, Any] | None) -> list[str]:
    if not resources:
        return []
    peak = resources["peak_rss_bytes"] / 2**30
    return [f"- this run: {resources['wall_seconds']:.1f} s, peak memory {peak:.2f} GiB (maximum resident set)"]


def _plan(plan: dict[str, Any] | None) -> list[str]:
    """Why these candidates: what the graph's weights are in, the families in order, what was left out."""
    if not plan:
        return []
    weights = ", ".join(f"{kind} {size / 2**20:.2f} MB" for kind, size in plan["weights"].items() if size)
    lines = [
        f"Chosen by what the graph holds: weights {weights or 'none'} ({plan['conv_share']:.0%} in Conv, "
        f"{plan['depthwise_convs']} depthwise). Families tried in this order, each until one of its candidates "
        "meets the budget, and not widened when its first is slower than fp32:",
        "",
    ]
    lines += [f"{i}. {f['name']}: {f['why']} ({'; '.join(f['candidates'])})" for i, f in enumerate(plan["families"], 1)]
    lines += [f"- {note}" for note in plan.get("notes", [])]
    return [*lines, ""]


def _search(search: dict[str, Any]) -> list[str]:
    kept = "Met the budget" if search.get("passed") else "Missed the budget"
    speed = {"faster": "faster than fp32", "not faster": "not faster than fp32"}.get(search.get("speed", ""), "")
    lines = [f"{kept}{f' and kept a model {speed}' if speed else ''}, in {_num(search.get('seconds'))} s. "
             "Candidates tried:", ""]  # fmt: skip
    batches = search.get("batches", [1, 32])
    lines += [
        "| candidate | excluded nodes | status | figure | "
        + "".join(f"p50 b{b} (ms) | fp32 b{b} (ms) | speedup b{b} | " for b in batches)
        + "speed | detail |",
        "| --- | --- | --- | --- | " + "--- | --- | --- | " * len(batches) + "--- | --- |",
    ]
    for trial in search.get("tried", []):
        verdict, latency, fp32 = trial.get("verdict", {}), trial.get("latency") or {}, trial.get("fp32_latency") or {}
        timings = "".join(
            f"{_num(latency.get(key))} | {_num(fp32.get(key))} | {_x(trial.get(f'speedup_b{b}'))} | "
            for b in batches
            if (key := f"p50_ms_b{b}")
        )
        lines.append(
            f"| {trial.get('name', '')} | {len(trial.get('excluded', []))} | "
            f"{'passed' if verdict.get('passed') else 'failed'} | {_num(verdict.get('figure'))} | {timings}"
            f"{trial.get('speed', '-')} | {_cell(verdict.get('detail', ''))} |"
        )
    lines += ["", f"Each candidate is timed beside fp32 in its own run; faster or slower means beyond "
                  f"{search.get('noise', 0.05):.0%} of fp32's speed."]  # fmt: skip
    for note in search.get("notes", []):
        lines.append(f"- {_cell(note)}")
    profile = search.get("profile")
    if profile:
        lines += ["", *_profile(profile)]
    exclusions = search.get("exclusions", [])
    if exclusions:
        lines += ["", "Nodes left in fp32, worst first:", ""]
        lines += [f"- `{e['node']}` ({e['op_type']}, score {_num(e['score'])}): {e['why']}" for e in exclusions]
    return lines


def _profile(profile: dict[str, Any]) -> list[str]:
    """onnxruntime's profile of the kept model against fp32, kind of op by kind of op."""
    fp32, quantized = profile["fp32"], profile["quantized"]
    lines = [
        f"onnxruntime's op profile at batch {profile['batch']}, {profile['threads']} thread(s): a run takes "
        f"{_num(quantized['run_ms'])} ms ({_num(quantized['nodes'])} kernels) against fp32's "
        f"{_num(fp32['run_ms'])} ms ({_num(fp32['nodes'])} kernels).",
        "",
        "| kind of op | role in the int8 model | fp32 (ms) | int8 (ms) | int8 kernels |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in profile["rows"]:
        lines.append(f"| {row['kind']} | {row['role']} | {_num(row['fp32_ms'])} | {_num(row['quantized_ms'])} | "
                     f"{', '.join(row['quantized_ops']) or '-'} |")  # fmt: skip
    return lines


def _row(
    name: str,
    status: str,
    figure: Any,
    size: Any,
    latency: dict[str, float],
    batches: list[int],
    speedups: list[Any],
    detail: str,
) -> str:
    pairs = zip(batches, speedups, strict=True)
    timings = "".join(f"{_num(latency.get(f'p50_ms_b{b}'))} | {_x(s)} | " for b, s in pairs)
    return f"| {name} | {status} | {_num(figure)} | {size} | {timings}{_cell(detail)} |"


def _as_detections(policy: dict[str, Any]) -> list[str]:
    """How a detector's variants were judged, in words (box agreement: pipeline/verify/policies.py)."""
    if policy.get("policy") != "box agreement":
        return []
    return [
        f"- judged as detections: each model's head output decoded into boxes (confidence > "
        f"{policy['confidence']:g}, per-class NMS at IoU {policy['iou']:g}, at most {policy['max_detections']} per "
        f"picture), a variant's boxes matched to model.onnx's per class at IoU >= {policy['match_iou']:g}; the pairs "
        f"over the larger box count must reach {policy['min_matched']:g}"
    ]


def _policy(policy: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in policy.items())


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _x(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
