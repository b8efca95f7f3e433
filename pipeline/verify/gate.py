"""The gate: prove a candidate computes what its reference computes, or fail with every reason.

Checks, all run before anything is decided (one table, then CheckFailed, exit 1):

- for an ONNX candidate, `onnx.checker` and strict shape inference;
- the candidate against the reference at batch 1, 2 and a larger N (a batch axis silently fixed
  at export shows up as a refusal or a wrong shape at one of them), and at a second length of
  every other symbolic axis (token models: a shorter sequence);
- per output, under the hop's policy (policies.py): Exact's rule for lossless hops (values within
  tolerance of the output's scale, but for a documented few) on every case; NaN/Inf on either
  side fails whatever the policy;
- the outputs recorded earlier for the golden samples (golden.npz), under the same policy;
- over the whole evaluation split: the task metric, within Exact's tolerance or a MetricDrop
  budget, and a budgeted policy's own statistic (agreement, cosine, relative error).

A lossy hop's budget is a statistic over many samples, so it is judged on the largest sample the
gate has: the evaluation split, else the golden samples, else the batch cases. On the smaller ones
its figure is shown but does not decide: one of 40 positions differing on batch 1 (agreement 0.975)
says nothing against 0.9988 over the split. Shapes and NaN/Inf fail on every case.

A failure is a row, never a warning and never an exception: the caller decides with
`report.raise_on_failure`. The reference and the candidate are runners (runners.py), so this
module needs neither torch nor a particular exporter.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError, first_line
from pipeline.runtime.runners import Candidate, Runner, onnx_candidate, run_chunked
from pipeline.verify.metrics import task_metric
from pipeline.verify.policies import Exact, Policy
from pipeline.verify.report import GateReport, Row

if TYPE_CHECKING:
    import onnxruntime as ort

    from pipeline.artifact.manifest import ModelSpec
    from pipeline.artifact.tensors import TensorSpec
    from pipeline.samples.evaluation import EvaluationSet

LARGE_BATCH = 16  # the "larger N": big enough to catch an axis fixed at 1 or 2, cheap enough for CI
# where a policy decides (`_budget_scope`): an element-wise (lossless) one on every case, a budget on the largest sample
EVERY_CASE, SPLIT, GOLDEN, BATCHES = "every case", "the evaluation split", "the golden samples", "the batch cases"


def verify(
    candidate: str | Path | Candidate,
    reference: Runner,
    evaluation: EvaluationSet,
    spec: ModelSpec,
    policy: Policy | None = None,
    *,
    scratch: Path | None = None,
    session: ort.InferenceSession | None = None,
) -> GateReport:
    """Run every check on `candidate` against `reference`; never raises on a mismatch.

    `candidate`: an ONNX file (run on CPU onnxruntime, or by `session` when the caller already
    holds one, so a large model is not loaded twice) or any `Candidate`. `evaluation`: its
    `samples` are real inputs (golden), its `recorded` the outputs stored earlier for all of them,
    which the candidate must reproduce too, and its split (inputs, target or None) what the metric
    and the budget are measured on. `spec`: the model's inputs, outputs and task (`manifest.spec`).
    `policy`: Exact() when None. Call `raise_on_failure` on the result for exit 1.
    """
    samples, recorded, split = evaluation.samples, evaluation.recorded, evaluation.split
    inputs, outputs, task = spec.inputs, spec.outputs, spec.task
    policy = policy if policy is not None else Exact()
    scope = _budget_scope(policy, split is not None, recorded is not None)
    report = GateReport()
    path = candidate.onnx_path if isinstance(candidate, Candidate) else Path(candidate)
    if path is not None:
        report.rows += structural_checks(path, scratch)
    if not isinstance(candidate, Candidate):
        try:
            candidate = onnx_candidate(path, session)
        except ArtifactError as exc:  # a file onnxruntime cannot load: a failed row, the rest cannot run
            report.rows.append(Row("onnxruntime load", "-", False, str(exc)))
            return report
    for label, batch in cases(samples, inputs):
        try:
            want = reference(batch)
        except Exception as exc:  # the reference itself cannot run this case: a finding, not a crash
            report.rows.append(Row(label, "-", False, f"the reference failed: {first_line(exc)}"))
            continue
        try:
            got = candidate.run(batch)
        except Exception as exc:  # a fixed axis makes the runtime refuse the batch: that is the finding
            report.rows.append(Row(label, "-", False, f"{candidate.runtime} refused the input: {first_line(exc)}"))
            continue
        judge = scope in (EVERY_CASE, BATCHES)
        report.rows += compare(label, got, want, outputs, policy, candidate.name, judge=judge, scope=scope)
    if recorded is not None:
        label = "golden (recorded)"
        try:
            got = run_chunked(candidate.run, samples)
            judge = scope in (EVERY_CASE, GOLDEN)
            report.rows += compare(label, got, recorded, outputs, policy, candidate.name, judge=judge, scope=scope)
        except Exception as exc:  # as above
            report.rows.append(Row(label, "-", False, f"{candidate.runtime} refused the input: {first_line(exc)}"))
    if split is not None:
        report.rows += _split_rows(report, candidate, reference, split, outputs, policy, task)
    elif policy.needs_metric:
        why = f"the {policy.name} policy judges the task metric, but no evaluation split was given"
        report.rows.append(Row("metric", outputs[0].name, False, f"{why}; give the split with its targets"))
    return report


def _budget_scope(policy: Policy, has_split: bool, has_recorded: bool) -> str:
    """Where the policy decides: every case for an element-wise policy, else the largest sample (module doc)."""
    if not policy.over_split:
        return EVERY_CASE
    if has_split:
        return SPLIT
    return GOLDEN if has_recorded else BATCHES


def structural_checks(path: Path, scratch: Path | None = None) -> list[Row]:
    """onnx.checker and strict shape inference, each as a row (never raising)."""
    import onnx
    import onnx.shape_inference

    rows = []
    try:
        onnx.checker.check_model(str(path))
        rows.append(Row("checker", "-", True))
    except (onnx.checker.ValidationError, ValueError, OSError) as exc:
        rows.append(Row("checker", "-", False, first_line(exc)))
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        try:
            onnx.shape_inference.infer_shapes_path(str(path), str(Path(tmp) / "inferred.onnx"), strict_mode=True)
            rows.append(Row("shape inference", "-", True))
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError, OSError) as exc:
            rows.append(Row("shape inference", "-", False, first_line(exc)))
    return rows


def cases(samples: Arrays, inputs: list[TensorSpec], large: int = LARGE_BATCH) -> Iterator[tuple[str, Arrays]]:
    """The inputs the gate runs: batch 1, 2 and N, then each other symbolic axis at a second length.

    Symbolic dims are those the specs name; a model declaring a fixed batch runs once, as given. The
    samples lead with their sample axis whatever the model's batch axis (`spec.sample_axis`: the
    runner moves them there), so a model axis is found in a sample array one place on when it
    precedes the batch axis.
    """
    count = len(next(iter(samples.values())))
    if any(not spec.shape or isinstance(spec.shape[spec.sample_axis], int) for spec in inputs):
        # A declared fixed batch: other sizes are not valid inputs, so the samples run as they are.
        yield f"fixed batch {count}", samples
        return
    for batch in (1, 2, max(large, 3)):
        # Fewer samples than the batch: repeat them; the point is the batch axis, not new data.
        index = np.arange(batch) % count
        yield f"batch {batch}", {k: v[index] for k, v in samples.items()}
    batch_dims = {spec.shape[spec.sample_axis] for spec in inputs}
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if axis == spec.sample_axis or not isinstance(dim, str) or dim in batch_dims:  # a batch on another axis
                continue  # the batch cases above vary it
            length = samples[spec.name].shape[_sample_view(spec, axis)]
            shorter = max(1, length // 2)
            if shorter == length:
                continue
            batch = {k: v[np.arange(2) % count] for k, v in samples.items()}
            # Cut every input that shares this dim name, so related inputs stay consistent.
            for other in inputs:
                for ax, d in enumerate(other.shape):
                    if d == dim:
                        view = _sample_view(other, ax)
                        batch[other.name] = np.take(batch[other.name], np.arange(shorter), axis=view)
            yield f"batch 2, {dim} {shorter}", batch


def _sample_view(spec: TensorSpec, axis: int) -> int:
    """Where the model's `axis` of `spec` is in a sample-leading array: one on when it precedes the batch."""
    return axis + 1 if axis < spec.sample_axis else axis


def compare(
    label: str,
    got: Arrays,
    want: Arrays,
    outputs: list[TensorSpec],
    policy: Policy,
    name: str = "candidate",
    *,
    judge: bool = True,
    scope: str = EVERY_CASE,
) -> list[Row]:
    """Per-output rows: presence, shape, NaN/Inf on either side, then the policy's judgement.

    `judge` False: the policy's figure is shown but does not decide (a budget judged on `scope`, a larger
    sample); presence, shape and NaN/Inf still fail the row."""
    rows = []
    for spec in outputs:
        if spec.name not in got:
            detail = f"{name} model has no output {spec.name!r} (it has {sorted(got)})"
            rows.append(Row(label, spec.name, False, detail))
            continue
        if spec.name not in want:  # e.g. golden.npz recorded under other output names
            rows.append(
                Row(label, spec.name, False, f"the reference has no output {spec.name!r} (it has {sorted(want)})")
            )
            continue
        a, b = np.asarray(got[spec.name]), np.asarray(want[spec.name])
        if a.shape != b.shape:
            rows.append(Row(label, spec.name, False, f"shape {list(a.shape)} but the reference gives {list(b.shape)}"))
            continue
        if not np.issubdtype(b.dtype, np.number) or b.dtype == np.bool_:
            same = bool(np.array_equal(a, b))
            rows.append(Row(label, spec.name, same, "" if same else "values differ"))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        bad = _non_finite(((name, a64), ("reference", b64)))
        judged = policy.compare(a64, b64)
        shown = judged.detail
        if shown and not judge:
            shown = f"{shown} (shown: the budget is judged on {scope})"
        detail = "; ".join([*bad, shown] if shown else bad)
        passed = (judged.passed or not judge) and not bad
        rows.append(Row(label, spec.name, passed, detail, judged.max_abs, judged.max_rel, judged.share, judged.worst))
    return rows


def _non_finite(sides: tuple[tuple[str, np.ndarray], ...]) -> list[str]:
    return [f"{side} has {int((~np.isfinite(x)).sum())} NaN/Inf" for side, x in sides if not np.isfinite(x).all()]


def _split_rows(
    report: GateReport,
    candidate: Candidate,
    reference: Runner,
    evaluation: tuple[Arrays, np.ndarray | None],
    outputs: list[TensorSpec],
    policy: Policy,
    task: str,
) -> list[Row]:
    """The whole evaluation split: the policy's statistic (budgets) and the task metric."""
    data, target = evaluation
    output = outputs[0].name  # the task output: logits, predictions or the embedding
    if not len(next(iter(data.values()))):
        return [Row("evaluation split", output, False, "the evaluation split has no samples: nothing measured")]
    names = [s.name for s in outputs] if policy.over_split else [output]
    try:
        got = run_chunked(candidate.run, data, names)
    except Exception as exc:  # same as above: a refusal is a failed row
        return [Row("metric", output, False, f"{candidate.runtime} refused the evaluation split: {first_line(exc)}")]
    samples = len(next(iter(data.values())))
    if output in got and len(got[output]) != samples:  # e.g. a converter that folded free dims into the batch
        return [Row("metric", output, False, f"{candidate.runtime} gave {output!r} {list(got[output].shape)} for "
                    f"{samples} samples of the evaluation split: one row per sample expected")]  # fmt: skip
    measured = task_metric(task, got[output], target) if target is not None else None
    if measured is None and not policy.over_split:
        why = f"no task metric for {task!r}" if target is not None else "no targets in the evaluation split"
        if policy.needs_metric:
            return [Row("metric", output, False, f"{why}, and the {policy.name} policy judges the task metric")]
        return [Row("metric", output, True, why)]
    label = f"metric {measured[0]}" if measured else "evaluation split"
    try:
        want = run_chunked(reference, data, names)
    except Exception as exc:  # the reference cannot run the split: a finding, as in `verify`
        return [Row(label, output, False, f"the reference failed on the evaluation split: {first_line(exc)}")]
    rows = compare("evaluation split", got, want, outputs, policy, candidate.name) if policy.over_split else []
    if measured is None and output in got and (own := policy.split_metric(got[output], want[output])):
        rows += _own_metric(report, candidate.name, output, own, len(next(iter(data.values()))), policy)
    if measured is not None:
        split = (want[output], got[output], target)
        rows.append(_metric_row(report, candidate.name, output, measured, split, policy, task))
    return rows


def _own_metric(
    report: GateReport, name: str, output: str, own: tuple[str, float], samples: int, policy: Policy
) -> list[Row]:
    """The policy's figure over the split, the candidate's metric where the task has none (box agreement:
    the reference agrees with itself, 1.0); a failed row when the split left it unmeasured."""
    metric, value = own
    if value != value:  # NaN: the split gave the policy nothing to measure
        why = f"nothing to measure {metric} on over the {samples} samples of the evaluation split"
        return [Row(f"metric {metric}", output, False, f"{why} (the {policy.name} budget is unmeasured); "
                    "give real inputs with --eval-data")]  # fmt: skip
    report.metric = {"name": metric, "reference": 1.0, name.lower(): value, "difference": 1.0 - value}
    report.metric["samples"] = samples
    return []


def _metric_row(
    report: GateReport,
    name: str,
    output: str,
    measured: tuple[str, float],
    split: tuple[np.ndarray, np.ndarray, np.ndarray],
    policy: Policy,
    task: str,
) -> Row:
    """The task metric on both sides, judged by the policy; NaN/Inf in either output fails it.

    `split`: the reference's and the candidate's task output over the split, and the target.
    """
    metric, value = measured
    want, got, target = split
    _, ref_value = task_metric(task, want, target) or (metric, float("nan"))
    difference = abs(value - ref_value)
    key = name.lower()  # "onnx": the candidate's own figure, under its name
    report.metric = {"name": metric, "reference": ref_value, key: value, "difference": difference}
    report.metric["samples"] = len(target)
    bad = _non_finite(((f"{name} output", got.astype(np.float64)), ("reference output", want.astype(np.float64))))
    judged = policy.judge_metric(metric, ref_value, value)
    parts = [f"reference {ref_value:.4f}, {key} {value:.4f} on {len(target)} samples", *bad]
    if judged.detail:
        parts.append(judged.detail)
    return Row(f"metric {metric}", output, judged.passed and not bad, "; ".join(parts))
