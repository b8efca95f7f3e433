"""Which policy each variant's gate held it to, in words, from what the stage records kept.

The export and import gates are exact (export's tolerances are its recorded settings); optimize
records the budget its lossy variants were held to, and its graph-only variant is lossless; the
edge record keeps its settings, from which each precision's policy follows as the edge stage
chooses it (docs/edge.md: fp32 and fp16 element by element, int8 the task's budget).
"""

from __future__ import annotations

from typing import Any

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.variants import Variant
from pipeline.recipe.schema import EdgeSpec, ExportSpec, edge_metric_drop
from pipeline.verify.metrics import METRIC_TASKS
from pipeline.verify.policies import Exact, Policy, budget_for


def describe(policy: dict[str, Any]) -> str:
    """A recorded policy (`Policy.to_dict()`) as a person reads it."""
    name = policy.get("policy")
    if name == "exact":
        atol, rtol, metric = policy.get("atol"), policy.get("rtol"), policy.get("metric")
        return f"exact: |diff| <= {atol:g} + {rtol:g}·|ref|, metric within {metric:g}"
    if name == "metric drop":
        return f"metric drop <= {policy.get('max_drop'):g}"
    if name == "top-1 agreement":
        return f"top-1 agreement >= {policy.get('min_agreement'):g}"
    if name == "min cosine":
        return f"cosine similarity >= {policy.get('min_cosine'):g}"
    if name == "relative error":
        return f"relative error <= {policy.get('max_rel'):g}"
    if name == "box agreement":
        return (f"boxes matched (same class, IoU >= {policy.get('match_iou'):g}) >= {policy.get('min_matched'):g}, "
                f"decoded at confidence {policy.get('confidence'):g}, NMS IoU {policy.get('iou'):g}")  # fmt: skip
    if name == "tensor agreement":
        return (f"per output: cosine >= {policy.get('min_cosine'):g} (unit-vector rows) or relative error "
                f"<= {policy.get('max_rel'):g}")  # fmt: skip
    bounds = ", ".join(f"{k} {v}" for k, v in policy.items() if k != "policy")
    return f"{name}: {bounds}" if bounds else str(name)


def held_to(variant: Variant, manifest: Manifest) -> str:
    """The policy `variant`'s gate judged it by, or why it is not known."""
    stages = manifest.stages
    if variant.stage == "export" and stages.export is not None:
        s = {**ExportSpec().model_dump(), **stages.export.settings}  # a setting not recorded had its default
        return describe(Exact(s["atol"], s["rtol"], s["metric_tolerance"]).to_dict()) + " (against torch)"
    if variant.stage == "import":
        return describe(Exact().to_dict()) + " (against the source model)"
    if variant.stage == "optimize" and stages.optimize is not None:
        if variant.settings.get("graph") is not None:  # the graph-only variant: lossless
            return describe(Exact().to_dict()) + " (lossless graph pass)"
        return describe(stages.optimize.policy) + " (against model.onnx)"
    if variant.stage == "edge" and stages.edge is not None:
        return describe(_edge_policy(variant, manifest).to_dict()) + " (against model.onnx)"
    return "not recorded"


def _edge_policy(variant: Variant, manifest: Manifest) -> Policy:
    s = {**EdgeSpec().model_dump(), **(manifest.stages.edge.settings if manifest.stages.edge else {})}
    if variant.precision == "fp32":
        return Exact(atol=s["atol_fp32"], rtol=s["rtol"])
    drop = edge_metric_drop(s, manifest.task)
    if variant.precision == "fp16":
        return Exact(atol=s["atol_fp16"], rtol=s["rtol"], metric=drop or 0.0)
    has_target = bool(variant.metrics)  # a metric is recorded only where the evaluation set has targets
    metered = has_target and manifest.task in METRIC_TASKS
    return budget_for(manifest.task, has_target, drop if metered else None, manifest.detection)
