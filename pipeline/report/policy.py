"""Which policy each variant's gate held it to, in words, from what the stage records kept.

Optimize records the budget its lossy variants were held to; every other policy is chosen again
from the stage's recorded settings by the function that chose it when the stage ran
(pipeline/verify/choose.py: hop_policy), so the report and the gate cannot disagree.
"""

from __future__ import annotations

from typing import Any

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.variants import Variant
from pipeline.verify.choose import describe_held


def describe(policy: dict[str, Any]) -> str:
    """A recorded policy (`Policy.to_dict()`) as a person reads it."""
    name = policy.get("policy")
    if name == "exact":
        atol, rtol, metric = policy.get("atol"), policy.get("rtol"), policy.get("metric")
        if "max_share" not in policy:  # recorded before the share rule: every value was held, atol absolute
            return f"exact: |diff| <= {atol:g} + {rtol:g}·|ref|, metric within {metric:g}"
        return (f"exact: |diff| <= {atol:g}·scale + {rtol:g}·|ref| but for {policy['max_share']:g} of the values "
                f"(none past {policy.get('hard', 10):g}x), metric within {metric:g}")  # fmt: skip
    if name == "metric drop":
        return f"metric drop <= {policy.get('max_drop'):g}"
    if name == "top-1 agreement":
        return f"top-1 agreement >= {policy.get('min_agreement'):g}"
    if name == "min cosine":  # recorded before the mean: the worst row alone
        return f"cosine similarity >= {policy.get('min_cosine'):g}"
    if name == "cosine":
        return f"cosine similarity: mean >= {policy.get('mean_cosine'):g}, worst row >= {policy.get('min_cosine'):g}"
    if name == "relative error":
        return f"relative error <= {policy.get('max_rel'):g}"
    if name == "box agreement":
        return (f"boxes matched (same class, IoU >= {policy.get('match_iou'):g}) >= {policy.get('min_matched'):g}, "
                f"decoded at confidence {policy.get('confidence'):g}, NMS IoU {policy.get('iou'):g}")  # fmt: skip
    if name == "tensor agreement":
        mean = f"mean >= {policy['mean_cosine']:g}, worst row " if "mean_cosine" in policy else ""
        return (f"per output: cosine {mean}>= {policy.get('min_cosine'):g} (unit-vector rows) or relative error "
                f"<= {policy.get('max_rel'):g}")  # fmt: skip
    bounds = ", ".join(f"{k} {v}" for k, v in policy.items() if k != "policy")
    return f"{name}: {bounds}" if bounds else str(name)


def held_to(variant: Variant, manifest: Manifest) -> str:
    """The policy `variant`'s gate judged it by, or why it is not known."""
    stages = manifest.stages
    record = {"export": stages.export, "import": stages.import_, "optimize": stages.optimize, "edge": stages.edge}
    hop = variant.stage
    if hop not in record or (hop != "import" and record[hop] is None):
        return "not recorded"
    against = {"export": "against torch", "import": "against the source model"}.get(hop, "against model.onnx")
    if hop == "optimize" and variant.precision != "fp32":  # lossy: optimize records the budget it held them to
        return describe(stages.optimize.policy) + f" ({against})"
    settings = record[hop].settings if record[hop] is not None else {}
    has_target = bool(variant.metrics)  # a metric is recorded only where the evaluation set has targets
    policy = describe_held(hop, variant.precision, manifest.task, has_target, settings, manifest.detection)
    lossless = " (lossless graph pass)" if hop == "optimize" else ""
    return describe(policy.to_dict()) + (lossless or f" ({against})")
