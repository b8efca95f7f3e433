"""How `pipe optimize` judges a variant: the verifier's gate against model.onnx, plus the budget's figure.

The gate (pipeline/verify) runs every check and holds the variant to a policy: `Exact` for a
graph-only optimization (lossless), a budget for quantization (lossy): the task metric's drop
when the evaluation split has targets, top-1 agreement for classifiers without, cosine similarity
for embeddings (the rows' mean and the worst row), relative error for regression, box agreement
for detectors, text agreement for recognizers, cosine or relative error by output for tensor
models. The budget's own figure and how far inside or outside the budget it lies (the margin) are
computed here over the whole evaluation split, so the auto search can rank candidates that all miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.array_utils import byte_bounds

from pipeline.artifact.directions import metric_drop
from pipeline.artifact.directory import Artifact
from pipeline.core.arrays import Arrays
from pipeline.core.errors import ArtifactError
from pipeline.optimize.graph import loads_in_onnxruntime
from pipeline.runtime.runners import Candidate, Runner, ort_runner, run_chunked
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.budgets import (
    BoxAgreement,
    CosineAgreement,
    MetricDrop,
    RelativeError,
    TensorAgreement,
    TextAgreement,
    Top1Agreement,
)
from pipeline.verify.gate import structural_checks, verify
from pipeline.verify.metrics import SLACK, task_metric
from pipeline.verify.policies import Exact, Policy
from pipeline.verify.report import GateReport, Row


@dataclass
class Verdict:
    """One variant judged: the gate's table, and the budget's figure over the whole split."""

    passed: bool
    figure: float  # the budget's statistic: metric drop, agreement, mean cosine, relative error (NaN: none)
    margin: float  # how far inside (+) or outside (-) the budget, in the figure's units
    detail: str  # one line: the figure against its bound, or the first failed check
    report: GateReport


class Judge:
    """Judges variant files of one artifact against its model.onnx (made once, used for every candidate).

    The evaluation split is the costly part (a few hundred 224x224 pictures through a conv net):
    model.onnx runs it once for all candidates, and each candidate once for all of its checks
    (the gate's metric, its recorded golden outputs when golden.npz is the split, the budget's figure).
    """

    def __init__(
        self,
        artifact: Artifact,
        reference: Path,
        evaluation: EvaluationSet,
        policy: Policy,
        lossless: Policy | None = None,
    ) -> None:
        self.artifact = artifact
        self.evaluation = evaluation
        self.policy = policy  # what lossy candidates are held to
        self.lossless = lossless or Exact()  # what a graph-only (fp32) candidate is held to
        self.reference: Runner = SplitMemo(ort_runner(reference), evaluation.data)
        first = artifact.manifest.outputs[0].name
        self._output = first
        self._want = run_chunked(self.reference, evaluation.data, [first])[first]  # the parent's split outputs

    def __call__(self, candidate: Path, policy: Policy | None = None, scratch: Path | None = None) -> Verdict:
        policy = policy or self.policy
        m = self.artifact.manifest
        e = self.evaluation
        try:
            runner = SplitMemo(ort_runner(candidate), e.data)
        except ArtifactError as exc:  # a file onnxruntime cannot load: the gate's table says so, nothing runs
            why = loads_in_onnxruntime(candidate) or str(exc)  # its node names whole (the session's line is cut)
            report = GateReport([*structural_checks(candidate, scratch), Row("onnxruntime load", "-", False, why)])
            return Verdict(False, float("nan"), float("-inf"), _first_failure(report), report)
        subject = Candidate(runner, "ONNX", "onnxruntime", candidate)
        report = verify(subject, self.reference, e, m.spec, policy, scratch=scratch)
        got = run_chunked(runner, e.data, [self._output])[self._output]
        figure, margin, detail = self._figure(policy, got)
        passed = report.passed and margin >= -SLACK
        if not report.passed:
            detail = failure_detail(report, detail, len(got))
        return Verdict(passed, figure, margin, detail, report)

    def _figure(self, policy: Policy, got: np.ndarray) -> tuple[float, float, str]:
        got64, want64 = got.astype(np.float64), self._want.astype(np.float64)
        if not (np.isfinite(got64).all()):
            return float("nan"), float("-inf"), f"{int((~np.isfinite(got64)).sum())} NaN/Inf outputs on the split"
        target = self.evaluation.target
        if isinstance(policy, BoxAgreement | TensorAgreement | TextAgreement | CosineAgreement):
            return policy.statistic(got64, want64)
        if isinstance(policy, MetricDrop) and target is not None:
            measured_ref = task_metric(self.artifact.manifest.task, want64, target)
            measured = task_metric(self.artifact.manifest.task, got64, target)
            if measured_ref and measured:
                name, ref_value = measured_ref
                drop = metric_drop(name, ref_value, measured[1])
                detail = f"{name} {measured[1]:.4f} vs {ref_value:.4f} (drop {drop:.4g}, budget <= {policy.max_drop:g})"
                return drop, policy.max_drop - drop, detail
        if isinstance(policy, Top1Agreement):
            agreement = float((got64.argmax(-1) == want64.argmax(-1)).mean())
            detail = f"top-1 agreement {agreement:.4f} (budget >= {policy.min_agreement:g})"
            return agreement, agreement - policy.min_agreement, detail
        if isinstance(policy, RelativeError):
            scale = float(np.linalg.norm(want64)) or 1.0
            rel = float(np.linalg.norm(got64 - want64)) / scale
            return rel, policy.max_rel - rel, f"relative error {rel:.4g} (budget <= {policy.max_rel:g})"
        worst = float(np.abs(got64 - want64).max()) if got64.size else 0.0
        if isinstance(policy, Exact):
            bound = policy.atol + policy.rtol * float(np.abs(want64).max(initial=0.0))
            return worst, bound - worst, f"max abs difference {worst:.3g} on the split"
        return worst, 0.0, f"max abs difference {worst:.3g} on the split"


def failure_detail(report: GateReport, figure: str, samples: int) -> str:
    """The gate's first failure, then the budget's figure over the split, each saying where it was measured.

    A batch of one sample can break a budget the split keeps (relative error 0.027 on it, 0.0057 over 120
    samples): two bare figures against one bound read as a contradiction, so each names its samples.
    """
    return f"failed on {_first_failure(report)}; over the evaluation split ({samples} samples): {figure}"


def _first_failure(report: GateReport) -> str:
    failed = report.failures
    if not failed:
        return "passed"
    row = failed[0]
    more = f" (and {len(failed) - 1} more failed checks)" if len(failed) > 1 else ""
    return f"{row.check} {row.output}: {row.detail}{more}".strip()


class SplitMemo:
    """A runner that runs each slice of the evaluation split once and remembers the outputs.

    Only calls whose every input is a view into `data` (run_chunked's slices of the split, or the
    split itself) are remembered, keyed by where the view starts and its shape: the split is never
    written, and the caller holds it alive, so equal keys mean equal inputs. Any other input (the
    gate's batch 1/2/16 cases) runs as it comes.
    """

    def __init__(self, run: Runner, data: Arrays) -> None:
        self.run, self.data = run, data
        self.seen: dict[tuple[object, ...], Arrays] = {}

    def __call__(self, inputs: Arrays, /) -> Arrays:
        key = self._key(inputs)
        if key is None:
            return self.run(inputs)
        if key not in self.seen:
            self.seen[key] = self.run(inputs)
        return self.seen[key]

    def _key(self, inputs: Arrays) -> tuple[object, ...] | None:
        if set(inputs) != set(self.data):
            return None
        key = []
        for name in sorted(inputs):
            array, whole = np.asarray(inputs[name]), np.asarray(self.data[name])
            low, high = byte_bounds(array)
            whole_low, whole_high = byte_bounds(whole)
            if not (whole_low <= low and high <= whole_high) or array.dtype != whole.dtype:
                return None
            key.append((name, low, array.shape, array.strides))
        return tuple(key)
