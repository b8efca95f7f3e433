"""The checks `pipe check` runs, each a named result: what was compared, the figures, one line of detail.

Every check is a plain function of the candidate's summary, the baseline and the budgets; none
stops the others, so one run lists every regression at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.artifact.directions import HIGHER_IS_BETTER, metric_drop
from pipeline.artifact.tensors import TensorSpec
from pipeline.check.baseline import Baseline
from pipeline.recipe.budgets import BudgetSpec
from pipeline.verify.metrics import SLACK

Status = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class CheckResult:
    name: str  # e.g. metric.accuracy, variant.int8, signature.inputs, size, latency
    status: Status
    detail: str  # one line: what held or what broke, with the numbers
    figures: dict[str, Any] = field(default_factory=dict)  # baseline, candidate, ratio or drop, budget

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _result(name: str, ok: bool, detail: str, **figures: Any) -> CheckResult:
    return CheckResult(name, "passed" if ok else "failed", detail, figures)


def judge_metric(name: str, before: float, after: float, budgets: BudgetSpec) -> tuple[bool, str, dict[str, Any]]:
    """One metric's drop against every budget it has: (held, one line naming each budget and the numbers, figures).

    The drop is `metric_drop` (for MAE a rise is a drop); the relative drop is drop / |baseline|.
    """
    budget = budgets.for_metric(name)
    drop = metric_drop(name, before, after)
    relative = drop / abs(before) if before else (math.inf if drop > 0 else 0.0)
    parts, broken = [], []
    own = name in budgets.metrics
    if budget.max_drop is not None:
        key = "max_drop" if own else "max_accuracy_drop"
        held = drop <= budget.max_drop + SLACK
        parts.append(f"drop {drop:+.4g} {'within' if held else 'breaks'} {key} {budget.max_drop:g}")
        broken += [] if held else [key]
    if budget.max_relative_drop is not None:
        held = relative <= budget.max_relative_drop + SLACK
        shown = f"{relative:+.2%}" if math.isfinite(relative) else "unbounded (the baseline is 0)"
        units = "the objective's scale" if name in ("loss", "perplexity") else "target units"
        key = "max_relative_drop" if own else f"the default relative budget for {name} ({units})"
        parts.append(f"relative drop {shown} {'within' if held else 'breaks'} {key} "
                     f"{budget.max_relative_drop:.4g} ({budget.max_relative_drop:.2%})")  # fmt: skip
        broken += [] if held else ["max_relative_drop"]
    figures = {
        "baseline": before, "candidate": after, "drop": drop,
        "relative_drop": relative if math.isfinite(relative) else None,
        "budget": budget.max_drop, "relative_budget": budget.max_relative_drop, "broken": broken,
    }  # fmt: skip
    return not broken, f"{name} {before:.4g} -> {after:.4g}: " + "; ".join(parts), figures


def check_metrics(candidate: Baseline, baseline: Baseline, budgets: BudgetSpec) -> list[CheckResult]:
    """Each metric the baseline records, its drop in the candidate within that metric's budgets."""
    if not baseline.metrics:
        return [CheckResult("metrics", "skipped", "the baseline records no task metrics (import it with --eval-data)")]
    results = []
    for name, before in sorted(baseline.metrics.items()):
        check = f"metric.{name}"
        if name not in HIGHER_IS_BETTER:
            results.append(CheckResult(check, "skipped", f"{name}: no known direction to judge a drop"))
        elif name not in candidate.metrics:
            results.append(_result(check, False, f"{name} is {before:.4g} in the baseline; the candidate has none"))
        else:
            held, detail, figures = judge_metric(name, before, candidate.metrics[name], budgets)
            results.append(CheckResult(check, "passed" if held else "failed", detail, figures))
    return results


def check_variants(candidate: Baseline, baseline: Baseline, budgets: BudgetSpec) -> list[CheckResult]:
    """A variant that passed in the baseline must pass now, its metrics within the same per-metric budgets.

    One cause is reported once: where the model's own metric dropped past its budget (`metric.<name>`
    fails), a variant that only follows it, losing no more against its own model.onnx than it did in
    the baseline, passes with a line saying so, instead of repeating the model's drop on every variant.
    """
    results = []
    model_failed = {
        m for m, v in baseline.metrics.items()
        if m in HIGHER_IS_BETTER and m in candidate.metrics and not judge_metric(m, v, candidate.metrics[m], budgets)[0]
    }  # fmt: skip
    for name, before in sorted(baseline.variants.items()):
        check, now = f"variant.{name}", candidate.variants.get(name)
        if before.status != "passed":
            status = now.status if now else "missing"
            results.append(CheckResult(check, "skipped", f"{before.status} in the baseline; {status} now", {}))
            continue
        if now is None or now.status != "passed":
            results.append(_result(check, False, f"passed in the baseline, {now.status if now else 'missing'} now"))
            continue
        judged = {
            m: _follows(m, v, now.metrics[m], baseline, candidate, budgets)
            if m in model_failed and not judge_metric(m, v, now.metrics[m], budgets)[0]
            else judge_metric(m, v, now.metrics[m], budgets)
            for m, v in sorted(before.metrics.items())
            if m in now.metrics and m in HIGHER_IS_BETTER
        }
        # a metric the baseline's variant was judged by and the candidate's lacks cannot be shown to hold
        lost = [
            f"{m} is {v:.4g} in the baseline; the candidate's variant has none"
            for m, v in sorted(before.metrics.items())
            if m in HIGHER_IS_BETTER and m not in now.metrics
        ]
        held = not lost and all(ok for ok, _, _ in judged.values())
        shown = "; ".join([*lost, *(text for _, text, _ in judged.values())]) or "no shared metric"
        figures = {m: fig for m, (_, _, fig) in judged.items()}
        results.append(_result(check, held, f"gate passed in both; {shown}", metrics=figures))
    return results


def _follows(
    name: str, before: float, after: float, baseline: Baseline, candidate: Baseline, budgets: BudgetSpec
) -> tuple[bool, str, dict[str, Any]]:
    """A variant's metric drop where the model's own metric dropped too: held when the variant's own cost
    against its model.onnx grew by no more than the metric's budget (the model's drop is metric.<name>'s)."""
    own_before = metric_drop(name, baseline.metrics[name], before)  # the variant's cost against its model.onnx
    own_after = metric_drop(name, candidate.metrics[name], after)
    budget = budgets.for_metric(name)
    allowed = min(b for b in (budget.max_drop, _scaled(budget.max_relative_drop, before)) if b is not None)
    held = own_after - own_before <= allowed + SLACK
    detail = (
        f"{name} {before:.4g} -> {after:.4g} follows the model's own drop (reported once, by metric.{name}); "
        f"against its model.onnx it loses {own_after:+.4g} ({own_before:+.4g} in the baseline"
        f"{'' if held else f', more than the {allowed:.4g} allowed'})"
    )
    figures = {"baseline": before, "candidate": after, "own_drop_baseline": own_before, "own_drop": own_after,
               "budget": allowed, "follows": f"metric.{name}"}  # fmt: skip
    return held, detail, figures


def _scaled(relative: float | None, value: float) -> float | None:
    return None if relative is None else relative * abs(value)


def check_signature(candidate: Baseline, baseline: Baseline) -> list[CheckResult]:
    """Breaking changes of inputs, outputs and labels: what a client of the baseline would trip over."""
    results = []
    for kind, old, new in (
        ("inputs", baseline.inputs, candidate.inputs),
        ("outputs", baseline.outputs, candidate.outputs),
    ):
        problems = _breaks(kind[:-1], old, new)
        if kind == "inputs":  # a client of the baseline does not send an input it never had
            known = {s.name for s in old}
            problems += [f"input {s.name!r} is new and required" for s in new if s.name not in known]
        shown = ", ".join(f"{s.name} {s.dtype}{s.shape}" for s in new)
        results.append(_result(f"signature.{kind}", not problems, "; ".join(problems) or f"compatible: {shown}"))
    if baseline.labels == candidate.labels:
        results.append(_result("signature.labels", True, f"{len(baseline.labels)} labels, unchanged"))
    else:
        gone = [x for x in baseline.labels if x not in candidate.labels]
        added = [x for x in candidate.labels if x not in baseline.labels]
        what = f"removed {gone[:5]}, added {added[:5]}" if gone or added else "same labels in another order"
        results.append(_result("signature.labels", False, f"label set changed: {what}"))
    return results


def _breaks(kind: str, old: list[TensorSpec], new: list[TensorSpec]) -> list[str]:
    by_name = {s.name: s for s in new}
    names = [s.name for s in new]
    problems = []
    for spec in old:
        now = by_name.get(spec.name)
        if now is None:
            problems.append(f"{kind} {spec.name!r} was renamed or removed (the candidate has {names})")
            continue
        if now.dtype != spec.dtype:
            problems.append(f"{kind} {spec.name!r} dtype changed {spec.dtype} -> {now.dtype}")
        if len(now.shape) != len(spec.shape):
            problems.append(f"{kind} {spec.name!r} rank changed {len(spec.shape)} -> {len(now.shape)}")
            continue
        for axis, (a, b) in enumerate(zip(spec.shape, now.shape, strict=True)):
            if isinstance(a, str) and isinstance(b, int):
                problems.append(f"{kind} {spec.name!r} axis {axis} was dynamic ({a!r}) and is fixed at {b}")
            elif isinstance(a, int) and isinstance(b, int) and a != b:
                problems.append(f"{kind} {spec.name!r} axis {axis} changed size {a} -> {b}")
    return problems


def check_size(candidate: Baseline, baseline: Baseline, budgets: BudgetSpec) -> CheckResult:
    """model.onnx's size ratio within 1 + max_size_increase."""
    if not candidate.model_size or not baseline.model_size:
        return CheckResult("size", "skipped", "model.onnx's size is not recorded in both")
    ratio, limit = candidate.model_size / baseline.model_size, 1 + budgets.max_size_increase
    return _result(
        "size",
        ratio <= limit + SLACK,
        f"model.onnx {baseline.model_size} -> {candidate.model_size} bytes: x{ratio:.3f} (budget x{limit:.3f})",
        baseline=baseline.model_size, candidate=candidate.model_size, ratio=ratio, budget=limit,
    )  # fmt: skip
